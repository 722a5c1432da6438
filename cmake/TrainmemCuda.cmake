# TrainmemCuda.cmake — finds nvcc and defines trainmem::cuda when CUDA is enabled.
#
# TRAINMEM_CUDA: AUTO enables CUDA when check_language finds a compiler, ON requires
# it, OFF never looks. trainmem::cuda is a second INTERFACE target, so trainmem::trainmem
# and everything built only on it never see a CUDA include path or library.
# Sets TRAINMEM_WITH_CUDA (ON/OFF) for the rest of the build.
include_guard(GLOBAL)

set(TRAINMEM_WITH_CUDA OFF)
string(TOUPPER "${TRAINMEM_CUDA}" _trainmem_cuda_mode)
if(NOT _trainmem_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TRAINMEM_CUDA must be AUTO, ON or OFF, got '${TRAINMEM_CUDA}'")
endif()

if(NOT _trainmem_cuda_mode STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(TRAINMEM_WITH_CUDA ON)
  elseif(_trainmem_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "TRAINMEM_CUDA=ON but no CUDA compiler was found "
                        "(put nvcc on PATH or set CMAKE_CUDA_COMPILER)")
  else()
    message(STATUS "trainmem: no CUDA compiler found; building CPU only")
  endif()
endif()

if(TRAINMEM_WITH_CUDA)
  # Hopper (H100/H200) unless the user chose; must be set before enable_language.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  # CMake 3.25 knows no C++20 flag for nvcc (3.26 adds it for nvcc >= 12.0); teach it
  # the same one, here at directory scope so every subdirectory sees it.
  if(NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
     AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  # After enable_language: set before, it would also apply to CMake's compiler probes.
  if(NOT DEFINED CMAKE_CUDA_STANDARD)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  endif()
  find_package(CUDAToolkit REQUIRED)

  add_library(trainmem_cuda INTERFACE)
  add_library(trainmem::cuda ALIAS trainmem_cuda)
  set_target_properties(trainmem_cuda PROPERTIES EXPORT_NAME cuda)
  target_link_libraries(trainmem_cuda INTERFACE trainmem::trainmem CUDA::cudart CUDA::cublas CUDA::cublasLt)
  # EIGEN_NO_CUDA: Eigen is the CPU backend only; without it nvcc marks Eigen's
  # functions __host__ __device__ and warns on every defaulted member.
  target_compile_definitions(trainmem_cuda INTERFACE TRAINMEM_WITH_CUDA=1 EIGEN_NO_CUDA)
  target_compile_options(trainmem_cuda INTERFACE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>
    $<$<COMPILE_LANGUAGE:CUDA>:--extended-lambda>)
  # OpenMP::OpenMP_CXX passes -fopenmp to .cpp files only; the host side of a .cu file
  # runs the same parallel CPU loops, so hand the flag to nvcc's host compiler too.
  if(TRAINMEM_WITH_OPENMP AND OpenMP_CXX_FLAGS)
    target_compile_options(trainmem_cuda INTERFACE "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${OpenMP_CXX_FLAGS}>")
  endif()
  message(STATUS "trainmem: CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER}), "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES}")
endif()
