// examples/common/idx_reader.hpp — reads (Fashion-)MNIST IDX files, gzip or plain.
//
// An IDX file is a 4-byte magic (0, 0, element type, rank), `rank` big-endian u32
// extents, then the elements row-major. A file that starts with gzip's magic (1f 8b)
// is inflated with zlib's inflate, which checks the member's CRC-32 and length at its
// end; any other file is read as it is. So a corrupt or truncated download is caught
// here rather than showing up later as a model that learns nothing: bad deflate data
// or a bad trailer is "corrupt gzip data", a stream that stops early is "truncated",
// and anything after the one gzip member (IDX files have one) is rejected. The data is
// read in chunks and the array grows as bytes arrive, so a damaged header that
// declares 2 GiB costs no more memory than the bytes the file really holds. Every
// failure throws trainmem::Error naming the file and what was wrong.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
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

/// Bytes of an IDX file, inflated when it is gzip; every read checks for short reads and zlib errors.
class GzReader {
 public:
  explicit GzReader(const std::filesystem::path& path) : path_(path.string()) {
    trainmem::require(std::filesystem::exists(path), "IDX file ", path_, ": does not exist");
    // A directory opens as a stream whose first read fails: said here, not as "truncated".
    trainmem::require(!std::filesystem::is_directory(path), "IDX file ", path_, ": is a directory, not a file");
    file_.open(path, std::ios::binary);
    trainmem::require(file_.is_open(), "IDX file ", path_, ": cannot be opened");
    refill();
    gzip_ = z_.avail_in >= 2 && buffer_[0] == 0x1f && buffer_[1] == 0x8b;
    if (gzip_) {
      // 15 + 16: the largest window, and a gzip header and trailer around the deflate data.
      trainmem::require(inflateInit2(&z_, 15 + 16) == Z_OK, "IDX file ", path_, ": zlib cannot start inflating");
      inflating_ = true;
    }
  }
  ~GzReader() {
    if (inflating_) inflateEnd(&z_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  const std::string& path() const { return path_; }

  /// Reads exactly `bytes` bytes; `what` names the part of the file for the message,
  /// which counts `before` bytes of it already read out of `whole` (0: just these).
  void read_exactly(void* out, std::size_t bytes, const char* what, std::size_t before = 0, std::size_t whole = 0) {
    auto* dst = static_cast<unsigned char*>(out);
    std::size_t done = 0;
    while (done < bytes) {
      const std::size_t want = std::min<std::size_t>(bytes - done, std::size_t{1} << 30);  // zlib counts in uInt
      const std::size_t got = produce(dst + done, want, what);
      done += got;
      if (got < want) break;
    }
    trainmem::require(done == bytes, "IDX file ", path_, ": truncated while reading the ", what, " (expected ",
                      whole != 0 ? whole : bytes, " bytes, got ", before + done, ")",
                      gzip_ ? " (zlib: the compressed stream ends early)" : "");
  }

  /// Reads past the payload: finds data a well-formed file does not have, and makes
  /// zlib reach the gzip trailer and verify it (CRC-32, length).
  void require_end() {
    unsigned char extra = 0;
    trainmem::require(produce(&extra, 1, "end of the data") == 0, "IDX file ", path_,
                      ": has bytes after the data its header declares (not an IDX file of that shape)");
    if (!gzip_) return;
    trainmem::require(stream_end_, "IDX file ", path_,
                      ": truncated after the data (the gzip trailer with its "
                      "CRC-32 and length is missing or incomplete)");
    trainmem::require(z_.avail_in == 0 && !refill(), "IDX file ", path_,
                      ": has bytes after its gzip member (junk, or a second member; an IDX file has one)");
  }

 private:
  /// More input into buffer_ when what was there is used up; false at the end of the file.
  bool refill() {
    if (z_.avail_in > 0) return true;
    file_.read(reinterpret_cast<char*>(buffer_.data()), static_cast<std::streamsize>(buffer_.size()));
    z_.next_in = buffer_.data();
    z_.avail_in = static_cast<uInt>(file_.gcount());
    // A failed read (an I/O error, not the end of the file) must not pass for a short file.
    trainmem::require(!file_.bad(), "IDX file ", path_, ": reading failed (an I/O error)");
    return z_.avail_in > 0;
  }

  /// Up to `bytes` (< 2^32) bytes of content into dst; fewer only at the end of the content.
  std::size_t produce(unsigned char* dst, std::size_t bytes, const char* what) {
    if (!gzip_) {
      std::size_t done = 0;
      while (done < bytes && refill()) {
        const std::size_t n = std::min<std::size_t>(bytes - done, z_.avail_in);
        std::copy_n(z_.next_in, n, dst + done);
        z_.next_in += n;
        z_.avail_in -= static_cast<uInt>(n);
        done += n;
      }
      return done;
    }
    z_.next_out = dst;
    z_.avail_out = static_cast<uInt>(bytes);
    while (z_.avail_out > 0 && !stream_end_) {
      if (z_.avail_in == 0 && !refill()) break;  // the compressed stream stops: truncated
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        stream_end_ = true;
      } else {
        trainmem::require(rc == Z_OK || rc == Z_BUF_ERROR, "IDX file ", path_, ": corrupt gzip data while reading the ",
                          what, " (zlib: ", z_.msg != nullptr ? z_.msg : zError(rc), ")");
      }
    }
    return bytes - z_.avail_out;
  }

  std::string path_;
  std::ifstream file_;
  std::array<unsigned char, std::size_t{1} << 16> buffer_{};
  z_stream z_{};
  bool gzip_ = false, inflating_ = false, stream_end_ = false;
};

inline std::uint32_t big_endian_u32(const std::array<unsigned char, 4>& b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
}

/// IDX element type code for unsigned bytes, the only type (Fashion-)MNIST uses.
inline constexpr unsigned char kIdxUnsignedByte = 0x08;

/// Reads an IDX file of unsigned bytes with `expected_rank` extents (1: labels, 3: images).
inline IdxArray read_idx(const std::filesystem::path& path, std::size_t expected_rank) {
  GzReader in(path);
  std::array<unsigned char, 4> magic{};
  in.read_exactly(magic.data(), magic.size(), "magic number");
  trainmem::require(magic[0] == 0 && magic[1] == 0 && magic[2] == kIdxUnsignedByte && magic[3] == expected_rank,
                    "IDX file ", in.path(), ": wrong magic number 0x", std::hex, big_endian_u32(magic), " (expected 0x",
                    0x800u + expected_rank, std::dec, ": unsigned bytes, rank ", expected_rank, ")");
  IdxArray array;
  std::int64_t total = 1;
  for (std::size_t axis = 0; axis < expected_rank; ++axis) {
    std::array<unsigned char, 4> extent{};
    in.read_exactly(extent.data(), extent.size(), "header extents");
    const std::int64_t dim = big_endian_u32(extent);
    // 2^31 elements is far beyond any IDX data set; a larger value means a damaged header.
    trainmem::require(dim > 0 && total <= (std::int64_t{1} << 31) / dim, "IDX file ", in.path(), ": extent ", axis,
                      " is ", dim, ", which no IDX data set of this kind has (damaged header?)");
    total *= dim;
    array.dims.push_back(dim);
  }
  // Grow with the data actually read, never to the declared size up front.
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  const auto declared = static_cast<std::size_t>(total);
  while (array.values.size() < declared) {
    const std::size_t at = array.values.size(), n = std::min(kChunk, declared - at);
    array.values.resize(at + n);
    in.read_exactly(array.values.data() + at, n, "data", at, declared);
  }
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
  trainmem::require(images.count() == labels.count(), "IDX files ", images_path.string(), " and ", labels_path.string(),
                    ": ", images.count(), " images but ", labels.count(), " labels");
  for (std::size_t i = 0; i < labels.values.size(); ++i)
    trainmem::require(labels.values[i] < classes, "IDX file ", labels_path.string(), ": label ", int{labels.values[i]},
                      " at index ", i, " is outside [0, ", classes, ")");
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
    trainmem::require(set.count == expected_count && set.rows == FashionMnist::kSide && set.cols == FashionMnist::kSide,
                      "IDX file ", (dir / images).string(), ": holds ", set.count, " images of ", set.rows, "x",
                      set.cols, ", Fashion-MNIST has ", expected_count, " of 28x28");
    return set;
  };
  data.train = load("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60000);
  data.test = load("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10000);
  return data;
}

}  // namespace examples
