# TrainmemOneDNN.cmake — oneDNN as an optional dependency of the CPU backend.
#
# trainmem_find_onednn() defines the imported target trainmem::onednn when oneDNN's
# header and library are found (Debian: libdnnl-dev). It looks for the two files itself
# rather than through dnnl-config.cmake because Debian's config requires OpenCL
# (its GPU runtime), which a CPU build neither needs nor links. trainmemConfig.cmake
# runs the same lookup for consumers of the installed package.
#
# Included from the top-level CMakeLists.txt (with TRAINMEM_ONEDNN ON, the default),
# trainmem::trainmem links trainmem::onednn and defines TRAINMEM_WITH_ONEDNN=1; the library
# stays header-only, and backend/cpu/onednn_gemm.hpp compiles to nothing without it,
# so everything works as before. Which CPU GEMM path runs is decided at run time
# (backend/cpu/gemm_dispatch.hpp).
include_guard(GLOBAL)

function(trainmem_find_onednn)
  if(TARGET trainmem::onednn)
    return()
  endif()
  find_path(TRAINMEM_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  find_library(TRAINMEM_ONEDNN_LIBRARY NAMES dnnl)
  mark_as_advanced(TRAINMEM_ONEDNN_INCLUDE_DIR TRAINMEM_ONEDNN_LIBRARY)
  if(TRAINMEM_ONEDNN_INCLUDE_DIR AND TRAINMEM_ONEDNN_LIBRARY)
    add_library(trainmem::onednn UNKNOWN IMPORTED GLOBAL)
    set_target_properties(trainmem::onednn PROPERTIES
      IMPORTED_LOCATION "${TRAINMEM_ONEDNN_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${TRAINMEM_ONEDNN_INCLUDE_DIR}")
  endif()
endfunction()

if(PROJECT_NAME STREQUAL "trainmem" AND TARGET trainmem)
  option(TRAINMEM_ONEDNN "Use oneDNN for CPU GEMMs when it is found (Debian: libdnnl-dev)" ON)
  set(TRAINMEM_WITH_ONEDNN OFF)
  if(TRAINMEM_ONEDNN)
    trainmem_find_onednn()
    if(TARGET trainmem::onednn)
      set(TRAINMEM_WITH_ONEDNN ON)
      target_link_libraries(trainmem INTERFACE trainmem::onednn)
      target_compile_definitions(trainmem INTERFACE TRAINMEM_WITH_ONEDNN=1)
    endif()
  endif()
endif()
