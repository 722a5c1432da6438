// tests/data/test_idx_fuzz.cpp — the IDX reader against damaged and hostile files.
//
// A fuzz loop mutates small valid IDX files (plain and gzip): flipped bytes, cuts,
// junk appended or inserted, header extents replaced by large values. Every input must
// either read back or throw trainmem::Error — no other exception, no crash (CI runs
// this under ASan and UBSan too). This executable replaces operator new to record the
// largest single allocation, so a header that declares 2 GiB over a few bytes of data
// is shown to cost no more than the bytes that are there.
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "common/idx_reader.hpp"
#include "test_data.hpp"

namespace {
std::atomic<std::size_t> g_largest_allocation{0};
}  // namespace

// The replacements pair malloc with free by design; GCC sees the library's inlined calls to
// operator new next to our free and warns of a mismatch that is not there.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t bytes) {
  std::size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (bytes > seen && !g_largest_allocation.compare_exchange_weak(seen, bytes, std::memory_order_relaxed)) {
  }
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
// Every allocating form goes through the counting one, so every pointer the replaced
// deletes free came from malloc (Catch allocates with the nothrow form).
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(bytes);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("trainmem_idx_fuzz_" + std::to_string(::getpid()) + "_" + name);
}

std::vector<std::uint8_t> idx(const std::vector<std::uint32_t>& dims, std::size_t data_bytes, std::uint64_t seed) {
  std::vector<std::uint8_t> out = {0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(d >> shift));
  trainmem::testing::SplitMix64 rng(seed);
  for (std::size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<std::uint8_t>(rng.next() % 10));
  return out;
}

std::vector<std::uint8_t> gzip(const std::vector<std::uint8_t>& bytes) {
  const fs::path path = temp_file("gzip.gz");
  gzFile f = gzopen(path.string().c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
  std::ifstream in(path, std::ios::binary);
  std::vector<std::uint8_t> out{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  fs::remove(path);
  return out;
}

void write(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// One random damage of `bytes`.
std::vector<std::uint8_t> mutate(std::vector<std::uint8_t> bytes, trainmem::testing::SplitMix64& rng) {
  const auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng.next() % n); };
  switch (rng.next() % 6) {
    case 0:  // flip 1-4 bytes anywhere
      for (std::size_t k = 0, n = 1 + pick(4); k < n && !bytes.empty(); ++k)
        bytes[pick(bytes.size())] ^= static_cast<std::uint8_t>(1 + pick(255));
      break;
    case 1:  // cut
      bytes.resize(pick(bytes.size()));
      break;
    case 2:  // junk appended
      for (std::size_t k = 0, n = 1 + pick(64); k < n; ++k) bytes.push_back(static_cast<std::uint8_t>(rng.next()));
      break;
    case 3:  // junk inserted
      bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(pick(bytes.size() + 1)),
                   static_cast<std::uint8_t>(rng.next()));
      break;
    case 4:  // a header byte (magic or extents) replaced: often a huge declared size
      if (bytes.size() > 4)
        bytes[pick(std::min<std::size_t>(bytes.size(), 16))] = static_cast<std::uint8_t>(rng.next());
      break;
    default:  // a run of bytes zeroed
      if (!bytes.empty()) {
        const std::size_t at = pick(bytes.size()), n = std::min(bytes.size() - at, 1 + pick(32));
        std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(at), n, std::uint8_t{0});
      }
  }
  return bytes;
}

}  // namespace

TEST_CASE("IDX fuzz: every mutated file reads or throws trainmem::Error", "[data][bad-input][fuzz]") {
  constexpr int kIterations = 4000;
  struct Base {
    std::vector<std::uint8_t> bytes;
    std::size_t rank;
  };
  const auto labels = idx({50}, 50, 1), images = idx({6, 5, 4}, 120, 2);
  const std::vector<Base> bases = {{labels, 1}, {images, 3}, {gzip(labels), 1}, {gzip(images), 3}};
  const fs::path path = temp_file("case.gz");
  trainmem::testing::SplitMix64 rng(2024);
  int read_ok = 0, typed_errors = 0, other = 0;
  g_largest_allocation = 0;
  for (int i = 0; i < kIterations; ++i) {
    const Base& base = bases[static_cast<std::size_t>(i) % bases.size()];
    std::vector<std::uint8_t> bytes = mutate(base.bytes, rng);
    if (rng.next() % 4 == 0) bytes = mutate(std::move(bytes), rng);
    write(path, bytes);
    try {
      (void)examples::read_idx(path, base.rank);
      ++read_ok;
    } catch (const trainmem::Error&) {
      ++typed_errors;
    } catch (const std::exception& e) {
      ++other;
      FAIL_CHECK("iteration " << i << ": " << e.what());
    }
  }
  fs::remove(path);
  CHECK(other == 0);
  CHECK(read_ok + typed_errors == kIterations);
  CHECK(g_largest_allocation.load() < (std::size_t{8} << 20));  // no declared size was allocated up front
  WARN("IDX fuzz: " << kIterations << " mutated files, " << read_ok << " read, " << typed_errors
                    << " typed trainmem::Error, " << other << " other exceptions, 0 crashes; largest allocation "
                    << g_largest_allocation.load() << " bytes");
}

TEST_CASE("IDX: a header declaring 2 GiB over 16 bytes of data allocates no 2 GiB", "[data][bad-input]") {
  const fs::path path = temp_file("huge.gz");
  for (bool compressed : {false, true}) {
    CAPTURE(compressed);
    const auto bytes = idx({2000000, 32, 32}, 16, 3);  // 2.05e9 elements declared
    write(path, compressed ? gzip(bytes) : bytes);
    g_largest_allocation = 0;
    CHECK_THROWS_WITH(examples::read_idx(path, 3),
                      Contains("truncated while reading the data") && Contains("expected 2048000000 bytes, got 16"));
    CHECK(g_largest_allocation.load() < (std::size_t{8} << 20));
  }
  fs::remove(path);
}

TEST_CASE("IDX: junk after the gzip member is an error", "[data][bad-input]") {
  const fs::path path = temp_file("junk.gz");
  auto bytes = gzip(idx({10}, 10, 4));
  for (char c : std::string("JUNK AFTER THE MEMBER")) bytes.push_back(static_cast<std::uint8_t>(c));
  write(path, bytes);
  CHECK_THROWS_WITH(examples::read_idx(path, 1), Contains(path.string()) && Contains("after its gzip member"));
  fs::remove(path);
}

TEST_CASE("IDX: corrupt deflate data is reported as corrupt gzip data, not as a bad magic number",
          "[data][bad-input]") {
  const fs::path path = temp_file("deflate.gz");
  auto bytes = gzip(idx({10}, 10, 5));
  bytes[2] = 7;  // compression method 7: not deflate
  write(path, bytes);
  CHECK_THROWS_WITH(examples::read_idx(path, 1), Contains(path.string()) && Contains("corrupt gzip data"));
  auto stored = gzip(idx({10}, 10, 5));
  stored[10] = 0xFF;  // the first deflate block header: block type 3 is invalid
  write(path, stored);
  CHECK_THROWS_WITH(examples::read_idx(path, 1), Contains("corrupt gzip data"));
  fs::remove(path);
}
