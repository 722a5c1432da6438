# TrainmemHeaderCheck.cmake — every public header compiles on its own.
#
# One generated translation unit per header, each including its header twice: the
# first include proves the header brings everything it uses, the second proves its
# include guard. The TUs form the object library trainmem_header_check, built at -O0
# (only the front end's verdict matters), and the CTest case header_self_contained
# rebuilds it. With CUDA, the .cuh headers and trainmem/cuda.hpp get the same check
# as .cu TUs through nvcc's front ends (trainmem_header_check_cuda, which the CTest case
# builds too: a dependency between two object libraries orders them and builds neither), and
# trainmem/distributed/mpi.hpp only where MPI was found (distributed/nccl.cuh where NCCL was).
include_guard(GLOBAL)

# Writes one TU per header in `headers` (absolute paths under include/) into `out_dir`
# with suffix `ext`; returns the list of TUs in `out_var`. Unchanged TUs keep their
# timestamps, so a reconfigure rebuilds nothing.
function(_trainmem_header_tus out_var out_dir ext)
  set(tus)
  foreach(header IN LISTS ARGN)
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}/include" "${header}")
    string(REGEX REPLACE "[/.]" "_" stem "${rel}")
    set(tu "${out_dir}/${stem}${ext}")
    file(CONFIGURE OUTPUT "${tu}" CONTENT
         "// Generated: ${rel} compiles on its own and its include guard holds.\n#include <${rel}>\n#include <${rel}>\n"
         @ONLY)
    list(APPEND tus "${tu}")
  endforeach()
  set(${out_var} "${tus}" PARENT_SCOPE)
endfunction()

function(trainmem_add_header_check)
  set(include_root "${PROJECT_SOURCE_DIR}/include/trainmem")
  set(out_dir "${PROJECT_BINARY_DIR}/header_check")
  file(GLOB_RECURSE hpp_headers CONFIGURE_DEPENDS "${include_root}/*.hpp")
  # cuda.hpp reaches the .cuh headers, so only nvcc compiles it.
  list(REMOVE_ITEM hpp_headers "${include_root}/cuda.hpp")
  # distributed/mpi.hpp includes <mpi.h>: checked only where MPI was found.
  if(NOT TARGET trainmem::mpi)
    list(REMOVE_ITEM hpp_headers "${include_root}/distributed/mpi.hpp")
  endif()
  list(SORT hpp_headers)
  _trainmem_header_tus(cxx_tus "${out_dir}/cxx" ".cpp" ${hpp_headers})

  add_library(trainmem_header_check OBJECT ${cxx_tus})
  set(check_targets trainmem_header_check)
  target_link_libraries(trainmem_header_check PRIVATE trainmem::trainmem)
  if(TARGET trainmem::mpi)
    target_link_libraries(trainmem_header_check PRIVATE trainmem::mpi)
  endif()
  target_compile_options(trainmem_header_check PRIVATE -O0 -g0 -Wall -Wextra)

  if(TRAINMEM_WITH_CUDA)
    file(GLOB_RECURSE cuda_headers CONFIGURE_DEPENDS "${include_root}/backend/cuda/*.cuh")
    if(EXISTS "${include_root}/cuda.hpp")
      list(APPEND cuda_headers "${include_root}/cuda.hpp")
    endif()
    if(TARGET trainmem::nccl)
      list(APPEND cuda_headers "${include_root}/distributed/nccl.cuh")
    endif()
    if(cuda_headers)
      list(SORT cuda_headers)
      _trainmem_header_tus(cuda_tus "${out_dir}/cuda" ".cu" ${cuda_headers})
      add_library(trainmem_header_check_cuda OBJECT ${cuda_tus})
      target_link_libraries(trainmem_header_check_cuda PRIVATE trainmem::cuda)
      if(TARGET trainmem::nccl)
        target_link_libraries(trainmem_header_check_cuda PRIVATE trainmem::nccl)
      endif()
      # Only nvcc's front ends run (-cuda: cudafe++ on the host side, cicc on the device side,
      # to PTX for one virtual architecture), where a missing include fails; the host compiler
      # and ptxas would compile again what test_cuda compiles in full, for more than half the
      # time (trainmem/cuda.hpp: 67 s instead of 145). Each "object" is nvcc's .cpp.ii output.
      list(GET CMAKE_CUDA_ARCHITECTURES 0 check_arch)
      string(REGEX REPLACE "-.*$" "" check_arch "${check_arch}")
      if(NOT check_arch MATCHES "^[0-9]+$")  # native, all, all-major
        set(check_arch 90)
      endif()
      set_target_properties(trainmem_header_check_cuda PROPERTIES CUDA_ARCHITECTURES "${check_arch}-virtual")
      target_compile_options(trainmem_header_check_cuda PRIVATE -cuda)
      list(APPEND check_targets trainmem_header_check_cuda)
    endif()
  endif()

  list(LENGTH hpp_headers n_hpp)
  list(LENGTH cuda_headers n_cuda)
  message(STATUS "trainmem: header self-containment check over ${n_hpp} .hpp and ${n_cuda} CUDA headers")

  # Builds the check target (under Ninja, every failing header, not just the first);
  # the lock keeps two builds out of the build tree at once.
  set(keep_going)
  if(CMAKE_GENERATOR MATCHES "Ninja")
    set(keep_going -- -k 0)
  endif()
  add_test(NAME header_self_contained
           COMMAND "${CMAKE_COMMAND}" --build "${PROJECT_BINARY_DIR}" --target ${check_targets}
                   --config $<CONFIG> ${keep_going})
  set_tests_properties(header_self_contained PROPERTIES RESOURCE_LOCK trainmem_build_tree)
endfunction()
