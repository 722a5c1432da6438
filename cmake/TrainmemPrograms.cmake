# TrainmemPrograms.cmake — flags for trainmem's own tests, examples and benchmarks.
#
# trainmem_dev carries what our programs get and users of the library do not:
# -march=native (TRAINMEM_NATIVE), warnings, and sanitizers (TRAINMEM_SANITIZE). It is
# never installed or exported; trainmem::trainmem itself stays free of such flags.
#
# trainmem::compiled (cmake/TrainmemCompiled.cmake) is the compiled mode built with those
# flags; our programs link it, so the tape, ops and kernels are compiled once per tree,
# not once per program. The README example stays header-only, as a user first meets it.
#
#   trainmem_add_program(<name> [HEADER_ONLY] <source>...)
#       add_executable + link trainmem_dev and (unless HEADER_ONLY) trainmem::compiled
include_guard(GLOBAL)
include(TrainmemCompiled)

add_library(trainmem_dev INTERFACE)
target_link_libraries(trainmem_dev INTERFACE trainmem::trainmem)
target_compile_options(trainmem_dev INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  # GCC 12 reports its own AVX-512 intrinsics (`__m512 __Y = __Y;` in
  # _mm512_undefined_ps), inlined through Eigen's ptranspose and the F16/BF16
  # converters, as (maybe-)uninitialized under -march=native: GCC bug 105593 (GCC 12).
  target_compile_options(trainmem_dev INTERFACE
                         $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized -Wno-uninitialized>)
endif()

if(TRAINMEM_NATIVE)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native TRAINMEM_HAS_MARCH_NATIVE)
  if(TRAINMEM_HAS_MARCH_NATIVE)
    # Host C++ only: nvcc's front end rejects some of GCC's newer intrinsic headers.
    target_compile_options(trainmem_dev INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
endif()

if(TRAINMEM_SANITIZE)
  set(_trainmem_sanitize_flags -fsanitize=${TRAINMEM_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_compile_options(trainmem_dev INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_trainmem_sanitize_flags}>)
  target_link_options(trainmem_dev INTERFACE $<$<LINK_LANGUAGE:CXX>:${_trainmem_sanitize_flags}>)
endif()

set(TRAINMEM_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist" CACHE PATH
    "Fashion-MNIST IDX files (Debian package dataset-fashion-mnist)")

trainmem_add_compiled(trainmem_compiled trainmem_dev)
add_library(trainmem::compiled ALIAS trainmem_compiled)

function(trainmem_add_program name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "HEADER_ONLY" "" "")
  add_executable(${name} ${arg_UNPARSED_ARGUMENTS})
  if(arg_HEADER_ONLY)
    target_link_libraries(${name} PRIVATE trainmem_dev)
  else()
    target_link_libraries(${name} PRIVATE trainmem::compiled)
  endif()
endfunction()
