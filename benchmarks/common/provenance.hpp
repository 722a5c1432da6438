// benchmarks/common/provenance.hpp — where a results file came from, recorded in the file.
//
// A figure is only checkable if its file says how it was made, so every benchmark puts one
// record at the top of what it writes: the commit (with "-dirty" when tracked files differ
// from it), the date (UTC), the command line, the machine (the CPU model with its family,
// model and the ISA flags that choose kernels; for a CUDA benchmark also the GPU's name and
// the driver version), the threads used and the 1-minute load average at the start. In JSON
// it is the object under "provenance"; in text, lines starting "# ".
//
// The overwrite rule: a results file is never replaced by a run on another machine.
// check_writable(path, p), called before anything is measured, refuses (exit status 2,
// with the reason on stderr) when `path` exists and does not name this run's machine
// exactly (a file from another machine, or one from before these records). Give such a run
// a new name carrying the machine kind and the date: results/<benchmark>_<kind>_<date>.json,
// e.g. results/op_overhead_amd_zen2_2026-12-06.json.
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "common/machine.hpp"

#ifndef BENCHMARKS_SOURCE_DIR
#define BENCHMARKS_SOURCE_DIR "."
#endif

namespace benchmarks {

namespace detail {

/// The first line `command` prints, without its newline; "" when it cannot run.
inline std::string first_line_of(const std::string& command) {
  std::string line;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    std::array<char, 256> buffer{};
    if (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe) != nullptr) line = buffer.data();
    pclose(pipe);
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

/// `text` as a JSON string literal, quotes included.
inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += std::string("\\") + c;
    else if (c == '\n') out += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) out += ' ';
    else out += c;
  }
  return out + "\"";
}

}  // namespace detail

/// \brief How one benchmark run was made: what every results file records.
struct Provenance {
  std::string commit;       ///< `git rev-parse` of the source tree, "-dirty" appended when it has changes
  std::string date;         ///< UTC, ISO 8601
  std::string command;      ///< the command line, arguments separated by spaces
  std::string cpu;          ///< cpu_description(): model, family/model, ISA flags
  std::string gpu;          ///< "name, driver X.Y, compute capability M.m"; empty for a CPU benchmark
  int threads = 0;          ///< threads the benchmark computes with (OpenMP / oneDNN)
  double load_1min = -1.0;  ///< 1-minute load average at the start; -1 when unknown

  /// The machine as check_writable compares it: the CPU, and the GPU when there is one.
  std::string machine() const { return gpu.empty() ? cpu : cpu + "; GPU " + gpu; }

  /// The record as one JSON object.
  std::string json() const {
    std::ostringstream out;
    out << "{\"commit\": " << detail::json_string(commit) << ", \"date\": " << detail::json_string(date)
        << ", \"command\": " << detail::json_string(command) << ", \"machine\": " << detail::json_string(machine())
        << ", \"cpu\": " << detail::json_string(cpu) << ", \"gpu\": " << detail::json_string(gpu)
        << ", \"threads\": " << threads << ", \"load_1min\": " << load_1min << "}";
    return out.str();
  }

  /// The record as text lines, each starting with `prefix`.
  std::string text(const std::string& prefix = "# ") const {
    std::ostringstream out;
    out << prefix << "commit: " << commit << "\n"
        << prefix << "date: " << date << "\n"
        << prefix << "command: " << command << "\n"
        << prefix << "machine: " << machine() << "\n"
        << prefix << "threads: " << threads << ", load average (1 min) at start: " << load_1min << "\n";
    return out.str();
  }
};

/// The record for this run. `threads`: what the benchmark computes with; `gpu`: the CUDA
/// benchmarks pass gpu_description(), the CPU ones nothing.
inline Provenance provenance(int argc, char** argv, int threads, std::string gpu = {}) {
  Provenance p;
  const std::string git = std::string("git -C '") + BENCHMARKS_SOURCE_DIR + "' ";
  p.commit = detail::first_line_of(git + "rev-parse --short=12 HEAD 2>/dev/null");
  if (p.commit.empty()) p.commit = "unknown (not run from a git checkout)";
  else if (!detail::first_line_of(git + "status --porcelain --untracked-files=no 2>/dev/null").empty())
    p.commit += "-dirty";
  std::array<char, 32> when{};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(when.data(), when.size(), "%Y-%m-%dT%H:%M:%SZ", &utc);
  p.date = when.data();
  for (int i = 0; i < argc; ++i) p.command += (i ? " " : "") + std::string(argv[i]);
  p.cpu = cpu_description();
  p.gpu = std::move(gpu);
  p.threads = threads;
  std::ifstream loadavg("/proc/loadavg");
  if (!(loadavg >> p.load_1min)) p.load_1min = -1.0;
  return p;
}

/// Refuses (stderr, exit status 2) to let this run replace `path` when the file there does
/// not name this run's machine; see the overwrite rule at the top. Call before measuring.
inline void check_writable(const std::string& path, const Provenance& p) {
  std::ifstream in(path);
  if (!in) return;
  const std::string held((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (held.find(p.machine()) != std::string::npos || held.find(detail::json_string(p.machine())) != std::string::npos)
    return;
  std::fprintf(stderr,
               "%s exists and was not written on this machine (%s), or records no machine: not overwriting it.\n"
               "Name this run's file with the machine kind and date, e.g. <benchmark>_<kind>_<YYYY-MM-DD>.json.\n",
               path.c_str(), p.machine().c_str());
  std::exit(2);
}

}  // namespace benchmarks
