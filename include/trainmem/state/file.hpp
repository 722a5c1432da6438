// trainmem/state/file.hpp — a StateDict on disk: self-describing, checksummed, written atomically.
//
// Layout (little-endian):
//   header, 40 bytes: magic "TMSTATE\0", u32 version, u32 flags (0), u64 entry count,
//                     u64 body bytes, u32 CRC-32 of header bytes [8, 32) and the body, u32 0
//   body, per entry:  u32 name bytes, name, u8 element type, u8 rank, u16 0,
//                     i64 extents[rank], u64 data bytes, data
//   element types (StateType): 0 f32, 1 f64, 2 f16, 3 bf16, 4 i32, 5 i64, 6 u64,
//                     7 f8e4m3, 8 f8e5m2 (each one byte: the bits as the tensor holds them)
// `save` writes a temporary file next to the destination, fsyncs it, renames it over
// the destination and fsyncs the directory: a crash at any point leaves either the old
// file or the complete new one, never a torn one. `load` checks the magic, the version,
// the length and the checksum before it parses anything, and says which failed.
//
// NOTE [What save does around the destination]
// - A symbolic link is followed (a chain too, relative targets from the link's folder)
//   and the file it leads to is replaced, in that file's folder; the link stays as it was.
// - Only a regular file (or nothing) is replaced: a directory, device node, FIFO or
//   socket at the destination is an Error naming the path and its type.
// - The temporary is "<destination>.tmp.<pid>.<n>", locked (flock) while its writer
//   lives. Each save first removes the temporaries of that destination nobody holds
//   locked (writers that died, e.g. by SIGKILL): a live writer's lock keeps its file,
//   whatever host or pid namespace it runs in (flock reaches NFS as a POSIX lock). An
//   empty unlocked one is removed only when older than kEmptyTemporaryGraceSeconds:
//   its writer may be between creating and locking it.
// - A file-size limit (RLIMIT_FSIZE, `ulimit -f`) below the file's size is an Error,
//   "File too large", before anything is written. The kernel sends SIGXFSZ (which kills
//   by default) only for a write that starts at or past the limit, and save knows the
//   whole size first, so a save that fits never meets the signal; no signal disposition
//   or mask is touched. (Only a limit lowered by another thread during a save escapes this.)
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
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

/// Removes the temporary file unless released, then closes it (releasing its lock).
struct TempFile {
  int fd = -1;
  std::string path;
  bool keep = false;
  ~TempFile() {
    if (!keep && !path.empty()) ::unlink(path.c_str());
    if (fd >= 0) ::close(fd);
  }
};

inline std::string temp_name_for(const std::filesystem::path& path) {
  static std::atomic<std::uint64_t> counter{0};
  return path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

/// Whether `name` is `prefix` followed by "<digits>.<digits>" (a temp_name_for name).
inline bool is_temp_name(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  std::size_t dots = 0, digits = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] == '.') {
      if (digits == 0 || ++dots > 1) return false;
      digits = 0;
    } else if (name[i] >= '0' && name[i] <= '9') {
      ++digits;
    } else {
      return false;
    }
  }
  return dots == 1 && digits > 0;
}

/// How long an empty, unlocked temporary is left alone (its writer may not have locked it yet).
inline constexpr std::time_t kEmptyTemporaryGraceSeconds = 600;

/// Removes the temporaries of `target` that no live writer holds locked (NOTE [What save
/// does around the destination]). Best effort: what cannot be read or removed is left.
inline void remove_stale_temporaries(const std::filesystem::path& target) {
  std::filesystem::path directory = target.parent_path();
  if (directory.empty()) directory = ".";
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code error;
  for (std::filesystem::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!is_temp_name(name, prefix)) continue;
    const std::string candidate = it->path().string();
    const int fd = ::open(candidate.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat held {};
    // Locked by us now, the file cannot gain a writer: its size and age say whether it is stale.
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &held) == 0 && S_ISREG(held.st_mode) &&
        (held.st_size > 0 || held.st_mtime < std::time(nullptr) - kEmptyTemporaryGraceSeconds)) {
      // Removed only while the name still is this file (a writer may have renamed it into place).
      struct stat named {};
      if (::lstat(candidate.c_str(), &named) == 0 && named.st_ino == held.st_ino && named.st_dev == held.st_dev)
        ::unlink(candidate.c_str());
    }
    ::close(fd);
  }
}

