# run_consumer.cmake — CTest script: install the build tree into a fresh prefix, then
# configure, build and run tests/package/consumer against that prefix only.
#
# Inputs (-D): TRAINMEM_BUILD_DIR, CONSUMER_SOURCE_DIR, WORK_DIR, GENERATOR,
# CXX_COMPILER, CONFIG.
foreach(var TRAINMEM_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

string(TOUPPER "${CONFIG}" config_upper)
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package_consumer: ${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "package_consumer: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("install into ${prefix}"
     "${CMAKE_COMMAND}" --install "${TRAINMEM_BUILD_DIR}" --prefix "${prefix}" --config "${CONFIG}")
# The consumer proves that the package is found, links and runs, not how fast: it builds
# unoptimised (-O0, no debug information), which cuts its compiled-mode library from about
# 190 s to a fraction of that.
step("configure the consumer"
     "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${build}" -G "${GENERATOR}"
     "-DCMAKE_BUILD_TYPE=${CONFIG}" "-DCMAKE_CXX_FLAGS_${config_upper}=-O0" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
     "-DCMAKE_PREFIX_PATH=${prefix}" "-DTRAINMEM_EXPECTED_PREFIX=${prefix}"
     # Only the fresh prefix may provide trainmem: no user or system package registry.
     -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
step("build the consumer" "${CMAKE_COMMAND}" --build "${build}" --config "${CONFIG}" --parallel 2)

foreach(program trainmem_consumer trainmem_consumer_compiled)
  find_program(consumer_${program} NAMES ${program} PATHS "${build}" "${build}/${CONFIG}" NO_DEFAULT_PATH REQUIRED)
  step("run ${program}" "${consumer_${program}}")
  message(STATUS "${step_output}")
endforeach()
