// tests/state/test_state_file_safety.cpp — what save() does with what already sits at the
// path and around it: symlinks (written through), device nodes and FIFOs (refused), the
// temporary files of writers that died (removed by the next save, those of live writers
// kept), and a file-size limit (an Error, not a process killed by SIGXFSZ).
//
// Every check that could kill or hang the test runner runs in a forked child: the child
// reports how it ended (exit status or signal) and the parent checks that. References:
// the kernel's own behaviour (a save that fits the limit to the byte succeeds; the stat
// type of each path), and dicts compared entry by entry after load.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <trainmem/trainmem.hpp>
#include "error_matchers.hpp"

namespace tmem = trainmem;
using tmem::testing::ErrorContains;

namespace {

std::filesystem::path safety_dir(const std::string& name) {
  auto dir =
      std::filesystem::temp_directory_path() / ("trainmem_state_safety_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// A dict of `floats` f32 values (as raw bytes) and a marker, so dicts differ by `marker`.
tmem::StateDict safety_dict(std::int64_t floats, std::int64_t marker) {
  tmem::StateDict d;
  tmem::StateEntry e{tmem::StateType::F32, tmem::Shape{floats},
                     std::vector<std::byte>(static_cast<std::size_t>(floats) * 4)};
  for (std::size_t i = 0; i < e.bytes.size(); ++i) e.bytes[i] = static_cast<std::byte>((i * 7 + marker) & 0x7f);
  d.set("data", std::move(e));
  d.set_i64("marker", marker);
  return d;
}

/// Names in `dir` other than the ones listed.
std::vector<std::string> other_names(const std::filesystem::path& dir, const std::vector<std::string>& expected) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (std::find(expected.begin(), expected.end(), name) == expected.end()) out.push_back(name);
  }
  return out;
}

/// How a child ended, in words: "exit 0", "signal 25 (File size limit exceeded)".
std::string ending_of(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  return "status " + std::to_string(status);
}

/// Runs `body` in a child process; returns its ending and what it wrote to `message`.
template <class F>
std::pair<std::string, std::string> in_child(F body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string message;
    int code = 0;
    try {
      code = body(message);
    } catch (...) {
      message = "unexpected exception";
      code = 99;
    }
    [[maybe_unused]] const ssize_t written = ::write(fds[1], message.data(), message.size());
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string message;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) message.append(buffer, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return {ending_of(status), message};
}

}  // namespace

