// Shared helpers of the observability tests: temporary files, and running the Python
// checker (check_snapshot.py); SimAllocator comes from tests/support.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"
#include "support/sim_allocator.hpp"

namespace reservoir::test {

constexpr std::size_t kMiB = std::size_t{1} << 20;

inline std::vector<std::string> actions(const std::vector<TraceEntry>& entries) {
  std::vector<std::string> out;
  for (const TraceEntry& e : entries) out.emplace_back(to_string(e.action));
  return out;
}

// A path in the temporary folder, unique per process and name.
inline std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/reservoir_obs_" + std::to_string(::getpid()) +
         "_" + name;
}

inline bool file_exists(const std::string& path) {
  return std::ifstream(path).good();
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs check_snapshot.py on a pickle; returns its exit status (-1 without Python).
// RESERVOIR_PYTHON and RESERVOIR_CHECK_SNAPSHOT come from CMake.
inline int check_snapshot(const std::string& pickle, const std::string& args = "") {
  const std::string python = RESERVOIR_PYTHON;
  if (python.empty()) return -1;
  const std::string command =
      "\"" + python + "\" \"" RESERVOIR_CHECK_SNAPSHOT "\" \"" + pickle + "\" " + args;
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

}  // namespace reservoir::test
