// Sharing blocks between processes through the Allocator (docs/ipc.md), on the
// simulated device: two allocators over two simulated devices of one process stand
// for two processes (their memory is shared memory, so each sees the other's writes),
// and a forked child opens the parent's blocks for real, its handles passed over a
// Unix socket with their descriptors.
#include "reservoir/ipc.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::shared_ptr<SimBackend> shared_device() {
  SimOptions o;
  o.capacity = std::size_t{1} << 30;
  o.host_backed = true;
  o.shared_memory = true;
  return std::make_shared<SimBackend>(o);
}

struct Side {
  std::shared_ptr<SimBackend> sim = shared_device();
  std::unique_ptr<Allocator> alloc;
  explicit Side(const char* config = "")
      : alloc(std::make_unique<Allocator>(sim, Config::parse(config))) {}
};

// A handle through a socket pair, as between two processes.
SharedHandle through_socket(const SharedHandle& h) {
  int sv[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  send_shared(sv[0], h);
  SharedHandle out = receive_shared(sv[1]);
  close(sv[0]);
  close(sv[1]);
  return out;
}

class Ipc : public ::testing::TestWithParam<const char*> {};

TEST_P(Ipc, EachSideSeesTheOthersWrites) {
  Side owner(GetParam()), receiver;
  char* p = static_cast<char*>(owner.alloc->allocate(30 * MiB, 0x1));
  std::memset(p, 0x61, 30 * MiB);
  SharedHandle h = owner.alloc->share(p);
  const bool expandable = owner.alloc->config().expandable_segments;
  EXPECT_EQ(h.fds().empty(), !expandable);  // expandable pages travel as descriptors
  SharedHandle got = through_socket(h);
  EXPECT_EQ(got.bytes(), h.bytes());
  EXPECT_EQ(got.fds().size(), h.fds().size());
  char* q = static_cast<char*>(receiver.alloc->open(got));
  ASSERT_NE(q, nullptr);
  EXPECT_NE(q, p);
  EXPECT_EQ(q[0], 0x61);
  EXPECT_EQ(q[30 * MiB - 1], 0x61);
  std::memset(q + MiB, 0x62, MiB);
  EXPECT_EQ(p[MiB], 0x62);
  EXPECT_EQ(p[2 * MiB - 1], 0x62);
  EXPECT_TRUE(receiver.sim->can_reach(0, q, 30 * MiB));
  receiver.alloc->close(q);
  owner.alloc->deallocate(p);
}

TEST_P(Ipc, RepeatedOpensShareOneMapping) {
  Side owner(GetParam()), receiver;
  void* p = owner.alloc->allocate(4 * MiB, 0x1);
  void* q1 = receiver.alloc->open(through_socket(owner.alloc->share(p)));
  void* q2 = receiver.alloc->open(through_socket(owner.alloc->share(p)));  // a new share
  void* q3 = receiver.alloc->open(owner.alloc->share(p));
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(q2, q3);
  const SimCounters c = receiver.sim->counters();
  EXPECT_EQ(c.ipc_opens + c.reservations, 1u) << "one mapping for three opens";
  receiver.alloc->close(q1);
  receiver.alloc->close(q2);
  EXPECT_EQ(receiver.sim->counters().ipc_closes + receiver.sim->counters().unmaps, 0u);
  receiver.alloc->close(q3);  // the last one unmaps
  EXPECT_EQ(receiver.sim->open_ipc_mappings(), 0u);
  EXPECT_EQ(receiver.sim->live_reservations(0), 0u);
  EXPECT_THROW(receiver.alloc->close(q3), InvalidPointerError);
  owner.alloc->deallocate(p);
}

INSTANTIATE_TEST_SUITE_P(Segments, Ipc, ::testing::Values("", "expandable_segments:True"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           return std::string(param.param).empty() ? "ordinary" : "expandable";
                         });

TEST(IpcSegments, BlocksOfOneSegmentMapItOnce) {
  Side owner, receiver;
  void* a = owner.alloc->allocate(4096, 0x1);  // both in one 2 MiB segment
  void* b = owner.alloc->allocate(8192, 0x1);
  char* qa = static_cast<char*>(receiver.alloc->open(owner.alloc->share(a)));
  char* qb = static_cast<char*>(receiver.alloc->open(owner.alloc->share(b)));
  EXPECT_EQ(qb - qa, static_cast<char*>(b) - static_cast<char*>(a));  // same layout
  EXPECT_EQ(receiver.sim->counters().ipc_opens, 1u);
  receiver.alloc->close(qa);
  receiver.alloc->close(qb);
  EXPECT_EQ(receiver.sim->open_ipc_mappings(), 0u);
  owner.alloc->deallocate(a);
  owner.alloc->deallocate(b);
}

TEST(IpcSegments, OpeningInTheSharingProcessReturnsTheOriginalPointer) {
  Side owner;
  void* p = owner.alloc->allocate(MiB, 0x1);
  SharedHandle h = owner.alloc->share(p);
  EXPECT_EQ(owner.alloc->open(h), p);
  EXPECT_EQ(owner.alloc->open(h), p);
  EXPECT_EQ(owner.sim->counters().ipc_opens, 0u);  // nothing mapped
  owner.alloc->close(p);
  owner.alloc->close(p);
  EXPECT_THROW(owner.alloc->close(p), InvalidPointerError);
  owner.alloc->deallocate(p);
}

TEST(IpcSegments, KeepHoldsTheBlockBackUntilUnshare) {
  Side owner;
  void* p = owner.alloc->allocate(8 * MiB, 0x1);
  SharedHandle h = owner.alloc->share(p, true);
  owner.alloc->deallocate(p);  // held back: receivers may still use it
  EXPECT_EQ(owner.alloc->stats(0).allocated_bytes.all().current,
            static_cast<std::int64_t>(8 * MiB));
  void* q = owner.alloc->allocate(8 * MiB, 0x1);
  EXPECT_NE(q, p) << "a kept block was reused";
  EXPECT_THROW(owner.alloc->deallocate(p), InvalidPointerError);  // twice
  owner.alloc->unshare(p);                                        // freed now
  EXPECT_EQ(owner.alloc->stats(0).allocated_bytes.all().current,
            static_cast<std::int64_t>(8 * MiB));
  EXPECT_THROW(owner.alloc->unshare(p), InvalidPointerError);
  // Without keep, unshare has nothing to end; the owner frees as usual.
  void* r = owner.alloc->allocate(MiB, 0x1);
  SharedHandle plain = owner.alloc->share(r);
  EXPECT_THROW(owner.alloc->unshare(r), InvalidPointerError);
  owner.alloc->deallocate(r);
  // Kept but not yet freed: unshare only ends keep.
  void* s = owner.alloc->allocate(MiB, 0x1);
  SharedHandle kept = owner.alloc->share(s, true);
  owner.alloc->unshare(s);
  owner.alloc->deallocate(s);
  owner.alloc->deallocate(q);
  EXPECT_EQ(owner.alloc->stats(0).allocated_bytes.all().current, 0);
  owner.alloc->validate();
}

TEST(IpcSegments, RefusalsSayWhy) {
  Side owner, receiver;
  void* p = owner.alloc->allocate(MiB, 0x1);
  EXPECT_THROW(owner.alloc->share(static_cast<char*>(p) + 512), InvalidPointerError);
  EXPECT_THROW(owner.alloc->share(reinterpret_cast<void*>(0x1000)), InvalidPointerError);
  SharedHandle h = owner.alloc->share(p);
  std::string newer = h.bytes();
  newer[4] = 9;  // a format version from the future
  try {
    receiver.alloc->open(SharedHandle(newer, {}));
    FAIL() << "a handle of a newer format was opened";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("format version 9"), std::string::npos) << e.what();
  }
  EXPECT_THROW(receiver.alloc->open(SharedHandle("nonsense", {})), InvalidArgumentError);
  EXPECT_THROW(receiver.alloc->open(h, 5), InvalidArgumentError);  // no device 5
  owner.alloc->deallocate(p);
  Side expandable("expandable_segments:True");
  void* e = expandable.alloc->allocate(MiB, 0x1);
  SharedHandle pages = expandable.alloc->share(e);
  // The bytes alone (descriptors lost on the way): refused before any device call.
  EXPECT_THROW(receiver.alloc->open(SharedHandle(pages.bytes(), {})), InvalidArgumentError);
  expandable.alloc->deallocate(e);
}

