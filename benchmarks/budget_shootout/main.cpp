// budget_shootout — trainmem's side of the fixed-budget shoot-out on the CPU (shootout.hpp; main.cu
// is the same program on the CUDA backend).
//
//   budget_shootout --text FILE --json trainmem.json [--budgets-mib 128,256,512] [--steps 20]
//   budget_shootout --export DIR --export-only
#include "budget_shootout/shootout.hpp"

int main(int argc, char** argv) {
  return shootout::main<trainmem::cpu::Backend>(argc, argv, trainmem::num_threads(), {});
}
