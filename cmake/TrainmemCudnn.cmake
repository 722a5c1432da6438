# TrainmemCudnn.cmake — cuDNN's header-only frontend as an optional dependency: fused attention.
#
# The frontend is headers only, and trainmem builds it with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING,
# so libcudnn is opened when the program runs: a build needs the frontend's headers and cuDNN's
# own (cudnn.h, cudnn_graph.h), never the library. scripts/setup unpacks both from PyPI's
# nvidia-cudnn-frontend and nvidia-cudnn-cu13 wheels into ~/.cache/trainmem/cudnn-headers/include;
# TRAINMEM_CUDNN_INCLUDE_DIR names another folder holding both.
#
# TRAINMEM_CUDNN: AUTO uses them when found, ON requires them, OFF never looks. When found,
# trainmem::cudnn (trainmem::cuda plus the include folder, TRAINMEM_HAS_CUDNN_FRONTEND=1 and
# libdl) is the target a program links for cuDNN attention; trainmem::cuda alone keeps the own
# kernels and compiles in a fraction of the time (the frontend adds about 50 s of host compiler
# work to each CUDA translation unit that includes the backend).
include_guard(GLOBAL)

set(TRAINMEM_WITH_CUDNN OFF)
set(TRAINMEM_CUDNN AUTO CACHE STRING "Use cuDNN's frontend for fused attention on the GPU (AUTO, ON, OFF)")
string(TOUPPER "${TRAINMEM_CUDNN}" _trainmem_cudnn_mode)
if(NOT _trainmem_cudnn_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TRAINMEM_CUDNN must be AUTO, ON or OFF, got '${TRAINMEM_CUDNN}'")
endif()

if(TRAINMEM_WITH_CUDA AND NOT _trainmem_cudnn_mode STREQUAL "OFF")
  find_path(TRAINMEM_CUDNN_INCLUDE_DIR NAMES cudnn_frontend.h
            HINTS "$ENV{TRAINMEM_CUDNN_INCLUDE_DIR}" "$ENV{HOME}/.cache/trainmem/cudnn-headers/include"
            DOC "A folder with cudnn_frontend.h and cudnn.h (scripts/setup fills ~/.cache/trainmem/cudnn-headers)")
  if(TRAINMEM_CUDNN_INCLUDE_DIR AND EXISTS "${TRAINMEM_CUDNN_INCLUDE_DIR}/cudnn.h")
    set(TRAINMEM_WITH_CUDNN ON)
    add_library(trainmem_cudnn INTERFACE)
    add_library(trainmem::cudnn ALIAS trainmem_cudnn)
    target_include_directories(trainmem_cudnn SYSTEM INTERFACE "${TRAINMEM_CUDNN_INCLUDE_DIR}")
    target_compile_definitions(trainmem_cudnn INTERFACE TRAINMEM_HAS_CUDNN_FRONTEND=1)
    target_link_libraries(trainmem_cudnn INTERFACE trainmem::cuda ${CMAKE_DL_LIBS})
    file(STRINGS "${TRAINMEM_CUDNN_INCLUDE_DIR}/cudnn_frontend_version.h" _trainmem_fe_version
         REGEX "define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION")
    string(REGEX REPLACE "[^0-9;]" "" _trainmem_fe_version "${_trainmem_fe_version}")
    string(REPLACE ";" "." _trainmem_fe_version "${_trainmem_fe_version}")
    message(STATUS "trainmem: cuDNN frontend ${_trainmem_fe_version} (${TRAINMEM_CUDNN_INCLUDE_DIR}); "
                   "libcudnn is opened at run time")
  elseif(_trainmem_cudnn_mode STREQUAL "ON")
    message(FATAL_ERROR "TRAINMEM_CUDNN=ON but cudnn_frontend.h and cudnn.h were not found together "
                        "(run scripts/setup, or set TRAINMEM_CUDNN_INCLUDE_DIR)")
  else()
    message(STATUS "trainmem: cuDNN frontend not found; GPU attention runs the own kernels")
  endif()
endif()
