// tests/core/test_memory_report.cpp — the memory tables as text, on known MemoryStats values.
//
// The reference is the expected table written out by hand from the bytes fed in.
#include <catch2/catch.hpp>
#include <string>

#include "trainmem/trainmem.hpp"

TEST_CASE("memory_table: live and peak bytes of the used categories, totals and device", "[core][memory_report]") {
  using namespace trainmem;
  MemoryStats stats;
  stats.on_allocate(MemCategory::Parameter, 2048);
  stats.on_allocate(MemCategory::Temporary, 3 * 1024 * 1024);
  stats.on_allocate(MemCategory::HostOffload, 512);
  stats.on_free(MemCategory::Temporary, 3 * 1024 * 1024);
  const std::string want =
      "bytes                                live                   peak\n"
      "parameter                         2.0 KiB                2.0 KiB\n"
      "temporary                             0 B               3.00 MiB\n"
      "host_offload                        512 B                  512 B\n"
      "total                             2.5 KiB               3.00 MiB\n"
      "device                            2.0 KiB               3.00 MiB\n";
  CHECK(memory_table(stats) == want);
}

TEST_CASE("memory_comparison: two runs' peaks by category with their ratio", "[core][memory_report]") {
  using namespace trainmem;
  PeakBytes chosen, plain;
  chosen.by_category[static_cast<std::size_t>(MemCategory::Parameter)] = 1024;
  plain.by_category[static_cast<std::size_t>(MemCategory::Parameter)] = 2048;
  chosen.by_category[static_cast<std::size_t>(MemCategory::MasterWeight)] = 2048;
  chosen.total = 3072;
  plain.total = 2048;
  const std::string want =
      "peak bytes                      bf16 full              fp32 none    ratio\n"
      "parameter                         1.0 KiB                2.0 KiB    0.50x\n"
      "master_weight                     2.0 KiB                    0 B      new\n"
      "total (at peak)                   3.0 KiB                2.0 KiB    1.50x\n";
  CHECK(memory_comparison(chosen, "bf16 full", plain, "fp32 none") == want);
}
