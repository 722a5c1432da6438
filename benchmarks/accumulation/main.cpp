// accumulation — why 16-bit GEMMs accumulate in FP32.
//
// Dot products of length K over values stored in bf16/f16, summed three ways: in the
// 16-bit type (each partial sum rounded to 16 bits), in f32 (what trainmem's CPU GEMM and
// cuBLASLt with CUBLAS_COMPUTE_32F do), and in f64 as the reference. Prints the median
// relative error of each over 200 random dot products per K.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/provenance.hpp"
#include "trainmem/core/bfloat16.hpp"
#include "trainmem/core/half.hpp"

template <class T>
void run(const char* name) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);  // positive: sums grow, as activations often do
  for (int k : {64, 256, 1024, 4096, 16384}) {
    std::vector<double> err16, err32;
    for (int trial = 0; trial < 200; ++trial) {
      T acc16(0.0f);
      float acc32 = 0.0f;
      double ref = 0.0;
      for (int i = 0; i < k; ++i) {
        const float a = static_cast<float>(T(uniform(rng))), b = static_cast<float>(T(uniform(rng)));
        acc16 = T(static_cast<float>(acc16) + a * b);
        acc32 += a * b;
        ref += static_cast<double>(a) * b;
      }
      err16.push_back(std::fabs(static_cast<float>(acc16) - ref) / ref);
      err32.push_back(std::fabs(acc32 - ref) / ref);
    }
    std::sort(err16.begin(), err16.end());
    std::sort(err32.begin(), err32.end());
    std::printf("%-5s K=%6d  median rel error: %s accumulation %.2e   f32 accumulation %.2e\n", name, k, name,
                err16[100], err32[100]);
  }
}

int main(int argc, char** argv) {
  std::printf("%s", benchmarks::provenance(argc, argv, 1).text().c_str());
  run<trainmem::BFloat16>("bf16");
  run<trainmem::Half>("f16");
}