TEST(IpcSegments, PrivateHostMemoryCannotBeShared) {
  SimOptions o;
  o.capacity = std::size_t{1} << 30;
  o.host_backed = true;  // private memory: no IPC
  Allocator a(std::make_shared<SimBackend>(o), Config{});
  void* p = a.allocate(MiB, 0x1);
  EXPECT_THROW(a.share(p), InvalidArgumentError);
  a.deallocate(p);
}

// The real thing: a child process (forked, so it reaches the parent's simulated
// memory) receives an ordinary and an expandable block over a socket, checks the
// parent's bytes and writes its own.
TEST(IpcProcesses, AChildOpensBothKindsOfBlockAndTheParentSeesItsWrites) {
  Side ordinary, expandable("expandable_segments:True");
  char* a = static_cast<char*>(ordinary.alloc->allocate(6 * MiB, 0x1));
  char* b = static_cast<char*>(expandable.alloc->allocate(26 * MiB, 0x1));
  std::memset(a, 0x0a, 6 * MiB);
  std::memset(b, 0x0b, 26 * MiB);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(sv[0]);
    int code = 0;
    try {
      Side mine;
      for (int i = 0; i < 2 && code == 0; ++i) {
        SharedHandle h = receive_shared(sv[1]);
        const std::size_t size = i == 0 ? 6 * MiB : 26 * MiB;
        const char want = i == 0 ? 0x0a : 0x0b;
        char* q = static_cast<char*>(mine.alloc->open(h));
        if (q[0] != want || q[size - 1] != want) code = 10 + i;
        std::memset(q, 0x40 + i, size);
        mine.alloc->close(q);
      }
    } catch (const std::exception&) {
      code = 20;
    }
    close(sv[1]);
    _exit(code);
  }
  close(sv[1]);
  send_shared(sv[0], ordinary.alloc->share(a));
  send_shared(sv[0], expandable.alloc->share(b));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  close(sv[0]);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(a[0], 0x40);
  EXPECT_EQ(a[6 * MiB - 1], 0x40);
  EXPECT_EQ(b[0], 0x41);
  EXPECT_EQ(b[26 * MiB - 1], 0x41);
  ordinary.alloc->deallocate(a);
  expandable.alloc->deallocate(b);
}

