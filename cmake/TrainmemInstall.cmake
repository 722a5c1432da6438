# TrainmemInstall.cmake — install rules and the package config behind find_package(trainmem).
#
# Installs include/trainmem and two export sets: trainmemTargets (trainmem::trainmem)
# and, when CUDA was enabled, trainmemCudaTargets (trainmem::cuda). The config loads
# the CUDA set only where the CUDA toolkit is found, so a package built with CUDA still
# serves CPU-only consumers; `find_package(trainmem COMPONENTS cuda)` requires it.
include_guard(GLOBAL)
include(CMakePackageConfigHelpers)

set(TRAINMEM_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/trainmem"
    CACHE STRING "Where trainmem's package config is installed, relative to the prefix")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/trainmem" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/trainmem")
# The compiled mode's one source; consumers build it with their own flags (trainmem_add_compiled).
set(TRAINMEM_INSTALL_SRCDIR "${CMAKE_INSTALL_DATADIR}/trainmem/src")
install(FILES "${PROJECT_SOURCE_DIR}/src/cpu_instantiations.cpp" DESTINATION "${TRAINMEM_INSTALL_SRCDIR}")

install(TARGETS trainmem EXPORT trainmemTargets)
install(EXPORT trainmemTargets NAMESPACE trainmem:: DESTINATION "${TRAINMEM_INSTALL_CMAKEDIR}")
if(TRAINMEM_WITH_CUDA)
  install(TARGETS trainmem_cuda EXPORT trainmemCudaTargets)
  install(EXPORT trainmemCudaTargets NAMESPACE trainmem:: DESTINATION "${TRAINMEM_INSTALL_CMAKEDIR}")
endif()

configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/trainmemConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/trainmemConfig.cmake"
  INSTALL_DESTINATION "${TRAINMEM_INSTALL_CMAKEDIR}"
  PATH_VARS TRAINMEM_INSTALL_SRCDIR)
# Header-only: the package fits any architecture.
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/trainmemConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/trainmemConfig.cmake" "${PROJECT_BINARY_DIR}/trainmemConfigVersion.cmake"
              "${CMAKE_CURRENT_LIST_DIR}/TrainmemOneDNN.cmake" "${CMAKE_CURRENT_LIST_DIR}/TrainmemCompiled.cmake"
        DESTINATION "${TRAINMEM_INSTALL_CMAKEDIR}")