TEST_CASE("save under a file-size limit (ulimit -f) throws 'File too large' and leaves no temporary",
          "[state][file][safety]") {
  const auto dir = safety_dir("fsize");
  const auto path = dir / "limited.tmstate";
  const tmem::StateDict old_dict = safety_dict(16, 1), big = safety_dict(64 * 1024, 2);
  tmem::save(path, old_dict);
  // The exact size of the big file, from an unlimited save: the limit at that size must pass.
  tmem::save(dir / "reference.tmstate", big);
  const auto exact = static_cast<rlim_t>(std::filesystem::file_size(dir / "reference.tmstate"));
  std::filesystem::remove(dir / "reference.tmstate");

  SECTION("a limit below the file's size") {
    const auto [ending, message] = in_child([&](std::string& out) {
      const rlimit limit{exact - 1, exact - 1};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 3;
      try {
        tmem::save(path, big);
      } catch (const tmem::Error& e) {
        out = e.what();
        return 0;
      }
      out = "save succeeded";
      return 1;
    });
    INFO("child message: " << message);
    REQUIRE(ending == "exit 0");  // before: signal 25 (File size limit exceeded)
    CHECK_THAT(message, Catch::Contains(path.string()) && Catch::Contains(std::strerror(EFBIG)));
    CHECK(tmem::load(path) == old_dict);
    CHECK(other_names(dir, {"limited.tmstate"}).empty());
  }
  SECTION("a limit of exactly the file's size, with another thread running") {
    const auto [ending, message] = in_child([&](std::string& out) {
      const rlimit limit{exact, exact};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 3;
      std::thread sleeper([] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
      int code = 0;
      try {
        tmem::save(path, big);
      } catch (const tmem::Error& e) {
        out = e.what();
        code = 1;
      }
      sleeper.join();
      return code;
    });
    INFO("child message: " << message);
    REQUIRE(ending == "exit 0");
    CHECK(tmem::load(path) == big);
    CHECK(other_names(dir, {"limited.tmstate"}).empty());
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("save writes through a symlink to its target, the link stays a link", "[state][file][safety]") {
  const auto dir = safety_dir("symlink");
  const auto elsewhere = safety_dir("symlink_target");
  const tmem::StateDict first = safety_dict(8, 1), second = safety_dict(8, 2), third = safety_dict(8, 3);

  SECTION("a relative link in the same directory, and a chain of two links") {
    tmem::save(dir / "run-100.tmstate", first);
    std::filesystem::create_symlink("run-100.tmstate", dir / "latest.tmstate");
    std::filesystem::create_symlink("latest.tmstate", dir / "chain.tmstate");
    tmem::save(dir / "latest.tmstate", second);
    CHECK(std::filesystem::is_symlink(dir / "latest.tmstate"));  // before: replaced by a regular file
    CHECK(std::filesystem::read_symlink(dir / "latest.tmstate") == "run-100.tmstate");
    CHECK(tmem::load(dir / "run-100.tmstate") == second);  // before: the target kept `first`
    tmem::save(dir / "chain.tmstate", third);
    CHECK(std::filesystem::is_symlink(dir / "chain.tmstate"));
    CHECK(tmem::load(dir / "run-100.tmstate") == third);
    CHECK(other_names(dir, {"run-100.tmstate", "latest.tmstate", "chain.tmstate"}).empty());
  }
  SECTION("an absolute link to another directory; the temporary file is made there") {
    tmem::save(elsewhere / "real.tmstate", first);
    std::filesystem::create_symlink(elsewhere / "real.tmstate", dir / "link.tmstate");
    tmem::save(dir / "link.tmstate", second);
    CHECK(std::filesystem::is_symlink(dir / "link.tmstate"));
    CHECK(tmem::load(elsewhere / "real.tmstate") == second);
    CHECK(other_names(dir, {"link.tmstate"}).empty());
    CHECK(other_names(elsewhere, {"real.tmstate"}).empty());
  }
  SECTION("a dangling link: the target is created") {
    std::filesystem::create_symlink("not-yet.tmstate", dir / "dangling.tmstate");
    tmem::save(dir / "dangling.tmstate", first);
    CHECK(std::filesystem::is_symlink(dir / "dangling.tmstate"));
    CHECK(tmem::load(dir / "not-yet.tmstate") == first);
  }
  SECTION("a loop of links is an Error naming the path") {
    std::filesystem::create_symlink("loop-b.tmstate", dir / "loop-a.tmstate");
    std::filesystem::create_symlink("loop-a.tmstate", dir / "loop-b.tmstate");
    CHECK_THROWS_MATCHES(tmem::save(dir / "loop-a.tmstate", first), tmem::Error,
                         ErrorContains((dir / "loop-a.tmstate").string()) && ErrorContains(std::strerror(ELOOP)));
    CHECK(std::filesystem::is_symlink(dir / "loop-a.tmstate"));
    CHECK(other_names(dir, {"loop-a.tmstate", "loop-b.tmstate"}).empty());
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(elsewhere);
}

TEST_CASE("save refuses device nodes, FIFOs and directories, naming the path and its type", "[state][file][safety]") {
  const auto dir = safety_dir("special");
  const tmem::StateDict d = safety_dict(8, 1);

  SECTION("a link to /dev/null: the device is neither replaced nor written") {
    struct stat before {};
    REQUIRE(::stat("/dev/null", &before) == 0);
    REQUIRE(S_ISCHR(before.st_mode));
    std::filesystem::create_symlink("/dev/null", dir / "null.tmstate");
    CHECK_THROWS_MATCHES(tmem::save(dir / "null.tmstate", d), tmem::Error,
                         ErrorContains("'/dev/null'") && ErrorContains("is a character device"));
    struct stat after {};
    REQUIRE(::stat("/dev/null", &after) == 0);
    CHECK(S_ISCHR(after.st_mode));
    CHECK(after.st_rdev == before.st_rdev);
    CHECK(std::filesystem::is_symlink(dir / "null.tmstate"));  // before: replaced by a regular file
    CHECK(other_names(dir, {"null.tmstate"}).empty());
  }
  SECTION("a FIFO is left a FIFO (and nothing blocks on it)") {
    REQUIRE(::mkfifo((dir / "pipe.tmstate").c_str(), 0644) == 0);
    CHECK_THROWS_MATCHES(tmem::save(dir / "pipe.tmstate", d), tmem::Error,
                         ErrorContains((dir / "pipe.tmstate").string()) && ErrorContains("is a FIFO"));
    CHECK(std::filesystem::is_fifo(dir / "pipe.tmstate"));  // before: replaced by a regular file
    CHECK(other_names(dir, {"pipe.tmstate"}).empty());
  }
  SECTION("a device node made here, where the process may (root with CAP_MKNOD)") {
    if (::mknod((dir / "dev.tmstate").c_str(), S_IFCHR | 0644, makedev(1, 3)) != 0) {
      WARN("mknod is not permitted here: " << std::strerror(errno) << "; the /dev/null link covers devices");
      return;
    }
    CHECK_THROWS_MATCHES(tmem::save(dir / "dev.tmstate", d), tmem::Error, ErrorContains("is a character device"));
    CHECK(std::filesystem::is_character_file(dir / "dev.tmstate"));
  }
  SECTION("a directory") {
    std::filesystem::create_directories(dir / "folder.tmstate" / "inside");
    CHECK_THROWS_MATCHES(tmem::save(dir / "folder.tmstate", d), tmem::Error,
                         ErrorContains((dir / "folder.tmstate").string()) && ErrorContains("is a directory"));
    CHECK(std::filesystem::is_directory(dir / "folder.tmstate" / "inside"));
    CHECK(other_names(dir, {"folder.tmstate"}).empty());
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the next save removes the temporary files of writers that died, never a live writer's",
          "[state][file][safety]") {
  const auto dir = safety_dir("stale");
  const auto path = dir / "ckpt.tmstate";
  const tmem::StateDict d = safety_dict(8, 1);
  auto write_bytes = [](const std::filesystem::path& p, std::size_t n) {
    std::ofstream out(p, std::ios::binary);
    out << std::string(n, 'x');
  };

  SECTION("temporaries of every kind next to the destination") {
    // A dead writer's temporary with data: nothing holds its lock.
    write_bytes(dir / "ckpt.tmstate.tmp.999999.0", 1000);
    // A dead writer's empty temporary, an hour old (died between creating and locking it).
    write_bytes(dir / "ckpt.tmstate.tmp.999999.1", 0);
    const timeval old_times[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
    REQUIRE(::utimes((dir / "ckpt.tmstate.tmp.999999.1").c_str(), old_times) == 0);
    // A live writer's: it holds the lock (a separate open file description, as another process's is).
    write_bytes(dir / "ckpt.tmstate.tmp.123.0", 500);
    const int live = ::open((dir / "ckpt.tmstate.tmp.123.0").c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(live >= 0);
    REQUIRE(::flock(live, LOCK_EX | LOCK_NB) == 0);
    // A writer that has just created its file and not locked it yet: empty and new.
    write_bytes(dir / "ckpt.tmstate.tmp.124.0", 0);
    // Names that are not this destination's temporaries.
    write_bytes(dir / "ckpt.tmstate.tmp.notes", 10);
    write_bytes(dir / "other.tmstate.tmp.5.0", 10);
    write_bytes(dir / "ckpt.tmstate.tmp.5.0.bak", 10);

    tmem::save(path, d);
    CHECK(tmem::load(path) == d);
    std::vector<std::string> left = other_names(dir, {"ckpt.tmstate"});
    std::sort(left.begin(), left.end());
    CHECK(left == std::vector<std::string>{"ckpt.tmstate.tmp.123.0", "ckpt.tmstate.tmp.124.0",
                                           "ckpt.tmstate.tmp.5.0.bak", "ckpt.tmstate.tmp.notes",
                                           "other.tmstate.tmp.5.0"});
    ::close(live);
  }
  SECTION("a writer killed by SIGKILL in the middle of a save") {
    // The child saves a 16 MiB state over and over; the parent kills it while a temporary exists.
    const tmem::StateDict big = safety_dict(4 << 20, 2);
    bool leaked = false;
    for (int attempt = 0; attempt < 40 && !leaked; ++attempt) {
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        try {
          for (;;) tmem::save(path, big);
        } catch (...) {
        }
        ::_exit(1);
      }
      // Kill once a temporary holds data (an empty one just created is a live writer's
      // until it is old: the save that follows would rightly keep it).
      auto temporary_with_data = [&] {
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator(dir, ec))
          if (e.path().filename() != "ckpt.tmstate" && std::filesystem::file_size(e.path(), ec) > 0 && !ec) return true;
        return false;
      };
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!temporary_with_data() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      ::kill(pid, SIGKILL);
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      REQUIRE(WIFSIGNALED(status));
      leaked = !other_names(dir, {"ckpt.tmstate"}).empty();
    }
    REQUIRE(leaked);
    tmem::save(path, d);
    CHECK(tmem::load(path) == d);
    CHECK(other_names(dir, {"ckpt.tmstate"}).empty());  // before: the killed writer's file stays
  }
  SECTION("two live processes saving to one path never remove each other's temporary") {
    const tmem::StateDict mine = safety_dict(1 << 18, 3), theirs = safety_dict(1 << 18, 4);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 0;
      try {
        for (int i = 0; i < 40; ++i) tmem::save(path, theirs);
      } catch (...) {
        code = 1;
      }
      ::_exit(code);
    }
    std::string failure;
    try {
      for (int i = 0; i < 40; ++i) tmem::save(path, mine);
    } catch (const tmem::Error& e) {
      failure = e.what();
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(failure.empty());
    CHECK(ending_of(status) == "exit 0");
    const tmem::StateDict last = tmem::load(path);
    CHECK((last == mine || last == theirs));
    CHECK(other_names(dir, {"ckpt.tmstate"}).empty());
  }
  std::filesystem::remove_all(dir);
}
