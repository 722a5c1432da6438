// src/cpu_instantiations.cpp — the one translation unit of trainmem::compiled: it compiles
// every instantiation that trainmem/compiled/cpu_instantiations.hpp declares extern.
#include "trainmem/trainmem.hpp"  // built with TRAINMEM_COMPILED=1: the extern declarations

#define TRAINMEM_INSTANTIATE template
#include "trainmem/compiled/cpu_instantiations.hpp"  // the same list again, now the definitions
