// trainmem/backend/cpu/threads.hpp — how many CPU threads a step uses.
//
// Every parallel loop of the CPU backend is an OpenMP region and Eigen's GEMM asks
// OpenMP too, so one number decides both: set_num_threads sets OpenMP's count for the
// calling thread (OpenMP keeps it per thread, so a program that trains from several
// threads sets it in each) and Eigen's, which otherwise follows OpenMP's default
// (OMP_NUM_THREADS, else one per core). Without OpenMP the backend runs on one thread
// and asking for more is an error rather than a silent no-op.
#pragma once

#include <Eigen/Core>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "trainmem/error.hpp"

namespace trainmem {

/// \brief Threads the CPU backend's kernels and GEMMs use from now on (n >= 1).
inline void set_num_threads(int n) {
  detail::check(n >= 1, "set_num_threads: need at least one thread, got ", n);
#if defined(_OPENMP)
  omp_set_num_threads(n);
  Eigen::setNbThreads(n);
#else
  detail::check(n == 1, "set_num_threads: ", n, " threads asked for, but trainmem was compiled without OpenMP");
#endif
}

/// \brief Threads the CPU backend's kernels and GEMMs use now.
inline int num_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace trainmem
