// tests/state/test_state_file.cpp — the state file: CRC-32, round trip, atomic replace, and
// the error for each way a file can be wrong.
//
// References: zlib's crc32 (an independent implementation of the same checksum), and
// bytes written by hand into the file for each corruption.
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <trainmem/trainmem.hpp>
#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::testing::ErrorContains;

namespace {

std::filesystem::path scratch_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("trainmem_state_file_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<char> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const std::filesystem::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A dict with one entry of every element type, including an empty tensor and a scalar.
tmem::StateDict sample_dict() {
  tmem::StateDict d;
  const std::vector<double> values{1.5, -2.25, 3.0, 0.1, 1e-3, 65504.0};
  const std::vector<double> integers{7, -2, 3, 0, -2147483648.0, 2147483647.0};  // i32 takes whole numbers only
  for (tmem::DType dtype : {tmem::DType::F32, tmem::DType::F64, tmem::DType::F16, tmem::DType::BF16, tmem::DType::I32})
    d.set(std::string("tensor.") + std::string(tmem::name_of(dtype)),
          tmem::Tensor<B>::from_host(tmem::Shape{2, 3}, dtype == tmem::DType::I32 ? integers : values, dtype));
  d.set("empty", tmem::Tensor<B>::zeros(tmem::Shape{0, 4}, tmem::DType::F32));
  d.set_i64("count", -(std::int64_t{1} << 60));
  d.set_u64("seed", 0xFEDCBA9876543210ull);
  d.set_f64("lr", 0.1);
  return d;
}

}  // namespace

TEST_CASE("Crc32 equals zlib's crc32, fed whole or in pieces", "[state][file]") {
  std::vector<unsigned char> data(1000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>((i * 131 + 7) % 251);
  for (std::size_t n : {0, 1, 3, 17, 1000}) {
    tmem::Crc32 whole;
    whole.update(data.data(), n);
    CHECK(whole.value() == ::crc32(0L, data.data(), static_cast<uInt>(n)));
    tmem::Crc32 pieces;
    pieces.update(data.data(), n / 2);
    pieces.update(data.data() + n / 2, n - n / 2);
    CHECK(pieces.value() == whole.value());
  }
  tmem::Crc32 check;
  check.update("123456789", 9);
  CHECK(check.value() == 0xCBF43926u);  // the CRC-32 check value
}

TEST_CASE("a state file round-trips every element type bit for bit", "[state][file]") {
  const auto dir = scratch_dir();
  const tmem::StateDict d = sample_dict();
  tmem::save(dir / "a.tmstate", d);
  const tmem::StateDict back = tmem::load(dir / "a.tmstate");
  CHECK(back == d);
  CHECK(back.get_u64("seed") == 0xFEDCBA9876543210ull);
  CHECK(back.get_i64("count") == -(std::int64_t{1} << 60));
  CHECK(back.at("tensor.f16").shape == tmem::Shape{2, 3});
  CHECK(back.at("tensor.bf16").type == tmem::StateType::BF16);
  // The header names the format: magic and version 1, little-endian.
  const std::vector<char> bytes = read_file(dir / "a.tmstate");
  REQUIRE(bytes.size() > 40);
  CHECK(std::memcmp(bytes.data(), "TMSTATE\0", 8) == 0);
  CHECK(bytes[8] == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("save replaces the file by rename and leaves no temporary behind", "[state][file]") {
  const auto dir = scratch_dir();
  const auto path = dir / "b.tmstate";
  tmem::StateDict first;
  first.set_i64("x", 1);
  tmem::save(path, first);
  struct stat before {};
  REQUIRE(::stat(path.c_str(), &before) == 0);
  // A reader holding the old file keeps reading the old contents: a new inode replaced it.
  std::ifstream old_reader(path, std::ios::binary);
  tmem::StateDict second = sample_dict();
  tmem::save(path, second);
  struct stat after {};
  REQUIRE(::stat(path.c_str(), &after) == 0);
  CHECK(before.st_ino != after.st_ino);
  std::vector<char> old_bytes{std::istreambuf_iterator<char>(old_reader), std::istreambuf_iterator<char>()};
  CHECK(old_bytes.size() < read_file(path).size());
  CHECK(tmem::load(path) == second);
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.path().filename() == "b.tmstate" ? 1 : 100;
  CHECK(files == 1);  // no "b.tmstate.tmp.*" left
  // A save that cannot create its temporary file throws and leaves the old file as it was.
  CHECK_THROWS_MATCHES(tmem::save(dir / "missing_dir" / "c.tmstate", first), tmem::Error,
                       ErrorContains("cannot create"));
  CHECK(tmem::load(path) == second);
  // A directory at the destination is refused before anything is written (no temporary).
  std::filesystem::create_directories(dir / "d.tmstate" / "inside");
  CHECK_THROWS_MATCHES(tmem::save(dir / "d.tmstate", first), tmem::Error,
                       ErrorContains("is a directory, not a regular file"));
  CHECK(std::filesystem::is_directory(dir / "d.tmstate" / "inside"));
  files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  CHECK(files == 2);  // b.tmstate and the directory, no temporary
  std::filesystem::remove_all(dir);
}

TEST_CASE("load says what is wrong with a file", "[state][file]") {
  const auto dir = scratch_dir();
  const auto good = dir / "good.tmstate", bad = dir / "bad.tmstate";
  tmem::save(good, sample_dict());
  const std::vector<char> bytes = read_file(good);

  SECTION("not a state file") {
    write_file(bad, {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'});
    CHECK_THROWS_MATCHES(tmem::load(bad), tmem::Error, ErrorContains("is not a trainmem state file"));
  }
  SECTION("another version") {
    std::vector<char> b = bytes;
    b[8] = 2;
    write_file(bad, b);
    CHECK_THROWS_MATCHES(tmem::load(bad), tmem::Error, ErrorContains("format version 2; this build reads version 1"));
  }
  SECTION("truncated") {
    std::vector<char> b(bytes.begin(), bytes.end() - 5);
    write_file(bad, b);
    CHECK_THROWS_MATCHES(tmem::load(bad), tmem::Error, ErrorContains("is truncated"));
    write_file(bad, std::vector<char>(bytes.begin(), bytes.begin() + 20));
    CHECK_THROWS_MATCHES(tmem::load(bad), tmem::Error, ErrorContains("shorter than the 40-byte header"));
  }
  SECTION("a flipped bit in a tensor") {
    std::vector<char> b = bytes;
    b[b.size() - 30] ^= 0x10;
    write_file(bad, b);
    CHECK_THROWS_MATCHES(tmem::load(bad), tmem::Error, ErrorContains("is corrupt: checksum"));
  }
  SECTION("a flipped bit in the header's entry count") {
    std::vector<char> b = bytes;
    b[16] ^= 0x01;
    write_file(bad, b);
    CHECK_THROWS_MATCHES(tmem::load(bad), tmem::Error, ErrorContains("is corrupt: checksum"));
  }
  SECTION("missing") {
    CHECK_THROWS_MATCHES(tmem::load(dir / "nothing.tmstate"), tmem::Error, ErrorContains("cannot open"));
  }
  SECTION("a directory") {
    std::filesystem::create_directory(dir / "a_directory");
    CHECK_THROWS_MATCHES(tmem::load(dir / "a_directory"), tmem::Error, ErrorContains("is not a regular file"));
  }
  std::filesystem::remove_all(dir);
}
