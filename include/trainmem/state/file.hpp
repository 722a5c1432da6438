// trainmem/state/file.hpp — a StateDict on disk: self-describing, checksummed, written atomically.
//
// Layout (little-endian):
//   header, 40 bytes: magic "TMSTATE\0", u32 version, u32 flags (0), u64 entry count,
//                     u64 body bytes, u32 CRC-32 of header bytes [8, 32) and the body, u32 0
//   body, per entry:  u32 name bytes, name, u8 element type, u8 rank, u16 0,
//                     i64 extents[rank], u64 data bytes, data
// `save` writes a temporary file next to the destination, fsyncs it, renames it over
// the destination and fsyncs the directory: a crash at any point leaves either the old
// file or the complete new one, never a torn one. `load` checks the magic, the version,
// the length and the checksum before it parses anything, and says which failed.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "trainmem/error.hpp"
#include "trainmem/state/checksum.hpp"
#include "trainmem/state/state_dict.hpp"

namespace trainmem {

/// The state-file format this build writes and reads.
inline constexpr std::uint32_t kStateFileVersion = 1;

namespace detail {

inline constexpr char kStateMagic[8] = {'T', 'M', 'S', 'T', 'A', 'T', 'E', '\0'};
inline constexpr std::size_t kStateHeaderBytes = 40;

template <class T>
void put_le(std::vector<std::byte>& out, T value) {
  const auto* p = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), p, p + sizeof value);
}

/// Reads fixed-size fields out of a byte range, failing (as a corrupt file) past its end.
class StateReader {
 public:
  StateReader(const std::byte* data, std::size_t size, const std::string& path)
      : p_(data), end_(data + size), path_(path) {}
  template <class T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof value), sizeof value);
    return value;
  }
  const std::byte* take(std::size_t n) {
    detail::check(static_cast<std::size_t>(end_ - p_) >= n, "trainmem::load: '", path_,
                  "' is corrupt: an entry runs past the end of the file");
    const std::byte* at = p_;
    p_ += n;
    return at;
  }
  bool done() const { return p_ == end_; }

 private:
  const std::byte* p_;
  const std::byte* end_;
  const std::string& path_;
};

/// Writes all of `data` to `fd`, retrying short writes; throws naming `path` on failure.
inline void write_all(int fd, const void* data, std::size_t size, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    const int error = n < 0 ? errno : EIO;  // a write of 0 bytes sets no errno
    if (n < 0 && error == EINTR) continue;
    detail::check(n > 0, "trainmem::save: writing '", path, "' failed: ", std::strerror(error));
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

/// Closes a file descriptor and removes the temporary file unless released.
struct TempFile {
  int fd = -1;
  std::string path;
  bool keep = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!keep && !path.empty()) ::unlink(path.c_str());
  }
};

inline std::string temp_name_for(const std::filesystem::path& path) {
  static std::atomic<std::uint64_t> counter{0};
  return path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

}  // namespace detail

