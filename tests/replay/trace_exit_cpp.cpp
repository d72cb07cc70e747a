// A C++ program that records a trace through Allocator::instance() (the
// process-wide allocator, record_trace from RESERVOIR_ALLOC_CONF) and then ends in
// one of several ways; trace_exit_test.cpp checks the file it leaves.
//
//   trace_exit_cpp MODE COUNT
//     return       COUNT allocations, all but every 64th freed at once (few live
//                  blocks: cheap under the full-check validator), return from main
//     exit         the same, then std::exit(0) from a nested call
//     static       the same, plus a block freed by a static destructor that runs
//                  after the exit handler (it must still be recorded)
//     sigterm      the same, then raise(SIGTERM): killed, the trace still complete
//     fork         the same; a fork child allocates and calls exit(0) (running the
//                  exit handlers in the child), the parent waits, frees one more
//     quick-exit   the same, then _exit(0): no handler runs; the file must still be
//                  a readable trace (its header, at least)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"

namespace {

// Constructed before the allocator (first use below), so destroyed after the
// allocator's trace file was written out at exit.
struct FreesAtStaticDestruction {
  void* block = nullptr;
  ~FreesAtStaticDestruction() {
    if (block != nullptr) reservoir::Allocator::instance().deallocate(block);
  }
};
FreesAtStaticDestruction g_late;

std::vector<void*> run(int count) {
  reservoir::Allocator& a = reservoir::Allocator::instance();
  std::vector<void*> kept;
  for (int i = 0; i < count; ++i) {
    void* p = a.allocate(static_cast<std::size_t>(512 + 64 * i), /*stream=*/0);
    if (i % 64 != 0)
      a.deallocate(p);
    else
      kept.push_back(p);
  }
  return kept;
}

[[noreturn]] void exit_from_nested_call() {
  std::exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: trace_exit_cpp MODE COUNT\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int count = std::atoi(argv[2]);
  if (mode == "static") g_late.block = reservoir::Allocator::instance().allocate(4096);
  std::vector<void*> kept = run(count);
  if (mode == "return" || mode == "static") return 0;
  if (mode == "exit") exit_from_nested_call();
  if (mode == "sigterm") {
    raise(SIGTERM);
    std::fprintf(stderr, "SIGTERM did not end the process\n");
    return 3;
  }
  if (mode == "fork") {
    const pid_t child = fork();
    if (child == 0) {
      // Not recorded, and must not write into the parent's file.
      void* p = reservoir::Allocator::instance().allocate(1 << 20);
      reservoir::Allocator::instance().deallocate(p);
      std::exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 4;
    reservoir::Allocator::instance().deallocate(kept.back());
    return 0;
  }
  if (mode == "quick-exit") _exit(0);
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
