// Bad-input rows for files and handles (docs/reliability.md): a file that cannot be
// written is RESERVOIR_ERROR_IO / IoError naming the path and the OS reason (once
// INTERNAL, "a bug"), and the allocator keeps working; an oom_snapshot that cannot
// be written is reported in the out-of-memory message; every stream handle a caller
// can pass is served or refused with a status.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "reservoir/allocator.hpp"
#include "reservoir/reservoir.h"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

const bool kSimDevice = [] {
  setenv("RESERVOIR_ALLOC_CONF", "device:sim,sim_capacity:4GiB", 1);
  return true;
}();

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr const char* kNoDir = "/nonexistent-reservoir-dir/out.file";

bool names(const std::string& message, const std::string& what) {
  return message.find(what) != std::string::npos;
}

void expect_allocator_works() {
  void* p = nullptr;
  ASSERT_EQ(reservoir_allocate(&p, 4096, -1, 0), RESERVOIR_OK) << reservoir_last_error();
  EXPECT_EQ(reservoir_free(p), RESERVOIR_OK);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

TEST(IoErrors, StartTraceRecordingToAnUnwritablePath) {
  EXPECT_EQ(reservoir_start_trace_recording(kNoDir), RESERVOIR_ERROR_IO);
  EXPECT_TRUE(names(reservoir_last_error(), kNoDir)) << reservoir_last_error();
  EXPECT_TRUE(names(reservoir_last_error(), "No such file or directory")) << reservoir_last_error();
  EXPECT_STREQ(reservoir_status_name(RESERVOIR_ERROR_IO), "io");
  expect_allocator_works();
  EXPECT_EQ(reservoir_stop_trace_recording(), RESERVOIR_OK);
}

TEST(IoErrors, DumpSnapshotToAnUnwritablePath) {
  EXPECT_EQ(reservoir_dump_snapshot(kNoDir), RESERVOIR_ERROR_IO);
  EXPECT_TRUE(names(reservoir_last_error(), kNoDir)) << reservoir_last_error();
  EXPECT_TRUE(names(reservoir_last_error(), "No such file or directory")) << reservoir_last_error();
  expect_allocator_works();
}

TEST(IoErrors, RecordTraceKeyWithAnUnwritablePath) {
  const std::string conf = std::string("record_trace:") + kNoDir;
  EXPECT_EQ(reservoir_update_config(conf.c_str()), RESERVOIR_ERROR_IO);
  EXPECT_TRUE(names(reservoir_last_error(), kNoDir)) << reservoir_last_error();
  expect_allocator_works();
  EXPECT_EQ(reservoir_update_config("record_trace:"), RESERVOIR_OK);
}

TEST(IoErrors, CppApiThrowsIoErrorWithPathAndReason) {
  Allocator a(std::make_shared<SimBackend>(), Config{});
  try {
    a.start_trace_recording(kNoDir);
    FAIL() << "accepted";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), kNoDir);
    EXPECT_NE(e.os_error(), 0);
    EXPECT_TRUE(names(e.what(), kNoDir)) << e.what();
  }
  try {
    a.dump_snapshot(kNoDir);
    FAIL() << "accepted";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), kNoDir);
  }
  // A record_trace path that cannot be created: the constructor refuses with IoError.
  EXPECT_THROW(Allocator(std::make_shared<SimBackend>(),
                         Config::parse(std::string("record_trace:") + kNoDir)),
               IoError);
  a.deallocate(a.allocate(MiB));
  a.validate();
}

TEST(IoErrors, OomSnapshotFailureIsInTheOutOfMemoryMessage) {
  SimOptions small;
  small.capacity = 64 * MiB;
  Allocator a(std::make_shared<SimBackend>(small),
              Config::parse(std::string("oom_snapshot:") + kNoDir));
  try {
    a.allocate(128 * MiB);
    FAIL() << "no out-of-memory error";
  } catch (const OutOfMemoryError& e) {
    EXPECT_TRUE(names(e.what(), "writing the OOM snapshot to")) << e.what();
    EXPECT_TRUE(names(e.what(), kNoDir)) << e.what();
  }
  a.deallocate(a.allocate(MiB));  // still working
  a.validate();
}