/// A stat file type in words ("a directory", "a FIFO", ...).
inline const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

/// The file a save to `path` replaces: `path` with every symbolic link of its last
/// component followed (a relative target is taken from the link's folder). It need not
/// exist; when it does, it must be a regular file.
inline std::filesystem::path save_target(const std::filesystem::path& path) {
  // The kernel's own limit on links followed in one lookup (MAXSYMLINKS).
  constexpr int kMaxLinks = 40;
  std::filesystem::path target = path;
  for (int links = 0;; ++links) {
    struct stat st {};
    // Not there (or not reachable): creating the temporary next to it says why, if anything is wrong.
    if (::lstat(target.c_str(), &st) != 0) return target;
    if (S_ISREG(st.st_mode)) return target;
    const std::string leads = target == path ? std::string() : detail::concat(" (where '", path.string(), "' leads)");
    detail::check(S_ISLNK(st.st_mode), "trainmem::save: '", target.string(), "'", leads, " is ",
                  file_type_name(st.st_mode),
                  ", not a regular file; save replaces only regular files (nothing was written)");
    detail::check(links < kMaxLinks, "trainmem::save: cannot follow '", path.string(), "': ", std::strerror(ELOOP),
                  " (more than ", kMaxLinks, " links)");
    std::error_code error;
    const std::filesystem::path next = std::filesystem::read_symlink(target, error);
    detail::check(!error, "trainmem::save: cannot read the link '", target.string(), "': ", error.message());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
}

/// Throws "File too large" when the file-size limit (RLIMIT_FSIZE) is below `bytes`: a
/// write past it would raise SIGXFSZ, whose default action kills the process.
inline void check_file_size_limit(std::uint64_t bytes, const std::filesystem::path& target) {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  detail::check(bytes <= static_cast<std::uint64_t>(limit.rlim_cur), "trainmem::save: cannot write '", target.string(),
                "': ", std::strerror(EFBIG), " (the file is ", bytes,
                " bytes; this process may write files of at most ", static_cast<std::uint64_t>(limit.rlim_cur),
                " bytes: RLIMIT_FSIZE, ulimit -f); nothing was written");
}

}  // namespace detail

/// \brief Writes `state` to `path` atomically (temporary file, fsync, rename, fsync of the
/// directory). Follows symbolic links to the file they lead to; refuses anything but a
/// regular file there; removes dead writers' temporaries; a file-size limit is an Error
/// (NOTE [What save does around the destination]).
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

  const std::filesystem::path target = detail::save_target(path);
  detail::check_file_size_limit(header.size() + body.size(), target);
  detail::remove_stale_temporaries(target);
  std::filesystem::path directory = target.parent_path();
  if (directory.empty()) directory = ".";
  detail::TempFile temp;
  temp.path = detail::temp_name_for(target);
  // Each call's errno is read right after it, never as an argument next to the call
  // (argument order is unspecified).
  temp.fd = ::open(temp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const int open_error = errno;
  detail::check(temp.fd >= 0, "trainmem::save: cannot create '", temp.path, "': ", std::strerror(open_error));
  // Held until the rename is done: a file locked by a live writer is never taken for a
  // dead one's. A file system without locks leaves it unlocked, and then no save removes it.
  while (::flock(temp.fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  detail::write_all(temp.fd, header.data(), header.size(), temp.path);
  detail::write_all(temp.fd, body.data(), body.size(), temp.path);
  const int synced = ::fsync(temp.fd);
  const int sync_error = errno;
  detail::check(synced == 0, "trainmem::save: fsync of '", temp.path, "' failed: ", std::strerror(sync_error));
  const int renamed = ::rename(temp.path.c_str(), target.c_str());
  const int rename_error = errno;
  detail::check(renamed == 0, "trainmem::save: renaming '", temp.path, "' to '", target.string(),
                "' failed: ", std::strerror(rename_error));
  temp.keep = true;
  // The data is on disk (fsync succeeded), so closing cannot lose it; the close releases the lock.
  ::close(temp.fd);
  temp.fd = -1;
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
