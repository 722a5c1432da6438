// examples/common/idx_reader.hpp — reads (Fashion-)MNIST IDX files, gzip or plain.
//
// An IDX file is a 4-byte magic (0, 0, element type, rank), `rank` big-endian u32
// extents, then the elements row-major. zlib's gzread inflates a .gz file and reads
// an uncompressed one unchanged, and on reaching the end of a gzip member it checks
// the member's CRC-32 and length, so a corrupt or truncated download is caught here
// (one byte is read past the expected payload to make zlib reach that end) rather
// than showing up later as a model that learns nothing. Every failure throws
// trainmem::Error naming the file and what was wrong.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trainmem/error.hpp"

namespace examples {

/// \brief One IDX array of unsigned bytes: extents and values, row-major.
struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> values;

  std::int64_t count() const { return dims.empty() ? 0 : dims[0]; }
};

namespace detail {

/// A gzFile that closes itself; every read checks for short reads and zlib errors.
class GzReader {
 public:
  explicit GzReader(const std::filesystem::path& path) : path_(path.string()) {
    trainmem::detail::check(std::filesystem::exists(path), "IDX file ", path_, ": does not exist");
    file_ = gzopen(path_.c_str(), "rb");
    trainmem::detail::check(file_ != nullptr, "IDX file ", path_, ": cannot be opened");
  }
  ~GzReader() {
    if (file_ != nullptr) gzclose(file_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  const std::string& path() const { return path_; }

  /// Reads exactly `bytes` bytes; `what` names the part of the file for the message.
  void read_exactly(void* out, std::size_t bytes, const char* what) {
    auto* dst = static_cast<unsigned char*>(out);
    std::size_t done = 0;
    while (done < bytes) {
      // gzread takes an unsigned count; read in chunks well below its limit.
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(bytes - done, std::size_t{1} << 30));
      const int got = gzread(file_, dst + done, chunk);
      check_zlib(got, what);
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    trainmem::detail::check(done == bytes, "IDX file ", path_, ": truncated while reading the ", what, " (expected ",
                            bytes, " bytes, got ", done, ")", zlib_detail());
  }

  /// Reads past the payload: this makes zlib verify the gzip trailer (CRC-32, length),
  /// and finds data that a well-formed file does not have.
  void require_end() {
    unsigned char extra = 0;
    const int got = gzread(file_, &extra, 1);
    check_zlib(got, "end of the data");
    trainmem::detail::check(got == 0, "IDX file ", path_,
                            ": has bytes after the data its header declares (not an IDX file of that shape)");
    // A stream cut short after the last data byte: zlib reports it without failing the read.
    int code = Z_OK;
    gzerror(file_, &code);
    trainmem::detail::check(code == Z_OK, "IDX file ", path_,
                            ": truncated after the data (the gzip trailer with its "
                            "CRC-32 and length is missing or incomplete)",
                            zlib_detail());
  }

 private:
  void check_zlib(int got, const char* what) {
    if (got >= 0) return;
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    throw trainmem::Error(trainmem::detail::concat("IDX file ", path_, ": corrupt gzip data while reading the ", what,
                                                   " (zlib: ", message != nullptr ? message : "unknown error", ")"));
  }
  /// zlib's own explanation of a short read, when it has one ("unexpected end of file").
  std::string zlib_detail() {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code == Z_OK || message == nullptr || *message == '\0') return {};
    return trainmem::detail::concat(" (zlib: ", message, ")");
  }

  std::string path_;
  gzFile file_ = nullptr;
};

inline std::uint32_t big_endian_u32(const std::array<unsigned char, 4>& b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
}

}  // namespace detail

/// IDX element type code for unsigned bytes, the only type (Fashion-)MNIST uses.
inline constexpr unsigned char kIdxUnsignedByte = 0x08;

/// Reads an IDX file of unsigned bytes with `expected_rank` extents (1: labels, 3: images).
inline IdxArray read_idx(const std::filesystem::path& path, std::size_t expected_rank) {
  detail::GzReader in(path);
  std::array<unsigned char, 4> magic{};
  in.read_exactly(magic.data(), magic.size(), "magic number");
  trainmem::detail::check(magic[0] == 0 && magic[1] == 0 && magic[2] == kIdxUnsignedByte && magic[3] == expected_rank,
                          "IDX file ", in.path(), ": wrong magic number 0x", std::hex, detail::big_endian_u32(magic),
                          " (expected 0x", 0x800u + expected_rank, std::dec, ": unsigned bytes, rank ", expected_rank,
                          ")");
  IdxArray array;
  std::int64_t total = 1;
  for (std::size_t axis = 0; axis < expected_rank; ++axis) {
    std::array<unsigned char, 4> extent{};
    in.read_exactly(extent.data(), extent.size(), "header extents");
    const std::int64_t dim = detail::big_endian_u32(extent);
    // 2^31 elements is far beyond any IDX data set; a larger value means a damaged header.
    trainmem::detail::check(dim > 0 && total <= (std::int64_t{1} << 31) / dim, "IDX file ", in.path(), ": extent ",
                            axis, " is ", dim, ", which no IDX data set of this kind has (damaged header?)");
    total *= dim;
    array.dims.push_back(dim);
  }
  array.values.resize(static_cast<std::size_t>(total));
  in.read_exactly(array.values.data(), array.values.size(), "data");
  in.require_end();
  return array;
}

/// \brief A labelled image set: `count` images of rows x cols bytes, one label each.
struct ImageSet {
  std::int64_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  // [count, rows * cols]
  std::vector<std::uint8_t> labels;  // [count], each < classes
};

/// Reads an images file and its labels file and checks that they belong together.
inline ImageSet read_image_set(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                               int classes) {
  IdxArray images = read_idx(images_path, 3);
  IdxArray labels = read_idx(labels_path, 1);
  trainmem::detail::check(images.count() == labels.count(), "IDX files ", images_path.string(), " and ",
                          labels_path.string(), ": ", images.count(), " images but ", labels.count(), " labels");
  for (std::size_t i = 0; i < labels.values.size(); ++i)
    trainmem::detail::check(labels.values[i] < classes, "IDX file ", labels_path.string(), ": label ",
                            int{labels.values[i]}, " at index ", i, " is outside [0, ", classes, ")");
  ImageSet set;
  set.count = images.dims[0];
  set.rows = images.dims[1];
  set.cols = images.dims[2];
  set.pixels = std::move(images.values);
  set.labels = std::move(labels.values);
  return set;
}

/// Where the Fashion-MNIST files are: the build's TRAINMEM_FASHION_MNIST_DIR, by default
/// where Debian's dataset-fashion-mnist package puts them.
#ifdef TRAINMEM_FASHION_MNIST_DIR
inline const char* const kFashionMnistDir = TRAINMEM_FASHION_MNIST_DIR;
#else
inline const char* const kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
#endif

/// \brief Fashion-MNIST: 60000 training and 10000 test images, 28 x 28, 10 classes.
struct FashionMnist {
  static constexpr int kClasses = 10;
  static constexpr std::int64_t kSide = 28;
  ImageSet train, test;
};

/// Loads the four Fashion-MNIST files from `dir` and checks their published shape.
inline FashionMnist load_fashion_mnist(const std::filesystem::path& dir = kFashionMnistDir) {
  FashionMnist data;
  const auto load = [&](const char* images, const char* labels, std::int64_t expected_count) {
    ImageSet set = read_image_set(dir / images, dir / labels, FashionMnist::kClasses);
    trainmem::detail::check(
        set.count == expected_count && set.rows == FashionMnist::kSide && set.cols == FashionMnist::kSide, "IDX file ",
        (dir / images).string(), ": holds ", set.count, " images of ", set.rows, "x", set.cols, ", Fashion-MNIST has ",
        expected_count, " of 28x28");
    return set;
  };
  data.train = load("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60000);
  data.test = load("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10000);
  return data;
}

}  // namespace examples
