# library_alone.cmake — CTest script: the library configures and installs without the
# project's own programs, as README's install section says, and a parent project's
# add_subdirectory(trainmem) builds none of them.
#
# Checked: the README still gives the three -DTRAINMEM_BUILD_*=OFF options; a configure
# of the source tree with them never looks for Catch2, CLI11, zlib or nlohmann-json (what
# only tests, examples and benchmarks need) and installs the headers and the CMake
# package; under add_subdirectory the three options default to OFF.
#
# Inputs (-D): SOURCE_DIR, WORK_DIR, GENERATOR, CXX_COMPILER.
foreach(var SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "library_alone.cmake: -D${var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
set(programs_off -DTRAINMEM_BUILD_TESTS=OFF -DTRAINMEM_BUILD_EXAMPLES=OFF -DTRAINMEM_BUILD_BENCHMARKS=OFF)

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "library_alone: ${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "library_alone: ${what}: ok")
endfunction()

# Only the programs look for these; a library-only configure must not.
function(expect_no_program_dependencies cache where)
  file(READ "${cache}" text)
  foreach(entry Catch2_DIR CLI11_DIR nlohmann_json_DIR ZLIB_INCLUDE_DIR)
    string(FIND "${text}" "${entry}:" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "library_alone: ${where} looked for ${entry} (a dependency of tests, examples or "
                          "benchmarks only), though they are off")
    endif()
  endforeach()
endfunction()

file(READ "${SOURCE_DIR}/README.md" readme)
foreach(option IN LISTS programs_off)
  string(FIND "${readme}" "${option}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "library_alone: README.md's install section no longer gives ${option}")
  endif()
endforeach()

# 1. README's commands: configure with the programs off, install.
step("configure the source tree with the programs off" "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/alone"
     -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" -DTRAINMEM_CUDA=OFF ${programs_off})
expect_no_program_dependencies("${WORK_DIR}/alone/CMakeCache.txt" "the library-only configure")
step("install" "${CMAKE_COMMAND}" --install "${WORK_DIR}/alone" --prefix "${WORK_DIR}/prefix")
foreach(file include/trainmem/trainmem.hpp lib/cmake/trainmem/trainmemConfig.cmake)
  if(NOT EXISTS "${WORK_DIR}/prefix/${file}")
    message(FATAL_ERROR "library_alone: the install has no ${file}")
  endif()
endforeach()

# 2. A parent project that adds trainmem as a subdirectory gets none of its programs.
file(WRITE "${WORK_DIR}/parent/CMakeLists.txt"
     "cmake_minimum_required(VERSION 3.25)\nproject(parent LANGUAGES CXX)\n"
     "add_subdirectory(\"${SOURCE_DIR}\" trainmem)\n"
     "foreach(option TRAINMEM_BUILD_TESTS TRAINMEM_BUILD_EXAMPLES TRAINMEM_BUILD_BENCHMARKS)\n"
     "  if(\${option})\n    message(FATAL_ERROR \"\${option} is ON under add_subdirectory\")\n  endif()\n"
     "endforeach()\n")
step("configure a parent project with add_subdirectory(trainmem)" "${CMAKE_COMMAND}" -S "${WORK_DIR}/parent"
     -B "${WORK_DIR}/parent-build" -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" -DTRAINMEM_CUDA=OFF)
expect_no_program_dependencies("${WORK_DIR}/parent-build/CMakeCache.txt" "the parent project's configure")
