# TrainmemNccl.cmake — NCCL as an optional dependency: the communicator for CUDA tensors.
#
# With CUDA enabled and NCCL's header and library found (the CUDA toolkit's own copy, or
# Debian's libnccl-dev), this defines the INTERFACE target trainmem::nccl:
# trainmem::cuda plus libnccl and TRAINMEM_WITH_NCCL=1, for programs that include
# trainmem/distributed/nccl.cuh. Sets TRAINMEM_WITH_NCCL (ON/OFF).
include_guard(GLOBAL)

set(TRAINMEM_WITH_NCCL OFF)
if(TRAINMEM_WITH_CUDA)
  find_path(TRAINMEM_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(TRAINMEM_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  mark_as_advanced(TRAINMEM_NCCL_INCLUDE_DIR TRAINMEM_NCCL_LIBRARY)
  if(TRAINMEM_NCCL_INCLUDE_DIR AND TRAINMEM_NCCL_LIBRARY)
    set(TRAINMEM_WITH_NCCL ON)
    add_library(trainmem_nccl INTERFACE)
    add_library(trainmem::nccl ALIAS trainmem_nccl)
    target_include_directories(trainmem_nccl INTERFACE "${TRAINMEM_NCCL_INCLUDE_DIR}")
    target_link_libraries(trainmem_nccl INTERFACE trainmem::cuda "${TRAINMEM_NCCL_LIBRARY}")
    target_compile_definitions(trainmem_nccl INTERFACE TRAINMEM_WITH_NCCL=1)
  else()
    message(STATUS "trainmem: NCCL not found; the NCCL communicator and its test are not built")
  endif()
endif()
