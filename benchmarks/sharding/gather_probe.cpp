// gather_probe — why ZeRO-3's prefetch hides little of its gathers on a CPU: plain MPI, no trainmem.
//
//   mpicxx -O2 -std=c++20 -pthread benchmarks/sharding/gather_probe.cpp -o gather_probe
//   mpirun -np 2 ./gather_probe [bytes per gather] [compute ms] [reps]
//
// Per rank, medians over `reps`: a blocking MPI_Allgather of the gathered bytes (the size of
// one ZeRO-3 unit's gather), a memcpy of as many bytes (the copy the gather cannot avoid),
// the compute alone (a busy loop of `compute ms`), and the compute with an MPI_Iallgather
// started before it three ways: waited for only after the compute (no MPI call in between),
// tested every 100 µs of the compute (what FullyShardedModel's op-entry tests approximate),
// and issued as a blocking MPI_Allgather by a second thread (MPI_THREAD_MULTIPLE) while the
// main thread computes. hidden = (compute + gather - overlapped) / gather.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

volatile double sink = 0;
// A fixed amount of work (`blocks` x 2,000 dependent multiply-adds): it takes longer when
// something else runs on its core.
void compute(long blocks, bool test, MPI_Request* request) {
  auto last = Clock::now();
  double x = 1.0;
  for (long b = 0; b < blocks; ++b) {
    for (int i = 0; i < 2000; ++i) x = x * 1.0000001 + 1e-9;
    if (test && std::chrono::duration<double, std::micro>(Clock::now() - last).count() >= 100) {
      int done = 0;
      MPI_Test(request, &done, MPI_STATUS_IGNORE);
      last = Clock::now();
    }
  }
  sink = x;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const long bytes = argc > 1 ? std::atol(argv[1]) : 3 << 20;
  const double work = argc > 2 ? std::atof(argv[2]) : 10.0;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 21;
  const int part = static_cast<int>(bytes / size);
  long blocks = 1000;  // calibrated so that the compute alone takes about `work` ms
  for (;;) {
    const auto t = Clock::now();
    compute(blocks, false, nullptr);
    const double took = ms_since(t);
    if (took > work / 4) {
      blocks = static_cast<long>(static_cast<double>(blocks) * work / took);
      break;
    }
    blocks *= 4;
  }
  MPI_Allreduce(MPI_IN_PLACE, &blocks, 1, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
  std::vector<char> out(static_cast<std::size_t>(part) * size, 1), copy(out.size(), 2);
  std::vector<char> in(static_cast<std::size_t>(part), static_cast<char>(rank));
  std::vector<double> gather, memcpy_ms, alone, waited, tested, threaded;
  for (int r = 0; r < reps + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t = Clock::now();
    MPI_Allgather(in.data(), part, MPI_BYTE, out.data(), part, MPI_BYTE, MPI_COMM_WORLD);
    const double g = ms_since(t);
    t = Clock::now();
    std::memcpy(copy.data(), out.data(), out.size());
    const double c = ms_since(t);
    MPI_Barrier(MPI_COMM_WORLD);
    t = Clock::now();
    compute(blocks, false, nullptr);
    const double a = ms_since(t);
    MPI_Request request;
    MPI_Barrier(MPI_COMM_WORLD);
    t = Clock::now();
    MPI_Iallgather(in.data(), part, MPI_BYTE, out.data(), part, MPI_BYTE, MPI_COMM_WORLD, &request);
    compute(blocks, false, &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
    const double w = ms_since(t);
    MPI_Barrier(MPI_COMM_WORLD);
    t = Clock::now();
    MPI_Iallgather(in.data(), part, MPI_BYTE, out.data(), part, MPI_BYTE, MPI_COMM_WORLD, &request);
    compute(blocks, true, &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
    const double s = ms_since(t);
    double th = 0;
    if (provided == MPI_THREAD_MULTIPLE) {
      MPI_Barrier(MPI_COMM_WORLD);
      t = Clock::now();
      std::thread progress(
          [&] { MPI_Allgather(in.data(), part, MPI_BYTE, out.data(), part, MPI_BYTE, MPI_COMM_WORLD); });
      compute(blocks, false, nullptr);
      progress.join();
      th = ms_since(t);
    }
    if (r == 0) continue;  // warm-up
    gather.push_back(g), memcpy_ms.push_back(c), alone.push_back(a), waited.push_back(w), tested.push_back(s),
        threaded.push_back(th);
  }
  const double g = median(gather), a = median(alone);
  const auto hidden = [&](double overlapped) { return 100.0 * (a + g - overlapped) / g; };
  for (int r = 0; r < size; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != rank) continue;
    if (rank == 0)
      std::printf("%d ranks, %ld bytes a gather, compute %.1f ms, thread level %s, median of %d\n", size, bytes, work,
                  provided == MPI_THREAD_MULTIPLE ? "multiple" : "below multiple", reps);
    std::printf(
        "rank %d: allgather %.3f ms, memcpy %.3f ms, compute %.3f ms | overlapped: wait after %.3f ms (hidden %.0f%%), "
        "MPI_Test/100us %.3f ms (hidden %.0f%%), thread %.3f ms (hidden %.0f%%)\n",
        rank, g, median(memcpy_ms), a, median(waited), hidden(median(waited)), median(tested), hidden(median(tested)),
        median(threaded), hidden(median(threaded)));
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
