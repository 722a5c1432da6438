// tests/data/test_idx_reader.cpp — the examples' IDX reader against Fashion-MNIST's
// published facts, and against small damaged files written here.
//
// The real files are checked against constants published with the data set (60000
// training and 10000 test images of 28x28, exactly 6000 and 1000 per class, the first
// labels shown in TensorFlow's Fashion-MNIST tutorial), not against this reader's own
// earlier output. Each damaged file must throw trainmem::Error naming the file.
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/idx_reader.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

/// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("trainmem_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<std::uint8_t> idx_bytes(unsigned char type, const std::vector<std::uint32_t>& dims,
                                    const std::vector<std::uint8_t>& values) {
  std::vector<std::uint8_t> out = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(d >> shift));
  out.insert(out.end(), values.begin(), values.end());
  return out;
}

void write_gzip(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(path.string().c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::vector<char> read_raw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_raw(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// 100 "images" of 4x4 with varied (poorly compressible) bytes.
std::vector<std::uint8_t> small_images() {
  std::vector<std::uint8_t> values(100 * 16);
  std::uint32_t x = 12345;
  for (auto& v : values) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<std::uint8_t>(x >> 24);
  }
  return idx_bytes(0x08, {100, 4, 4}, values);
}

}  // namespace

TEST_CASE("Fashion-MNIST files load with the published counts, shapes and labels", "[data]") {
  const examples::FashionMnist data = examples::load_fashion_mnist();
  for (const auto* set : {&data.train, &data.test}) {
    CHECK(set->rows == 28);
    CHECK(set->cols == 28);
    CHECK(set->pixels.size() == static_cast<std::size_t>(set->count) * 28 * 28);
    CHECK(set->labels.size() == static_cast<std::size_t>(set->count));
  }
  CHECK(data.train.count == 60000);
  CHECK(data.test.count == 10000);

  // Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
  std::array<int, 10> train_per_class{}, test_per_class{};
  for (auto label : data.train.labels) ++train_per_class.at(label);
  for (auto label : data.test.labels) ++test_per_class.at(label);
  for (int c = 0; c < 10; ++c) {
    CHECK(train_per_class[c] == 6000);
    CHECK(test_per_class[c] == 1000);
  }
  // The first ten labels of each split (TensorFlow's Fashion-MNIST tutorial shows them:
  // ankle boot, T-shirt, T-shirt, dress, ... and ankle boot, pullover, trouser, ...).
  const std::vector<std::uint8_t> train_first = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  const std::vector<std::uint8_t> test_first = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  CHECK(std::vector<std::uint8_t>(data.train.labels.begin(), data.train.labels.begin() + 10) == train_first);
  CHECK(std::vector<std::uint8_t>(data.test.labels.begin(), data.test.labels.begin() + 10) == test_first);
  // The images are not all blank: an ankle boot covers a good part of the frame.
  int lit = 0;
  for (int i = 0; i < 28 * 28; ++i) lit += data.train.pixels[i] > 0;
  CHECK(lit > 100);
}

TEST_CASE("a well-formed small IDX file reads back exactly", "[data]") {
  TempDir dir;
  const auto bytes = small_images();
  write_gzip(dir.path() / "ok.gz", bytes);
  const examples::IdxArray a = examples::read_idx(dir.path() / "ok.gz", 3);
  CHECK(a.dims == std::vector<std::int64_t>{100, 4, 4});
  CHECK(std::vector<std::uint8_t>(bytes.begin() + 16, bytes.end()) == a.values);
}

TEST_CASE("a missing file throws an Error naming it", "[data][bad-input]") {
  TempDir dir;
  const fs::path missing = dir.path() / "no-such-file.gz";
  CHECK_THROWS_MATCHES(examples::read_idx(missing, 3), trainmem::Error,
                       Catch::Matchers::Message("IDX file " + missing.string() + ": does not exist"));
  CHECK_THROWS_WITH(examples::load_fashion_mnist(dir.path()),
                    Contains((dir.path() / "train-images-idx3-ubyte.gz").string()) && Contains("does not exist"));
}

TEST_CASE("a directory where an IDX file should be throws an Error saying it is a directory", "[data][bad-input]") {
  TempDir dir;
  const fs::path folder = dir.path() / "train-images-idx3-ubyte.gz";
  fs::create_directories(folder);
  // Before: "truncated while reading the magic number", as if a download had stopped early.
  CHECK_THROWS_MATCHES(examples::read_idx(folder, 3), trainmem::Error,
                       Catch::Matchers::Message("IDX file " + folder.string() + ": is a directory, not a file"));
  CHECK_THROWS_WITH(examples::load_fashion_mnist(dir.path()),
                    Contains(folder.string()) && Contains("is a directory") && !Contains("truncated"));
}

TEST_CASE("a wrong magic number throws an Error naming the file", "[data][bad-input]") {
  TempDir dir;
  const fs::path labels_as_images = dir.path() / "labels.gz";
  write_gzip(labels_as_images, idx_bytes(0x08, {3}, {1, 2, 3}));  // rank 1, read as rank 3
  CHECK_THROWS_AS(examples::read_idx(labels_as_images, 3), trainmem::Error);
  CHECK_THROWS_WITH(examples::read_idx(labels_as_images, 3), Contains(labels_as_images.string()) &&
                                                                 Contains("wrong magic number 0x801") &&
                                                                 Contains("expected 0x803"));

  const fs::path floats = dir.path() / "floats.gz";
  write_gzip(floats, idx_bytes(0x0D, {1}, {0, 0, 0, 0}));  // element type float
  CHECK_THROWS_WITH(examples::read_idx(floats, 1), Contains(floats.string()) && Contains("wrong magic number 0xd01"));

  const fs::path text = dir.path() / "text.gz";
  write_gzip(text, {'h', 'e', 'l', 'l', 'o', '\n'});
  CHECK_THROWS_WITH(examples::read_idx(text, 1), Contains(text.string()) && Contains("wrong magic number"));
}

TEST_CASE("a truncated gzip file throws an Error naming the file", "[data][bad-input]") {
  TempDir dir;
  const fs::path whole = dir.path() / "whole.gz", cut = dir.path() / "cut.gz";
  write_gzip(whole, small_images());
  const std::vector<char> raw = read_raw(whole);
  REQUIRE(raw.size() > 200);
  // Cut inside the deflate stream (the payload is incompressible, so it is ~1.6 kB).
  write_raw(cut, std::vector<char>(raw.begin(), raw.begin() + static_cast<std::ptrdiff_t>(raw.size() / 2)));
  CHECK_THROWS_AS(examples::read_idx(cut, 3), trainmem::Error);
  CHECK_THROWS_WITH(examples::read_idx(cut, 3), Contains(cut.string()) && Contains("truncated"));

  // Only the 8-byte trailer (CRC-32 and length) missing: every data byte is there,
  // and still the file is not what was written.
  const fs::path no_trailer = dir.path() / "no_trailer.gz";
  write_raw(no_trailer, std::vector<char>(raw.begin(), raw.end() - 8));
  CHECK_THROWS_WITH(examples::read_idx(no_trailer, 3),
                    Contains(no_trailer.string()) && Contains("truncated after the data"));
}

TEST_CASE("corrupt compressed bytes throw an Error naming the file", "[data][bad-input]") {
  TempDir dir;
  const fs::path whole = dir.path() / "whole.gz", flipped = dir.path() / "flipped.gz";
  write_gzip(whole, small_images());
  std::vector<char> raw = read_raw(whole);
  // The CRC-32 in the trailer no longer matches the data.
  raw[raw.size() - 6] = static_cast<char>(raw[raw.size() - 6] ^ 0x5A);
  write_raw(flipped, raw);
  CHECK_THROWS_WITH(examples::read_idx(flipped, 3), Contains(flipped.string()) && Contains("corrupt gzip data"));
}

TEST_CASE("a header that disagrees with the data throws an Error naming the file", "[data][bad-input]") {
  TempDir dir;
  const fs::path short_data = dir.path() / "short.gz", long_data = dir.path() / "long.gz";
  write_gzip(short_data, idx_bytes(0x08, {5}, {1, 2, 3}));  // says 5 labels, has 3
  CHECK_THROWS_WITH(examples::read_idx(short_data, 1), Contains(short_data.string()) &&
                                                           Contains("truncated while reading the data") &&
                                                           Contains("expected 5 bytes, got 3"));
  write_gzip(long_data, idx_bytes(0x08, {2}, {1, 2, 3}));  // says 2 labels, has 3
  CHECK_THROWS_WITH(examples::read_idx(long_data, 1), Contains(long_data.string()) && Contains("bytes after the data"));

  const fs::path zero = dir.path() / "zero.gz";
  write_gzip(zero, idx_bytes(0x08, {0, 28, 28}, {}));
  CHECK_THROWS_WITH(examples::read_idx(zero, 3), Contains(zero.string()) && Contains("extent 0 is 0"));
}

TEST_CASE("images and labels that do not belong together throw an Error naming both files", "[data][bad-input]") {
  TempDir dir;
  const fs::path images = dir.path() / "images.gz", labels = dir.path() / "labels.gz", bad = dir.path() / "bad.gz";
  write_gzip(images, small_images());
  write_gzip(labels, idx_bytes(0x08, {99}, std::vector<std::uint8_t>(99, 1)));
  CHECK_THROWS_WITH(examples::read_image_set(images, labels, 10),
                    Contains(images.string()) && Contains(labels.string()) && Contains("100 images but 99 labels"));
  std::vector<std::uint8_t> with_bad_label(100, 3);
  with_bad_label[42] = 10;
  write_gzip(bad, idx_bytes(0x08, {100}, with_bad_label));
  CHECK_THROWS_WITH(examples::read_image_set(images, bad, 10),
                    Contains(bad.string()) && Contains("label 10 at index 42 is outside [0, 10)"));
}