// The processes using the device in the OOM report (after
// PyTorch's first sentences) and in the summary, or why the list is unavailable (no
// NVML; here the simulated device refuses the call).
TEST(IpcProcessMemory, TheOomReportListsOtherProcessesOrSaysWhyNot) {
  SimOptions o;
  o.capacity = std::size_t{1} << 30;
  auto sim = std::make_shared<SimBackend>(o);
  sim->set_other_processes(0, {{4242, 300 * MiB}});
  Allocator a(sim, Config{});
  void* held = a.allocate(64 * MiB, 0x1);
  auto oom_message = [&] {
    try {
      a.allocate(std::size_t{2} << 30, 0x1);
    } catch (const OutOfMemoryError& e) {
      return std::string(e.what());
    }
    return std::string("no OutOfMemoryError");
  };
  std::string m = oom_message();
  const std::size_t free_at = m.find(" is free. ");
  const std::size_t other_at = m.find("Process 4242 has 300.00 MiB memory in use. ");
  const std::size_t self_at = m.find("Including non-PyTorch memory, this process has ");
  ASSERT_NE(other_at, std::string::npos) << m;
  ASSERT_NE(self_at, std::string::npos) << m;
  EXPECT_LT(free_at, other_at) << m;
  EXPECT_LT(other_at, self_at) << m;  // this process last, as in PyTorch's wording
  std::string summary = a.summary(0);
  EXPECT_NE(summary.find("process 4242: 300.00 MiB"), std::string::npos) << summary;
  EXPECT_NE(summary.find("(this process, including non-Reservoir memory)"), std::string::npos)
      << summary;

  sim->fail_operation(SimOp::process_memory, DeviceStatus::unsupported);
  m = oom_message();
  EXPECT_NE(m.find("The list of processes using GPU 0 is unavailable (sim: injected"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("Process 4242"), std::string::npos) << m;
  summary = a.summary(0);
  EXPECT_NE(summary.find("the list of processes is unavailable"), std::string::npos) << summary;
  sim->clear_faults();
  a.deallocate(held);
}

TEST(IpcSocket, MalformedStreamsAreRefused) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ASSERT_EQ(write(sv[0], "not a handle", 12), 12);
  EXPECT_THROW(receive_shared(sv[1]), IoError);
  close(sv[0]);
  EXPECT_THROW(receive_shared(sv[1]), IoError);  // closed
  close(sv[1]);
  // Many descriptors travel in batches.
  std::vector<int> fds;
  for (int i = 0; i < 450; ++i) fds.push_back(dup(0));
  SharedHandle many("bytes", std::move(fds));
  SharedHandle got = through_socket(many);
  EXPECT_EQ(got.fds().size(), 450u);
  EXPECT_EQ(got.bytes(), "bytes");
}

}  // namespace
}  // namespace reservoir
