# TrainmemMpi.cmake — MPI as an optional dependency: the communicator for CPU tensors.
#
# With TRAINMEM_MPI ON (the default) and an MPI found (Debian: libopenmpi-dev), this
# defines the INTERFACE target trainmem::mpi: trainmem::trainmem plus MPI::MPI_CXX and
# TRAINMEM_WITH_MPI=1. Only programs that include trainmem/distributed/mpi.hpp link it; the
# library itself needs nothing beyond Eigen, and everything in trainmem/distributed/ except
# mpi.hpp works without MPI (a single-process communicator). Sets TRAINMEM_WITH_MPI
# (ON/OFF) and, when found, TRAINMEM_MPIEXEC (mpirun) for the tests.
include_guard(GLOBAL)

option(TRAINMEM_MPI "Build the MPI communicator's target and tests when MPI is found (Debian: libopenmpi-dev)" ON)
set(TRAINMEM_WITH_MPI OFF)
if(TRAINMEM_MPI)
  find_package(MPI COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(TRAINMEM_WITH_MPI ON)
    add_library(trainmem_mpi INTERFACE)
    add_library(trainmem::mpi ALIAS trainmem_mpi)
    target_link_libraries(trainmem_mpi INTERFACE trainmem::trainmem MPI::MPI_CXX)
    target_compile_definitions(trainmem_mpi INTERFACE TRAINMEM_WITH_MPI=1)
    set(TRAINMEM_MPIEXEC "${MPIEXEC_EXECUTABLE}")
  else()
    message(STATUS "trainmem: no MPI found; the MPI communicator and its tests are not built")
  endif()
endif()