/// \brief Writes `state` to `path` atomically (temporary file, fsync, rename, fsync of the directory).
inline void save(const std::filesystem::path& path, const StateDict& state) {
  std::vector<std::byte> body;
  for (const auto& [name, e] : state) {
    detail::put_le<std::uint32_t>(body, static_cast<std::uint32_t>(name.size()));
    const auto* n = reinterpret_cast<const std::byte*>(name.data());
    body.insert(body.end(), n, n + name.size());
    detail::put_le<std::uint8_t>(body, static_cast<std::uint8_t>(e.type));
    detail::put_le<std::uint8_t>(body, static_cast<std::uint8_t>(e.shape.rank()));
    detail::put_le<std::uint16_t>(body, 0);
    for (std::int64_t d : e.shape.dims()) detail::put_le<std::int64_t>(body, d);
    detail::put_le<std::uint64_t>(body, e.bytes.size());
    body.insert(body.end(), e.bytes.begin(), e.bytes.end());
  }
  std::vector<std::byte> header;
  header.reserve(detail::kStateHeaderBytes);
  for (char c : detail::kStateMagic) header.push_back(static_cast<std::byte>(c));
  detail::put_le<std::uint32_t>(header, kStateFileVersion);
  detail::put_le<std::uint32_t>(header, 0);
  detail::put_le<std::uint64_t>(header, state.size());
  detail::put_le<std::uint64_t>(header, body.size());
  Crc32 crc;
  crc.update(header.data() + 8, header.size() - 8);
  crc.update(body.data(), body.size());
  detail::put_le<std::uint32_t>(header, crc.value());
  detail::put_le<std::uint32_t>(header, 0);

  std::filesystem::path directory = path.parent_path();
  if (directory.empty()) directory = ".";
  detail::TempFile temp;
  temp.path = detail::temp_name_for(path);
  // Each call's errno is read right after it, never as an argument next to the call
  // (argument order is unspecified).
  temp.fd = ::open(temp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const int open_error = errno;
  detail::check(temp.fd >= 0, "trainmem::save: cannot create '", temp.path, "': ", std::strerror(open_error));
  detail::write_all(temp.fd, header.data(), header.size(), temp.path);
  detail::write_all(temp.fd, body.data(), body.size(), temp.path);
  const int synced = ::fsync(temp.fd);
  const int sync_error = errno;
  detail::check(synced == 0, "trainmem::save: fsync of '", temp.path, "' failed: ", std::strerror(sync_error));
  const int closed = ::close(temp.fd);
  const int close_error = errno;
  temp.fd = -1;
  detail::check(closed == 0, "trainmem::save: closing '", temp.path, "' failed: ", std::strerror(close_error));
  const int renamed = ::rename(temp.path.c_str(), path.c_str());
  const int rename_error = errno;
  detail::check(renamed == 0, "trainmem::save: renaming '", temp.path, "' to '", path.string(),
                "' failed: ", std::strerror(rename_error));
  temp.keep = true;
  // The rename is durable once the directory entry is: fsync the directory (best effort:
  // some file systems refuse to open a directory for it).
  const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

/// \brief Reads a state file; throws naming what is wrong (not a state file, version,
/// truncated, checksum, malformed entry) before anything is returned.
inline StateDict load(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  detail::check(std::filesystem::exists(status), "trainmem::load: cannot open '", name,
                "': ", error ? error.message() : std::string("no such file"));
  detail::check(std::filesystem::is_regular_file(status), "trainmem::load: '", name,
                "' is not a regular file (a directory?)");
  std::ifstream in(path, std::ios::binary);
  detail::check(static_cast<bool>(in), "trainmem::load: cannot open '", name, "'");
  std::vector<std::byte> file;
  {
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    in.seekg(0, std::ios::beg);
    file.resize(static_cast<std::size_t>(size > 0 ? size : 0));
    in.read(reinterpret_cast<char*>(file.data()), static_cast<std::streamsize>(file.size()));
    detail::check(static_cast<bool>(in) || file.empty(), "trainmem::load: reading '", name, "' failed");
  }
  detail::check(file.size() >= 8 && std::memcmp(file.data(), detail::kStateMagic, 8) == 0, "trainmem::load: '", name,
                "' is not a trainmem state file (its first bytes are not \"TMSTATE\")");
  detail::check(file.size() >= detail::kStateHeaderBytes, "trainmem::load: '", name, "' is truncated: ", file.size(),
                " bytes, shorter than the ", detail::kStateHeaderBytes, "-byte header");
  detail::StateReader header(file.data() + 8, detail::kStateHeaderBytes - 8, name);
  const auto version = header.get<std::uint32_t>();
  detail::check(version == kStateFileVersion, "trainmem::load: '", name, "' has format version ", version,
                "; this build reads version ", kStateFileVersion);
  header.get<std::uint32_t>();  // flags
  const auto count = header.get<std::uint64_t>();
  const auto body_bytes = header.get<std::uint64_t>();
  const auto stored_crc = header.get<std::uint32_t>();
  const std::size_t body_have = file.size() - detail::kStateHeaderBytes;
  detail::check(body_have == body_bytes, "trainmem::load: '", name, "' is ",
                body_have < body_bytes ? "truncated" : "longer than its header says", ": ", file.size(),
                " bytes, the header says ", detail::kStateHeaderBytes + body_bytes);
  const std::byte* body = file.data() + detail::kStateHeaderBytes;
  Crc32 crc;
  crc.update(file.data() + 8, 24);
  crc.update(body, body_have);
  detail::check(crc.value() == stored_crc, "trainmem::load: '", name, "' is corrupt: checksum ", std::hex, crc.value(),
                " does not match the stored ", stored_crc);

  StateDict state;
  detail::StateReader reader(body, body_have, name);
  for (std::uint64_t i = 0; i < count; ++i) {
    const auto name_bytes = reader.get<std::uint32_t>();
    const auto* n = reader.take(name_bytes);
    std::string entry_name(reinterpret_cast<const char*>(n), name_bytes);
    const auto type = reader.get<std::uint8_t>();
    const auto rank = reader.get<std::uint8_t>();
    reader.get<std::uint16_t>();
    detail::check(is_valid_state_type(type), "trainmem::load: '", name, "': entry '", entry_name,
                  "' has unknown element type ", static_cast<int>(type));
    std::vector<std::int64_t> dims(rank);
    for (auto& d : dims) {
      d = reader.get<std::int64_t>();
      detail::check(d >= 0, "trainmem::load: '", name, "': entry '", entry_name, "' has a negative extent");
    }
    StateEntry entry{static_cast<StateType>(type), Shape(std::move(dims)), {}};
    const auto data_bytes = reader.get<std::uint64_t>();
    const std::int64_t expected_bytes = byte_count(entry.type, entry.shape);
    detail::check(expected_bytes >= 0 && data_bytes == static_cast<std::uint64_t>(expected_bytes), "trainmem::load: '",
                  name, "': entry '", entry_name, "' (", entry.type, " ", entry.shape, ") holds ", data_bytes,
                  " bytes");
    const auto* data = reader.take(static_cast<std::size_t>(data_bytes));
    entry.bytes.assign(data, data + data_bytes);
    detail::check(!state.contains(entry_name), "trainmem::load: '", name, "': entry '", entry_name, "' appears twice");
    state.set(entry_name, std::move(entry));
  }
  detail::check(reader.done(), "trainmem::load: '", name, "' is corrupt: bytes follow the last entry");
  return state;
}

}  // namespace trainmem
