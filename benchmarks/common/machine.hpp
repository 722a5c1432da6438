// benchmarks/common/machine.hpp — the CPU a figure was measured on, as a benchmark prints it.
//
// Figures from different CPUs are not comparable, so every benchmark names the CPU model
// and the instruction-set extensions that choose its kernels (from /proc/cpuinfo on
// Linux; "unknown CPU" elsewhere).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace benchmarks {

/// "model name (family F model M; the flags among avx2 ... amx_bf16 that it has)".
inline std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", family, number, flags;
  auto value = [](const std::string& l) { return l.substr(l.find(':') + 2); };
  while (std::getline(in, line) && flags.empty()) {
    if (line.rfind("model name", 0) == 0) model = value(line);
    else if (line.rfind("cpu family", 0) == 0) family = value(line);
    else if (line.rfind("model\t", 0) == 0) number = value(line);
    else if (line.rfind("flags", 0) == 0) flags = " " + value(line) + " ";
  }
  std::string isa;
  for (const char* f : {"avx2", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16"})
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) isa += (isa.empty() ? "" : " ") + std::string(f);
  std::ostringstream out;
  out << model << " (family " << (family.empty() ? "?" : family) << " model " << (number.empty() ? "?" : number) << "; "
      << (isa.empty() ? "no AVX2" : isa) << (flags.find(" amx_") == std::string::npos ? ", no AMX" : "") << ")";
  return out.str();
}

}  // namespace benchmarks
