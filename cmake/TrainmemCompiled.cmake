# TrainmemCompiled.cmake — the compiled mode: a static library that holds the CPU backend's
# common instantiations, so the programs that link it do not compile them again.
#
#   trainmem_add_compiled(<name> [<flags target>...])
#
# makes <name>, a static library of src/cpu_instantiations.cpp that carries
# TRAINMEM_COMPILED=1 to whoever links it (trainmem.hpp then declares those instantiations
# extern: trainmem/compiled/cpu_instantiations.hpp). The flags targets, linked PUBLIC, give
# the library and its users the same flags (-march, sanitizers), which a precompiled header
# shared with them requires. The code is the same as header-only; only where it is
# compiled changes.
include_guard(GLOBAL)

# The source tree's copy, unless the installed package config named its own.
get_property(_trainmem_compiled_source GLOBAL PROPERTY TRAINMEM_COMPILED_SOURCE)
if(NOT _trainmem_compiled_source)
  set_property(GLOBAL PROPERTY TRAINMEM_COMPILED_SOURCE "${CMAKE_CURRENT_LIST_DIR}/../src/cpu_instantiations.cpp")
endif()

function(trainmem_add_compiled name)
  get_property(source GLOBAL PROPERTY TRAINMEM_COMPILED_SOURCE)
  add_library(${name} STATIC "${source}")
  target_link_libraries(${name} PUBLIC trainmem::trainmem ${ARGN})
  target_compile_definitions(${name} PUBLIC TRAINMEM_COMPILED=1)
endfunction()
