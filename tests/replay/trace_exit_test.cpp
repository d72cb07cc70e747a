// The trace of a process-wide allocator survives every way a process ends: the
// programs trace_exit_cpp (C++ API) and trace_exit_c (C API, threads) record with
// RESERVOIR_ALLOC_CONF=record_trace:PATH and end without stopping the recording;
// the trace they leave must hold every event. (Before the exit handler, the C++
// program left a 0-byte .gz and the threaded C program a gzip that ended early.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "replay_test_util.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {
namespace {

using test::TempDir;

// Runs program with args and RESERVOIR_ALLOC_CONF naming the trace; returns the
// wait status.
int run_recording(const std::string& program, const std::vector<std::string>& args,
                  const std::string& trace) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string conf = "device:sim,record_trace:" + trace;
    setenv("RESERVOIR_ALLOC_CONF", conf.c_str(), 1);
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

constexpr int kCount = 30000;  // several of the recorder's 256 KiB buffers
constexpr std::uint64_t kFrees = kCount - (kCount + 63) / 64;  // every 64th is kept

void expect_exit_zero(int status) {
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  ASSERT_EQ(WEXITSTATUS(status), 0);
}

struct CppMode {
  const char* mode;
  const char* file;
};

class CppProgramEnds : public ::testing::TestWithParam<CppMode> {};

TEST_P(CppProgramEnds, TraceHoldsEveryEvent) {
  TempDir dir;
  const std::string trace = dir.file(GetParam().file);
  const std::string mode = GetParam().mode;
  const int status = run_recording(TRACE_EXIT_CPP, {mode, std::to_string(kCount)}, trace);
  if (mode == "sigterm") {
    ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
    EXPECT_EQ(WTERMSIG(status), SIGTERM);  // it still dies of the signal
  } else {
    expect_exit_zero(status);
  }
  const Trace t = read_trace(trace);  // throws on a truncated or torn file
  std::uint32_t allocations = kCount;
  std::uint64_t frees = kFrees;
  if (mode == "static") {
    allocations += 1;  // the block a static destructor frees after the exit handler
    frees += 1;
  }
  if (mode == "fork") frees += 1;  // the parent's, after the child exited; none of the child's
  EXPECT_EQ(t.allocations, allocations);
  EXPECT_EQ(t.frees, frees);
  EXPECT_EQ(t.live_at_end, allocations - frees);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, CppProgramEnds,
    ::testing::Values(CppMode{"return", "return.trace.gz"}, CppMode{"return", "return.trace"},
                      CppMode{"exit", "exit.trace.gz"}, CppMode{"static", "static.trace.gz"},
                      CppMode{"sigterm", "sigterm.trace.gz"}, CppMode{"fork", "fork.trace.gz"}),
    [](const ::testing::TestParamInfo<CppMode>& param_info) {
      std::string name = std::string(param_info.param.mode) + "_" + param_info.param.file;
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return name;
    });

// _exit runs no handler: what was written out is still a valid trace, in whole lines.
TEST(TraceExit, QuickExitLeavesAReadablePrefix) {
  TempDir dir;
  const std::string trace = dir.file("quick.trace.gz");
  expect_exit_zero(run_recording(TRACE_EXIT_CPP, {"quick-exit", std::to_string(kCount)}, trace));
  const Trace t = read_trace(trace);
  EXPECT_GT(t.allocations, 0u);  // full buffers went out as they filled
  EXPECT_LE(t.allocations, static_cast<std::uint32_t>(kCount));
}

TEST(TraceExit, ThreadedCProgramTraceIsComplete) {
  TempDir dir;
  const std::string trace = dir.file("threads.trace.gz");
  constexpr int kThreads = 4, kPerThread = 10000;
  expect_exit_zero(
      run_recording(TRACE_EXIT_C, {std::to_string(kThreads), std::to_string(kPerThread)}, trace));
  const Trace t = read_trace(trace);
  EXPECT_EQ(t.allocations, static_cast<std::uint32_t>(kThreads * kPerThread));
  EXPECT_EQ(t.frees, static_cast<std::uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(t.host_waits, static_cast<std::uint64_t>(kThreads * (kPerThread / 10)));
  EXPECT_EQ(t.streams, static_cast<std::uint32_t>(kThreads));
  EXPECT_EQ(t.live_at_end, 0u);
}

// A record_trace path that cannot be created: the process-wide allocator still works
// (it once failed every call as INTERNAL), and says on stderr why there is no trace.
TEST(TraceExit, UnwritableRecordTraceLeavesTheAllocatorWorking) {
  TempDir dir;
  const std::string trace = dir.file("no-such-dir/x.trace.gz");
  expect_exit_zero(run_recording(TRACE_EXIT_C, {"2", "100"}, trace));
}

}  // namespace
}  // namespace reservoir::replay