// Every stream value is a handle the allocator serves (streams are opaque to it);
// UINTPTR_MAX once wrapped the stream table's empty-slot marker and crashed in
// StreamPool::allocate.
TEST(StreamHandles, EveryValueIsServedOrRefused) {
  for (std::uintptr_t stream : {std::uintptr_t{0}, std::uintptr_t{1}, std::uintptr_t{0xdeadbeef},
                                UINTPTR_MAX - 1, UINTPTR_MAX, std::uintptr_t{1} << 63}) {
    void* p = nullptr;
    const reservoir_status status = reservoir_allocate(&p, 4 * MiB, -1, stream);
    if (status == RESERVOIR_OK) {
      EXPECT_NE(p, nullptr);
      EXPECT_EQ(reservoir_record_stream(p, UINTPTR_MAX), RESERVOIR_OK);
      EXPECT_EQ(reservoir_notify_host_wait(stream, -1), RESERVOIR_OK);
      EXPECT_EQ(reservoir_free(p), RESERVOIR_OK);
    } else {
      EXPECT_EQ(status, RESERVOIR_ERROR_INVALID_ARGUMENT) << reservoir_last_error();
      EXPECT_EQ(p, nullptr);
    }
  }
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

// The process-wide allocator on the simulated device (no GPU here): a host wait the
// program reports completes the stream's work, so the frees pending on it complete and
// their memory is reused. Before, events recorded on a stream other than the
// allocating one never completed: 50 rounds left 50 segments of 64 MiB, all active.
// The C program host_wait_c does the same through the C API.
TEST(HostWaits, CompleteTheSimulatedDevicesWorkForTheProcessWideAllocator) {
  Allocator& a = Allocator::instance();
  ASSERT_STREQ(a.backend().name(), "sim");
  const StreamHandle s0 = 0x7100, s1 = 0x7101;
  a.empty_cache();
  const DeviceStats before = a.stats(0);
  auto grew = [&](auto field) {
    return (a.stats(0).*field).all().current - (before.*field).all().current;
  };
  for (int i = 0; i < 50; ++i) {
    void* p = a.allocate(64 * MiB, s0, 0);
    a.record_stream(p, s1);
    a.deallocate(p);
    a.notify_host_wait(s1, 0);
    a.notify_host_wait(s0, 0);
  }
  EXPECT_EQ(grew(&DeviceStats::active_bytes), 0);
  EXPECT_EQ(grew(&DeviceStats::reserved_bytes), static_cast<std::int64_t>(64 * MiB));
  // A wait for the using stream alone completes the free, which waits in the
  // allocating stream's pool.
  void* p = a.allocate(64 * MiB, s0, 0);
  a.record_stream(p, s1);
  a.deallocate(p);
  EXPECT_EQ(grew(&DeviceStats::active_bytes), static_cast<std::int64_t>(64 * MiB));
  a.notify_host_wait(s1, 0);
  EXPECT_EQ(grew(&DeviceStats::active_bytes), 0);
  a.validate();
}

TEST(StreamHandles, NotifyHostWaitReleasesBlocksUsedOnThatStream) {
  void* p = nullptr;
  ASSERT_EQ(reservoir_allocate(&p, 4 * MiB, 0, 1), RESERVOIR_OK);
  ASSERT_EQ(reservoir_record_stream(p, 2), RESERVOIR_OK);
  ASSERT_EQ(reservoir_free(p), RESERVOIR_OK);
  EXPECT_EQ(reservoir_notify_host_wait(2, 0), RESERVOIR_OK);
  EXPECT_EQ(reservoir_notify_host_wait(2, 7), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(names(reservoir_last_error(), "device 7")) << reservoir_last_error();
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

// A fork while another thread is inside a recording layer (its lock held, waiting on
// the device) must not leave the child a lock that nobody will release: the fork
// waits for the layer, and the child's allocations proceed.
TEST(IoErrors, ForkWhileRecordingLeavesTheChildUsable) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config{});
  const std::string path = ::testing::TempDir() + "fork_while_recording.trace";
  a.start_trace_recording(path);
  std::promise<void> inside, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> first{true};
  sim->set_allocate_hook([&] {
    if (first.exchange(false)) {
      inside.set_value();
      released.wait();
    }
  });
  std::thread holder([&] { a.deallocate(a.allocate(64 * MiB, 1, 0)); });
  inside.get_future().wait();  // the holder is inside the layer, its lock held
  std::atomic<pid_t> child{-1};
  std::thread forker([&] {
    child = ::fork();
    if (child == 0) {  // the child: allocate and exit; a held lock would hang here
      void* p = a.allocate(4096, 2, 0);
      a.deallocate(p);
      std::_Exit(0);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  release.set_value();  // the fork could not proceed before the holder left the layer
  forker.join();
  holder.join();
  ASSERT_GT(child.load(), 0);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 500 && done == 0; ++i) {
    done = ::waitpid(child, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL() << "the fork child hung on an inherited recording lock";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  a.stop_trace_recording();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace reservoir
