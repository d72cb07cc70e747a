// SimBackend: the simulated device every CPU test of the engine runs on.
#include "reservoir/sim_backend.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/sim/address_space.hpp"
#include "backend/sim/placement.hpp"
#include "reservoir/errors.hpp"

namespace reservoir {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr DeviceStatus kOk = DeviceStatus::ok;
constexpr DeviceStatus kOom = DeviceStatus::out_of_memory;
constexpr DeviceStatus kError = DeviceStatus::error;
constexpr DeviceStatus kNotReady = DeviceStatus::not_ready;

std::uintptr_t addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}
void* at(void* p, std::size_t offset) {
  return static_cast<char*>(p) + offset;
}

SimOptions small(std::size_t capacity = 64 * MiB) {
  SimOptions o;
  o.capacity = capacity;
  return o;
}

void* alloc(SimBackend& sim, std::size_t size, int device = 0) {
  void* p = nullptr;
  EXPECT_EQ(sim.allocate(device, size, &p), kOk) << sim.last_error();
  return p;
}

// ---- Devices ------------------------------------------------------------------------

TEST(SimBackend, DescribesItself) {
  SimBackend sim(small());
  EXPECT_STREQ(sim.name(), "sim");
  EXPECT_TRUE(sim.has(kVirtualMemory));
  EXPECT_TRUE(sim.has(kPeerAccess));
  // Synthetic memory can be "shared" (no data); pools and the process list are modelled.
  EXPECT_TRUE(sim.has(kIpc));
  EXPECT_TRUE(sim.has(kShareablePosixFd));
  EXPECT_FALSE(sim.has(kShareableFabric));
  EXPECT_TRUE(sim.has(kStreamOrderedPool));
  EXPECT_TRUE(sim.has(kProcessMemory));
  int count = -1;
  EXPECT_EQ(sim.device_count(&count), kOk);
  EXPECT_EQ(count, 1);
  MemoryInfo info;
  EXPECT_EQ(sim.memory_info(0, &info), kOk);
  EXPECT_EQ(info.total, 64 * MiB);
  EXPECT_EQ(info.free, 64 * MiB);
  alloc(sim, 3 * MiB);
  EXPECT_EQ(sim.memory_info(0, &info), kOk);
  EXPECT_EQ(info.free, 61 * MiB);
}

TEST(SimBackend, WithoutVirtualMemoryTheCallsAreUnsupported) {
  SimOptions o = small();
  o.virtual_memory = false;
  SimBackend sim(o);
  EXPECT_FALSE(sim.has(kVirtualMemory));
  std::size_t g = 0;
  EXPECT_EQ(sim.granularity(0, &g), DeviceStatus::unsupported);
  void* p = nullptr;
  EXPECT_EQ(sim.reserve_address_range(0, 2 * MiB, 0, &p), DeviceStatus::unsupported);
}

TEST(SimBackend, RejectsBadOptions) {
  SimOptions o = small();
  o.granularity = 3 * MiB;
  EXPECT_THROW(SimBackend{o}, InvalidArgumentError);
  o = small();
  o.device_count = -1;
  EXPECT_THROW(SimBackend{o}, InvalidArgumentError);
}

TEST(SimBackend, CurrentDeviceIsPerThread) {
  SimOptions o = small();
  o.device_count = 2;
  SimBackend sim(o);
  int device = -1;
  EXPECT_EQ(sim.current_device(&device), kOk);
  EXPECT_EQ(device, 0);
  sim.set_current_device(1);
  EXPECT_EQ(sim.current_device(&device), kOk);
  EXPECT_EQ(device, 1);
  std::thread([&] {
    int other = -1;
    EXPECT_EQ(sim.current_device(&other), kOk);
    EXPECT_EQ(other, 0);
  }).join();
  EXPECT_THROW(sim.set_current_device(2), InvalidArgumentError);
  EXPECT_EQ(sim.current_device(&device), kOk);
  EXPECT_EQ(device, 1);
  SimBackend fresh(o);  // another backend has its own current device
  EXPECT_EQ(fresh.current_device(&device), kOk);
  EXPECT_EQ(device, 0);
}

TEST(SimBackend, InvalidDeviceIsAnErrorEverywhere) {
  SimBackend sim(small());
  const std::string message = "sim: device 3 does not exist (device_count 1)";
  void* p = nullptr;
  MemoryInfo info;
  EventHandle e = 0;
  std::size_t g = 0;
  PhysicalHandle h = 0;
  bool can = false;
  int zero = 0;
  const DeviceStatus answers[] = {
      sim.memory_info(3, &info),
      sim.allocate(3, 512, &p),
      sim.deallocate(3, p, 512),
      sim.create_event(3, &e),
      sim.destroy_event(3, e),
      sim.record_event(3, e, 0),
      sim.query_event(3, e),
      sim.synchronize_event(3, e),
      sim.stream_wait_event(3, 0, e),
      sim.synchronize_stream(3, 0),
      sim.synchronize_device(3),
      sim.granularity(3, &g),
      sim.reserve_address_range(3, 2 * MiB, 0, &p),
      sim.release_address_range(3, p, 2 * MiB),
      sim.create_physical(3, 2 * MiB, &h),
      sim.release_physical(3, h),
      sim.map(3, p, 2 * MiB, h),
      sim.unmap(3, p, 2 * MiB),
      sim.set_access(3, p, 2 * MiB, &zero, 1),
      sim.can_access_peer(3, 0, &can),
      sim.enable_peer_access(0, 3),
      sim.allocate_host(3, 512, &p),
      sim.free_host(3, p),
      sim.copy_to_host(3, &zero, p, sizeof zero),
      sim.copy_to_device(3, p, &zero, sizeof zero),
  };
  for (DeviceStatus answer : answers) EXPECT_EQ(answer, kError);
  EXPECT_EQ(sim.last_error(), message);
  EXPECT_EQ(sim.allocate(-1, 512, &p), kError);
  EXPECT_EQ(sim.last_error(), "sim: device -1 does not exist (device_count 1)");
  EXPECT_EQ(sim.used(0), 0u);
  EXPECT_THROW(sim.capacity(1), InvalidArgumentError);
  EXPECT_THROW(sim.set_capacity(1, 0), InvalidArgumentError);
  EXPECT_THROW(sim.used(-1), InvalidArgumentError);
  EXPECT_THROW(sim.live_segments(5), InvalidArgumentError);
}

TEST(SimBackend, PeerAccessBetweenDistinctDevices) {
  SimOptions o = small();
  o.device_count = 2;
  SimBackend sim(o);
  bool can = false;
  EXPECT_EQ(sim.can_access_peer(0, 1, &can), kOk);
  EXPECT_TRUE(can);
  EXPECT_EQ(sim.can_access_peer(1, 1, &can), kOk);
  EXPECT_FALSE(can);
  EXPECT_EQ(sim.enable_peer_access(0, 1), kOk);
  EXPECT_EQ(sim.enable_peer_access(0, 1), kOk);
  EXPECT_EQ(sim.enable_peer_access(1, 1), kError);
}

// ---- Segments -----------------------------------------------------------------------

TEST(SimBackend, Alignment512AndTwoMiBFromTwoMiB) {
  SimBackend sim(small());
  for (std::size_t size : {std::size_t{1}, std::size_t{513}, std::size_t{1000}, 2 * MiB - 1}) {
    void* p = alloc(sim, size);
    EXPECT_EQ(addr(p) % 512, 0u) << size;
  }
  for (std::size_t size : {2 * MiB, 2 * MiB + 1, 5 * MiB + 512}) {
    void* p = alloc(sim, size);
    EXPECT_EQ(addr(p) % (2 * MiB), 0u) << size;
  }
}

TEST(SimBackend, FreedRangesAreReusedAndMerged) {
  SimBackend sim(small());
  void* a = alloc(sim, 4 * KiB);
  void* b = alloc(sim, 4 * KiB);
  void* c = alloc(sim, 4 * KiB);
  EXPECT_EQ(addr(b), addr(a) + 4 * KiB);
  EXPECT_EQ(addr(c), addr(b) + 4 * KiB);
  EXPECT_EQ(sim.deallocate(0, a, 4 * KiB), kOk);
  EXPECT_EQ(alloc(sim, 4 * KiB), a);  // same size: same place
  EXPECT_EQ(sim.deallocate(0, a, 4 * KiB), kOk);
  EXPECT_EQ(sim.deallocate(0, b, 4 * KiB), kOk);
  EXPECT_EQ(alloc(sim, 8 * KiB), a);  // fits only because a and b merged
  EXPECT_EQ(sim.live_segments(0), 2u);
}

TEST(SimBackend, RandomAllocationsNeverOverlap) {
  SimBackend sim(small(256 * MiB));
  std::mt19937_64 rng(20240611);
  std::map<std::uintptr_t, std::size_t> live;
  std::size_t used = 0, ooms = 0;
  for (int step = 0; step < 4000; ++step) {
    if (!live.empty() && rng() % 5 < 2) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_EQ(sim.deallocate(0, reinterpret_cast<void*>(it->first), it->second), kOk);
      used -= it->second;
      live.erase(it);
      continue;
    }
    const std::size_t size = rng() % 4 == 0 ? 1 + rng() % (12 * MiB) : 1 + rng() % (64 * KiB);
    void* p = nullptr;
    const DeviceStatus status = sim.allocate(0, size, &p);
    if (used + size > 256 * MiB) {
      ASSERT_EQ(status, kOom);
      ++ooms;
      continue;
    }
    ASSERT_EQ(status, kOk) << sim.last_error();
    const std::uintptr_t start = addr(p);
    ASSERT_EQ(start % (size >= 2 * MiB ? 2 * MiB : 512), 0u);
    auto next = live.lower_bound(start);
    if (next != live.end()) {
      ASSERT_LE(start + size, next->first);
    }
    if (next != live.begin()) {
      auto prev = std::prev(next);
      ASSERT_LE(prev->first + prev->second, start);
    }
    live.emplace(start, size);
    used += size;
    ASSERT_EQ(sim.used(0), used);
  }
  EXPECT_GT(ooms, 0u);  // the capacity was reached along the way
  EXPECT_EQ(sim.live_segments(0), live.size());
}

TEST(SimBackend, SegmentsOfDevicesDoNotOverlap) {
  SimOptions o = small();
  o.device_count = 2;
  SimBackend sim(o);
  void* a = alloc(sim, 8 * MiB, 0);
  void* b = alloc(sim, 8 * MiB, 1);
  EXPECT_TRUE(addr(a) + 8 * MiB <= addr(b) || addr(b) + 8 * MiB <= addr(a));
  EXPECT_EQ(sim.used(0), 8 * MiB);
  EXPECT_EQ(sim.used(1), 8 * MiB);
  EXPECT_EQ(sim.deallocate(1, a, 8 * MiB), kError);  // a belongs to device 0
}

TEST(SimBackend, CapacityExhaustionIsOutOfMemory) {
  SimBackend sim(small(4 * MiB));
  void* p = alloc(sim, 4 * MiB);
  void* q = nullptr;
  EXPECT_EQ(sim.allocate(0, 512, &q), kOom);
  EXPECT_EQ(q, nullptr);
  EXPECT_EQ(sim.counters().failed_allocs, 1u);
  EXPECT_EQ(sim.deallocate(0, p, 4 * MiB), kOk);
  EXPECT_EQ(sim.allocate(0, 512, &q), kOk);
}

TEST(SimBackend, CapacityMayBeLoweredBelowUse) {
  SimBackend sim(small(8 * MiB));
  void* p = alloc(sim, 4 * MiB);
  sim.set_capacity(0, 2 * MiB);
  EXPECT_EQ(sim.capacity(0), 2 * MiB);
  MemoryInfo info;
  EXPECT_EQ(sim.memory_info(0, &info), kOk);
  EXPECT_EQ(info.free, 0u);
  EXPECT_EQ(info.total, 2 * MiB);
  void* q = nullptr;
  EXPECT_EQ(sim.allocate(0, 512, &q), kOom);
  EXPECT_EQ(sim.deallocate(0, p, 4 * MiB), kOk);
  EXPECT_EQ(sim.allocate(0, 2 * MiB, &q), kOk);
}

TEST(SimBackend, BadDeallocationIsAnErrorNamingThePointer) {
  SimBackend sim(small());
  void* p = alloc(sim, 4 * KiB);
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(addr(p) + 512));
  EXPECT_EQ(sim.deallocate(0, at(p, 512), 4 * KiB), kError);
  EXPECT_NE(sim.last_error().find(text), std::string::npos) << sim.last_error();
  EXPECT_EQ(sim.deallocate(0, p, 2 * KiB), kError);  // wrong size
  EXPECT_NE(sim.last_error().find("4096 bytes"), std::string::npos) << sim.last_error();
  EXPECT_EQ(sim.live_segments(0), 1u);
  EXPECT_EQ(sim.used(0), 4 * KiB);
  EXPECT_EQ(sim.deallocate(0, p, 4 * KiB), kOk);
  EXPECT_EQ(sim.deallocate(0, p, 4 * KiB), kError);  // twice
}

TEST(SimBackend, HostBackedMemoryIsWritable) {
  SimOptions o = small(64 * MiB);
  o.host_backed = true;
  SimBackend sim(o);
  const std::size_t big_size = 3 * MiB + 100;
  void* big = alloc(sim, big_size);
  void* x = alloc(sim, 3000);
  void* a = alloc(sim, 6000);  // shares its first page with x, its last with b
  void* b = alloc(sim, 1000);
  ASSERT_EQ(addr(a), addr(x) + 3072);  // small sizes pack at 512 bytes
  ASSERT_EQ(addr(b), addr(a) + 6144);
  std::memset(big, 0x5a, big_size);
  std::memset(x, 0x11, 3000);
  std::memset(a, 0xaa, 6000);
  std::memset(b, 0xbb, 1000);
  const auto* bytes = static_cast<const unsigned char*>(big);
  for (std::size_t i = 0; i < big_size; i += 4093) ASSERT_EQ(bytes[i], 0x5a);
  EXPECT_EQ(sim.deallocate(0, a, 6000), kOk);
  // Freeing a must not discard the pages it shares with its live neighbours.
  const auto* before = static_cast<const unsigned char*>(x);
  for (std::size_t i = 0; i < 3000; ++i) ASSERT_EQ(before[i], 0x11) << i;
  const auto* kept = static_cast<const unsigned char*>(b);
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(kept[i], 0xbb) << i;
  EXPECT_EQ(sim.deallocate(0, big, big_size), kOk);
  void* again = alloc(sim, big_size);
  EXPECT_EQ(again, big);
  EXPECT_EQ(static_cast<const unsigned char*>(again)[0], 0);  // pages were discarded
}

// ---- Fault injection ----------------------------------------------------------------

TEST(SimFaults, NthAllocationFailsOnce) {
  SimBackend sim(small());
  sim.fail_allocation_number(2);
  void* p = nullptr;
  EXPECT_EQ(sim.allocate(0, 512, &p), kOk);
  EXPECT_EQ(sim.allocate(0, 512, &p), kOom);
  EXPECT_EQ(sim.allocate(0, 512, &p), kOk);
  EXPECT_EQ(sim.live_segments(0), 2u);
  EXPECT_EQ(sim.used(0), 1024u);
  EXPECT_EQ(sim.counters().failed_allocs, 1u);
  EXPECT_EQ(sim.counters().allocs, 2u);
}

TEST(SimFaults, AllocationsAboveASizeFailUntilCleared) {
  SimBackend sim(small());
  sim.fail_allocations_above(MiB);
  void* p = nullptr;
  EXPECT_EQ(sim.allocate(0, MiB, &p), kOk);
  EXPECT_EQ(sim.allocate(0, MiB + 1, &p), kOom);
  EXPECT_EQ(sim.allocate(0, 4 * MiB, &p), kOom);
  EXPECT_EQ(sim.counters().failed_allocs, 2u);
  EXPECT_EQ(sim.used(0), MiB);
  sim.clear_faults();
  EXPECT_EQ(sim.allocate(0, 4 * MiB, &p), kOk);
}

TEST(SimFaults, PersistentQueryError) {
  SimBackend sim(small());
  EventHandle e = 0;
  ASSERT_EQ(sim.create_event(0, &e), kOk);
  sim.fail_operation(SimOp::query_event, kError);
  EXPECT_EQ(sim.query_event(0, e), kError);
  EXPECT_EQ(sim.last_error(), "sim: injected error in query_event");
  EXPECT_EQ(sim.query_event(0, e), kError);
  sim.clear_faults();
  EXPECT_EQ(sim.query_event(0, e), kOk);
}

TEST(SimFaults, NumberedOperationFailsOnceAndChangesNothing) {
  SimBackend sim(small());
  void* p = alloc(sim, 4 * KiB);
  sim.fail_operation_number(SimOp::deallocate, 1, kError);
  EXPECT_EQ(sim.deallocate(0, p, 4 * KiB), kError);
  EXPECT_EQ(sim.last_error(), "sim: injected error in deallocate");
  EXPECT_EQ(sim.live_segments(0), 1u);
  EXPECT_EQ(sim.counters().frees, 0u);
  EXPECT_EQ(sim.deallocate(0, p, 4 * KiB), kOk);

  EventHandle e = 0;
  ASSERT_EQ(sim.create_event(0, &e), kOk);
  sim.fail_operation_number(SimOp::record_event, 2, kError);
  EXPECT_EQ(sim.record_event(0, e, 1), kOk);
  sim.advance(1);
  EXPECT_EQ(sim.record_event(0, e, 1), kError);
  EXPECT_EQ(sim.query_event(0, e), kOk);  // still the completed first recording
  EXPECT_EQ(sim.pending_events(1), 0u);
  EXPECT_EQ(sim.record_event(0, e, 1), kOk);
  EXPECT_EQ(sim.query_event(0, e), kNotReady);
}

TEST(SimFaults, AnyOperationCanBeMadeToFail) {
  SimBackend sim(small(8 * MiB));
  sim.fail_operation(SimOp::allocate, kError);
  void* p = nullptr;
  EXPECT_EQ(sim.allocate(0, 512, &p), kError);
  EXPECT_EQ(sim.last_error(), "sim: injected error in allocate");
  EXPECT_EQ(sim.counters().failed_allocs, 0u);  // an error is not an out-of-memory
  sim.fail_operation(SimOp::allocate, kOk);     // stops it
  EXPECT_EQ(sim.allocate(0, 512, &p), kOk);
  sim.fail_operation(SimOp::create_physical, kOom);
  PhysicalHandle h = 0;
  EXPECT_EQ(sim.create_physical(0, 2 * MiB, &h), kOom);
  EXPECT_EQ(sim.counters().failed_allocs, 1u);
  EXPECT_EQ(sim.used(0), 512u);
  sim.fail_operation(SimOp::reserve_address_range, kError);
  EXPECT_EQ(sim.reserve_address_range(0, 2 * MiB, 0, &p), kError);
  EXPECT_EQ(sim.last_error(), "sim: injected error in reserve_address_range");
  sim.clear_faults();
  EXPECT_EQ(sim.create_physical(0, 2 * MiB, &h), kOk);
}

// Cleanup calls fail like any other, and leave the state as it was.
TEST(SimFaults, CleanupCallsCanBeMadeToFail) {
  SimBackend sim(small(16 * MiB));
  void* r = nullptr;
  PhysicalHandle h = 0;
  ASSERT_EQ(sim.reserve_address_range(0, 4 * MiB, 0, &r), kOk);
  ASSERT_EQ(sim.create_physical(0, 2 * MiB, &h), kOk);
  sim.fail_operation(SimOp::release_physical, kError);
  sim.fail_operation(SimOp::release_address_range, kError);
  sim.fail_operation(SimOp::synchronize_stream, kError);
  EXPECT_EQ(sim.release_physical(0, h), kError);
  EXPECT_EQ(sim.last_error(), "sim: injected error in release_physical");
  EXPECT_EQ(sim.release_address_range(0, r, 4 * MiB), kError);
  EXPECT_EQ(sim.synchronize_stream(0, 1), kError);
  EXPECT_EQ(sim.used(0), 2 * MiB);
  EXPECT_EQ(sim.live_reservations(0), 1u);
  sim.clear_faults();
  EXPECT_EQ(sim.release_physical(0, h), kOk);
  EXPECT_EQ(sim.release_address_range(0, r, 4 * MiB), kOk);
  EXPECT_EQ(sim.used(0), 0u);
  EXPECT_EQ(sim.live_reservations(0), 0u);
  EXPECT_EQ(sim.calls(SimOp::release_physical), 2u);  // failed calls count too
}

// fail_after_fault: the calls of an operation that follow the next injected
// failure fail too (the undo of a failed step), then it is spent.
TEST(SimFaults, CallsAfterAFaultCanFailToo) {
  SimBackend sim(small(16 * MiB));
  void* r = nullptr;
  ASSERT_EQ(sim.reserve_address_range(0, 8 * MiB, 0, &r), kOk);
  PhysicalHandle a = 0, b = 0;
  ASSERT_EQ(sim.create_physical(0, 2 * MiB, &a), kOk);
  ASSERT_EQ(sim.create_physical(0, 2 * MiB, &b), kOk);
  ASSERT_EQ(sim.map(0, r, 2 * MiB, a), kOk);
  sim.fail_after_fault(SimOp::unmap, 2, kError);
  EXPECT_EQ(sim.unmap(0, r, 2 * MiB), kOk);  // armed, not triggered: no fault yet
  ASSERT_EQ(sim.map(0, r, 2 * MiB, a), kOk);
  sim.fail_operation_number(SimOp::map, 1, kError);
  EXPECT_EQ(sim.map(0, at(r, 2 * MiB), 2 * MiB, b), kError);  // the trigger
  EXPECT_EQ(sim.unmap(0, r, 2 * MiB), kError);
  EXPECT_EQ(sim.unmap(0, r, 2 * MiB), kError);
  EXPECT_EQ(sim.unmap(0, r, 2 * MiB), kOk);  // spent
  EXPECT_EQ(sim.calls(SimOp::unmap), 4u);
}

// ---- Events and streams -------------------------------------------------------------

TEST(SimEvents, CompleteOnlyWhenTheStreamAdvances) {
  SimBackend sim(small());
  EventHandle a = 0, b = 0;
  ASSERT_EQ(sim.create_event(0, &a), kOk);
  ASSERT_EQ(sim.create_event(0, &b), kOk);
  EXPECT_NE(a, b);
  EXPECT_EQ(sim.query_event(0, a), kOk);  // never recorded
  EXPECT_EQ(sim.record_event(0, a, 1), kOk);
  EXPECT_EQ(sim.record_event(0, b, 2), kOk);
  EXPECT_EQ(sim.query_event(0, a), kNotReady);
  EXPECT_EQ(sim.pending_events(1), 1u);
  sim.advance(1);
  EXPECT_EQ(sim.query_event(0, a), kOk);
  EXPECT_EQ(sim.query_event(0, b), kNotReady);  // streams are independent
  EXPECT_EQ(sim.pending_events(1), 0u);
  EXPECT_EQ(sim.pending_events(2), 1u);
  sim.advance_all();
  EXPECT_EQ(sim.query_event(0, b), kOk);
}

TEST(SimEvents, SynchronizeEventCompletesUpToItsMarker) {
  SimBackend sim(small());
  EventHandle a = 0, b = 0;
  ASSERT_EQ(sim.create_event(0, &a), kOk);
  ASSERT_EQ(sim.create_event(0, &b), kOk);
  EXPECT_EQ(sim.record_event(0, a, 0), kOk);
  sim.submit_work(0);
  EXPECT_EQ(sim.record_event(0, b, 0), kOk);
  EXPECT_EQ(sim.pending_events(0), 2u);
  EXPECT_EQ(sim.synchronize_event(0, a), kOk);
  EXPECT_EQ(sim.query_event(0, a), kOk);
  EXPECT_EQ(sim.query_event(0, b), kNotReady);  // recorded after a: not waited for
  EXPECT_EQ(sim.synchronize_stream(0, 0), kOk);
  EXPECT_EQ(sim.query_event(0, b), kOk);
}

TEST(SimEvents, RerecordingCapturesNewWork) {
  SimBackend sim(small());
  EventHandle e = 0;
  ASSERT_EQ(sim.create_event(0, &e), kOk);
  EXPECT_EQ(sim.record_event(0, e, 3), kOk);
  sim.advance(3);
  EXPECT_EQ(sim.query_event(0, e), kOk);
  sim.submit_work(3);
  EXPECT_EQ(sim.record_event(0, e, 3), kOk);
  EXPECT_EQ(sim.query_event(0, e), kNotReady);
  EXPECT_EQ(sim.synchronize_device(0), kOk);
  EXPECT_EQ(sim.query_event(0, e), kOk);
}

TEST(SimEvents, EagerModeCompletesAtOnce) {
  SimOptions o = small();
  o.completion = SimCompletion::eager;
  SimBackend eager(o);
  EventHandle e = 0;
  ASSERT_EQ(eager.create_event(0, &e), kOk);
  eager.submit_work(0);
  EXPECT_EQ(eager.record_event(0, e, 0), kOk);
  EXPECT_EQ(eager.query_event(0, e), kOk);
  EXPECT_EQ(eager.pending_events(0), 0u);

  SimBackend sim(small());
  ASSERT_EQ(sim.create_event(0, &e), kOk);
  EXPECT_EQ(sim.record_event(0, e, 5), kOk);
  EXPECT_EQ(sim.query_event(0, e), kNotReady);
  sim.set_eager(true);  // switching on completes what is pending
  EXPECT_EQ(sim.query_event(0, e), kOk);
  sim.set_eager(false);
  EXPECT_EQ(sim.record_event(0, e, 5), kOk);
  EXPECT_EQ(sim.query_event(0, e), kNotReady);
}

// The completion model (docs/simulated_device.md): a host wait the program reports
// completes the stream's work (host_waits, the default); manual leaves it to the test
// controls; paced also completes an event at its pace-th query.
TEST(SimEvents, AReportedHostWaitCompletesTheStreamUnlessManual) {
  for (SimCompletion mode :
       {SimCompletion::host_waits, SimCompletion::paced, SimCompletion::manual}) {
    SCOPED_TRACE(to_string(mode));
    SimOptions o = small();
    o.completion = mode;
    o.pace = 1000;
    SimBackend sim(o);
    EventHandle e = 0, other = 0;
    ASSERT_EQ(sim.create_event(0, &e), kOk);
    ASSERT_EQ(sim.create_event(0, &other), kOk);
    sim.submit_work(5);
    ASSERT_EQ(sim.record_event(0, e, 5), kOk);
    ASSERT_EQ(sim.record_event(0, other, 6), kOk);
    EXPECT_EQ(sim.host_waited(0, 5), kOk);
    EXPECT_EQ(sim.query_event(0, e), mode == SimCompletion::manual ? kNotReady : kOk);
    EXPECT_EQ(sim.query_event(0, other), kNotReady);  // another stream's work goes on
    EXPECT_EQ(sim.counters().host_waits, mode == SimCompletion::manual ? 0u : 1u);
  }
}

TEST(SimEvents, PacedCompletesAnEventAtItsPaceThQuery) {
  SimOptions o = small();
  o.completion = SimCompletion::paced;
  o.pace = 3;
  SimBackend sim(o);
  EventHandle e = 0;
  ASSERT_EQ(sim.create_event(0, &e), kOk);
  sim.submit_work(5);
  ASSERT_EQ(sim.record_event(0, e, 5), kOk);
  EXPECT_EQ(sim.query_event(0, e), kNotReady);
  EXPECT_EQ(sim.query_event(0, e), kNotReady);
  EXPECT_EQ(sim.query_event(0, e), kOk);
  EXPECT_EQ(sim.completed(5), sim.submitted(5));
  ASSERT_EQ(sim.record_event(0, e, 5), kOk);  // a new recording counts afresh
  EXPECT_EQ(sim.query_event(0, e), kNotReady);
  o.pace = 0;
  EXPECT_THROW(SimBackend{o}, InvalidArgumentError);
}

TEST(SimEvents, PendingCountsOnlyLiveEvents) {
  SimBackend sim(small());
  EventHandle a = 0, b = 0;
  ASSERT_EQ(sim.create_event(0, &a), kOk);
  ASSERT_EQ(sim.create_event(0, &b), kOk);
  EXPECT_EQ(sim.record_event(0, a, 9), kOk);
  EXPECT_EQ(sim.record_event(0, b, 9), kOk);
  EXPECT_EQ(sim.pending_events(9), 2u);
  EXPECT_EQ(sim.destroy_event(0, a), kOk);
  EXPECT_EQ(sim.pending_events(9), 1u);
  EXPECT_EQ(sim.pending_events(10), 0u);  // a stream never used
}

TEST(SimEvents, UnknownOrForeignEventsAreErrors) {
  SimOptions o = small();
  o.device_count = 2;
  SimBackend sim(o);
  EventHandle e = 0;
  ASSERT_EQ(sim.create_event(1, &e), kOk);
  EXPECT_EQ(sim.query_event(0, e), kError);  // created on device 1
  EXPECT_NE(sim.last_error().find("belongs to device 1"), std::string::npos);
  EXPECT_EQ(sim.stream_wait_event(1, 4, e), kOk);
  EXPECT_EQ(sim.destroy_event(1, e), kOk);
  EXPECT_EQ(sim.query_event(1, e), kError);
  EXPECT_EQ(sim.last_error(), "sim: query_event: unknown event " + std::to_string(e) +
                                  " (destroyed or never created)");
  EXPECT_EQ(sim.destroy_event(1, e), kError);
  EXPECT_EQ(sim.record_event(1, e, 0), kError);
  EXPECT_EQ(sim.synchronize_event(1, e), kError);
  EXPECT_EQ(sim.stream_wait_event(1, 0, e), kError);
}

// ---- Virtual memory -----------------------------------------------------------------

// A backend with a 2 MiB granularity and a reservation of `reserved` bytes at r.
struct Vmm {
  explicit Vmm(std::size_t capacity = 16 * MiB, bool host_backed = false)
      : sim([&] {
          SimOptions o = small(capacity);
          o.host_backed = host_backed;
          return o;
        }()) {
    EXPECT_EQ(sim.reserve_address_range(0, 8 * MiB, 0, &r), kOk) << sim.last_error();
  }
  PhysicalHandle create(std::size_t size) {
    PhysicalHandle h = 0;
    EXPECT_EQ(sim.create_physical(0, size, &h), kOk) << sim.last_error();
    return h;
  }
  SimBackend sim;
  void* r = nullptr;
};

TEST(SimVmm, ReservationsFollowGranularityAndAvoidSegments) {
  Vmm v;
  SimBackend& sim = v.sim;
  std::size_t g = 0;
  EXPECT_EQ(sim.granularity(0, &g), kOk);
  EXPECT_EQ(g, 2 * MiB);
  void* p = nullptr;
  EXPECT_EQ(sim.reserve_address_range(0, 3 * MiB, 0, &p), kError);
  EXPECT_EQ(sim.reserve_address_range(0, 2 * MiB, 3 * MiB, &p), kError);
  EXPECT_EQ(sim.reserve_address_range(0, 0, 0, &p), kError);
  void* aligned = nullptr;
  EXPECT_EQ(sim.reserve_address_range(0, 2 * MiB, 64 * MiB, &aligned), kOk);
  EXPECT_EQ(addr(aligned) % (64 * MiB), 0u);
  void* seg = alloc(sim, 8 * MiB);
  for (void* r : {v.r, aligned}) {
    EXPECT_TRUE(addr(seg) + 8 * MiB <= addr(r) || addr(r) + 2 * MiB <= addr(seg));
  }
  EXPECT_EQ(sim.used(0), 8 * MiB);  // address space costs no memory
  EXPECT_EQ(sim.release_address_range(0, aligned, 4 * MiB), kError);  // wrong size
  EXPECT_EQ(sim.release_address_range(0, aligned, 2 * MiB), kOk);
  EXPECT_EQ(sim.release_address_range(0, aligned, 2 * MiB), kError);  // twice
  EXPECT_EQ(sim.counters().reservations, 2u);
}

TEST(SimVmm, PhysicalMemorySharesTheCapacity) {
  Vmm v(8 * MiB);
  SimBackend& sim = v.sim;
  PhysicalHandle h = 0;
  EXPECT_EQ(sim.create_physical(0, 3 * MiB, &h), kError);  // not a multiple of 2 MiB
  h = v.create(6 * MiB);
  EXPECT_EQ(sim.used(0), 6 * MiB);
  void* p = nullptr;
  EXPECT_EQ(sim.allocate(0, 4 * MiB, &p), kOom);
  PhysicalHandle other = 0;
  EXPECT_EQ(sim.create_physical(0, 4 * MiB, &other), kOom);
  EXPECT_EQ(sim.counters().failed_allocs, 2u);
  EXPECT_EQ(sim.release_physical(0, h), kOk);
  EXPECT_EQ(sim.used(0), 0u);
  EXPECT_EQ(sim.release_physical(0, h), kError);  // twice
  EXPECT_EQ(sim.allocate(0, 4 * MiB, &p), kOk);
}

TEST(SimVmm, MapChecksItsArguments) {
  Vmm v;
  SimBackend& sim = v.sim;
  const PhysicalHandle a = v.create(2 * MiB);
  const PhysicalHandle b = v.create(4 * MiB);
  EXPECT_EQ(sim.map(0, v.r, 4 * MiB, a), kError);               // size differs from handle
  EXPECT_EQ(sim.map(0, at(v.r, 6 * MiB), 4 * MiB, b), kError);  // runs past the reservation
  EXPECT_EQ(sim.map(0, at(v.r, 512), 2 * MiB, a), kError);      // not granularity aligned
  void* seg = alloc(sim, 2 * MiB);
  EXPECT_EQ(sim.map(0, seg, 2 * MiB, a), kError);  // a segment is no reservation
  EXPECT_EQ(sim.map(0, v.r, 2 * MiB, 999), kError);
  EXPECT_EQ(sim.map(0, at(v.r, 2 * MiB), 4 * MiB, b), kOk);
  EXPECT_EQ(sim.map(0, v.r, 2 * MiB, a), kOk);               // adjacent: fine
  EXPECT_EQ(sim.map(0, at(v.r, 6 * MiB), 2 * MiB, a), kOk);  // a handle may map twice
  const PhysicalHandle c = v.create(2 * MiB);
  EXPECT_EQ(sim.map(0, at(v.r, 4 * MiB), 2 * MiB, c), kError);  // inside b's mapping
  EXPECT_NE(sim.last_error().find("overlaps"), std::string::npos) << sim.last_error();
  EXPECT_EQ(sim.counters().maps, 3u);
}

TEST(SimVmm, UnmapMustCoverWholeMappings) {
  Vmm v;
  SimBackend& sim = v.sim;
  const PhysicalHandle a = v.create(2 * MiB);
  const PhysicalHandle b = v.create(4 * MiB);
  ASSERT_EQ(sim.map(0, v.r, 2 * MiB, a), kOk);
  ASSERT_EQ(sim.map(0, at(v.r, 2 * MiB), 4 * MiB, b), kOk);
  EXPECT_EQ(sim.unmap(0, at(v.r, 2 * MiB), 2 * MiB), kError);     // half of b
  EXPECT_EQ(sim.unmap(0, at(v.r, 4 * MiB), 2 * MiB), kError);     // the other half
  EXPECT_EQ(sim.unmap(0, v.r, 8 * MiB), kError);                  // past the end of b
  EXPECT_EQ(sim.unmap(0, at(v.r, 6 * MiB), 2 * MiB), kError);     // nothing there
  EXPECT_EQ(sim.release_address_range(0, v.r, 8 * MiB), kError);  // still mapped
  EXPECT_EQ(sim.counters().unmaps, 0u);
  EXPECT_EQ(sim.unmap(0, v.r, 6 * MiB), kOk);  // both at once
  EXPECT_EQ(sim.unmap(0, v.r, 2 * MiB), kError);
  EXPECT_EQ(sim.map(0, at(v.r, 4 * MiB), 2 * MiB, a), kOk);  // free to map again
  EXPECT_EQ(sim.unmap(0, at(v.r, 4 * MiB), 2 * MiB), kOk);
  EXPECT_EQ(sim.release_address_range(0, v.r, 8 * MiB), kOk);
}

TEST(SimVmm, ReleasedHandleStaysCountedUntilUnmapped) {
  Vmm v;
  SimBackend& sim = v.sim;
  const PhysicalHandle h = v.create(4 * MiB);
  ASSERT_EQ(sim.map(0, v.r, 4 * MiB, h), kOk);
  EXPECT_EQ(sim.release_physical(0, h), kOk);
  EXPECT_EQ(sim.used(0), 4 * MiB);
  EXPECT_EQ(sim.map(0, at(v.r, 4 * MiB), 4 * MiB, h), kError);  // released: no new maps
  EXPECT_EQ(sim.unmap(0, v.r, 4 * MiB), kOk);
  EXPECT_EQ(sim.used(0), 0u);
  EXPECT_EQ(sim.counters().physical_releases, 1u);
}

TEST(SimVmm, SetAccessNeedsAMappedRangeAndValidDevices) {
  SimOptions o = small();
  o.device_count = 2;
  SimBackend sim(o);
  void* r = nullptr;
  ASSERT_EQ(sim.reserve_address_range(0, 8 * MiB, 0, &r), kOk);
  PhysicalHandle h = 0;
  ASSERT_EQ(sim.create_physical(0, 4 * MiB, &h), kOk);
  const int both[] = {0, 1};
  const int bad[] = {0, 2};
  EXPECT_EQ(sim.set_access(0, r, 4 * MiB, both, 2), kError);  // nothing mapped yet
  ASSERT_EQ(sim.map(0, r, 4 * MiB, h), kOk);
  EXPECT_EQ(sim.set_access(0, r, 6 * MiB, both, 2), kError);  // runs past the mapping
  EXPECT_EQ(sim.set_access(0, r, 4 * MiB, bad, 2), kError);
  EXPECT_EQ(sim.last_error(), "sim: set_access: device 2 does not exist (device_count 2)");
  EXPECT_EQ(sim.set_access(0, r, 4 * MiB, both, 0), kError);
  EXPECT_EQ(sim.set_access(0, r, 4 * MiB, both, 2), kOk);
  EXPECT_EQ(sim.set_access(0, at(r, 2 * MiB), 2 * MiB, both, 1), kOk);  // part of one
  EXPECT_EQ(sim.set_access(1, r, 4 * MiB, both, 2), kError);            // the mapping is device 0's
}

// The window is a GPU's: far beyond the memory (2^49 bytes for an H200), and past it a
// reservation is out of memory, as cuMemAddressReserve answers, not an error.
TEST(SimVmm, TheAddressWindowIsFarBeyondTheMemoryAndItsEndIsOutOfMemory) {
  SimBackend sim;
  constexpr std::size_t kHalf = std::size_t{1} << 48;
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(sim.reserve_address_range(0, kHalf, 0, &a), DeviceStatus::ok);
  EXPECT_EQ(sim.reserve_address_range(0, kHalf, 0, &b), DeviceStatus::out_of_memory);
  EXPECT_NE(sim.last_error().find("no free address range"), std::string::npos) << sim.last_error();
  ASSERT_EQ(sim.reserve_address_range(0, kHalf / 2, 0, &b), DeviceStatus::ok);
  EXPECT_EQ(sim.release_address_range(0, a, kHalf), DeviceStatus::ok);
  EXPECT_EQ(sim.release_address_range(0, b, kHalf / 2), DeviceStatus::ok);
}

TEST(SimVmm, VirtualSpaceRecordsAccess) {
  sim::DriverPlacement space(0x100000000, 0x200000000, SimPlacement{});
  sim::VirtualSpace vs(
      false, false, 2 * MiB,
      {[&](int, std::size_t size, std::size_t a) { return space.reserve(size, a); },
       [&](int, std::uintptr_t start) { space.release(start); }});
  void* r = nullptr;
  bool no_room = true;
  ASSERT_EQ(vs.reserve(0, 4 * MiB, 0, &r, &no_room), "");
  EXPECT_FALSE(no_room);
  const PhysicalHandle h = vs.create(0, 4 * MiB);
  ASSERT_EQ(vs.map(0, r, 4 * MiB, h), "");
  EXPECT_TRUE(vs.access(r).empty());
  const int devices[] = {3, 1, 3};
  ASSERT_EQ(vs.set_access(0, r, 4 * MiB, devices, 3, 4), "");
  EXPECT_EQ(vs.access(r), (std::vector<int>{1, 3}));
}

TEST(SimVmm, ReservationsAndAccessCanBeInspected) {
  SimOptions o = small();
  o.device_count = 2;
  SimBackend sim(o);
  void* r0 = nullptr;
  void* r1 = nullptr;
  void* other = nullptr;
  ASSERT_EQ(sim.reserve_address_range(0, 4 * MiB, 0, &r0), kOk);
  ASSERT_EQ(sim.reserve_address_range(0, 4 * MiB, 0, &r1), kOk);
  ASSERT_EQ(sim.reserve_address_range(1, 4 * MiB, 0, &other), kOk);
  EXPECT_EQ(sim.live_reservations(0), 2u);
  EXPECT_EQ(sim.live_reservations(1), 1u);
  PhysicalHandle h = 0;
  ASSERT_EQ(sim.create_physical(0, 2 * MiB, &h), kOk);
  ASSERT_EQ(sim.map(0, r0, 2 * MiB, h), kOk);
  EXPECT_TRUE(sim.access(r0).empty());
  const int both[] = {1, 0};
  ASSERT_EQ(sim.set_access(0, r0, 2 * MiB, both, 2), kOk);
  EXPECT_EQ(sim.access(r0), (std::vector<int>{0, 1}));
  EXPECT_TRUE(sim.access(r1).empty());  // nothing mapped there
  ASSERT_EQ(sim.release_address_range(0, r1, 4 * MiB), kOk);
  EXPECT_EQ(sim.live_reservations(0), 1u);
}

TEST(SimVmm, HostBackedMappingsAreWritable) {
  Vmm v(16 * MiB, true);
  SimBackend& sim = v.sim;
  const PhysicalHandle a = v.create(2 * MiB);
  const PhysicalHandle b = v.create(2 * MiB);
  ASSERT_EQ(sim.map(0, v.r, 2 * MiB, a), kOk);
  ASSERT_EQ(sim.map(0, at(v.r, 2 * MiB), 2 * MiB, b), kOk);
  std::memset(v.r, 0x3c, 4 * MiB);
  const auto* bytes = static_cast<const unsigned char*>(v.r);
  EXPECT_EQ(bytes[0], 0x3c);
  EXPECT_EQ(bytes[4 * MiB - 1], 0x3c);
  ASSERT_EQ(sim.unmap(0, v.r, 4 * MiB), kOk);
  ASSERT_EQ(sim.map(0, at(v.r, 4 * MiB), 2 * MiB, a), kOk);
  std::memset(at(v.r, 4 * MiB), 1, 2 * MiB);
  ASSERT_EQ(sim.unmap(0, at(v.r, 4 * MiB), 2 * MiB), kOk);
  EXPECT_EQ(sim.release_address_range(0, v.r, 8 * MiB), kOk);
}

// ---- Host memory and copies ----------------------------------------------------------

std::vector<unsigned char> pattern(std::size_t size, unsigned seed) {
  std::vector<unsigned char> out(size);
  for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  return out;
}

// Not overridden: the seam's defaults.
class Bare final : public Backend {
 public:
  const char* name() const noexcept override { return "bare"; }
  DeviceStatus device_count(int*) override { return kOk; }
  DeviceStatus current_device(int*) override { return kOk; }
  DeviceStatus memory_info(int, MemoryInfo*) override { return kOk; }
  DeviceStatus allocate(int, std::size_t, void**) override { return kOk; }
  DeviceStatus deallocate(int, void*, std::size_t) override { return kOk; }
  DeviceStatus create_event(int, EventHandle*) override { return kOk; }
  DeviceStatus destroy_event(int, EventHandle) override { return kOk; }
  DeviceStatus record_event(int, EventHandle, StreamHandle) override { return kOk; }
  DeviceStatus query_event(int, EventHandle) override { return kOk; }
  DeviceStatus synchronize_event(int, EventHandle) override { return kOk; }
  DeviceStatus synchronize_stream(int, StreamHandle) override { return kOk; }
  DeviceStatus synchronize_device(int) override { return kOk; }
};

TEST(BackendDefaults, HostMemoryAndCopiesAreUnsupported) {
  Bare bare;
  void* p = nullptr;
  char host[16] = {};
  EXPECT_EQ(bare.allocate_host(0, 4096, &p), DeviceStatus::unsupported);
  EXPECT_EQ(bare.last_error(), "allocate_host: not supported by this backend");
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(bare.free_host(0, host), DeviceStatus::unsupported);
  EXPECT_EQ(bare.last_error(), "free_host: not supported by this backend");
  EXPECT_EQ(bare.copy_to_host(0, host, p, sizeof host), DeviceStatus::unsupported);
  EXPECT_EQ(bare.last_error(), "copy_to_host: not supported by this backend");
  EXPECT_EQ(bare.copy_to_device(0, p, host, sizeof host), DeviceStatus::unsupported);
  EXPECT_EQ(bare.last_error(), "copy_to_device: not supported by this backend");
  EXPECT_EQ(bare.copy_to_device_async(0, p, host, sizeof host, 0), DeviceStatus::unsupported);
  EXPECT_EQ(bare.last_error(), "copy_to_device_async: not supported by this backend");
}

// Host-backed: the bytes travel both ways, through a range of two mappings and a
// segment's middle.
TEST(SimHostCopies, HostBackedCopiesRoundTrip) {
  Vmm v(16 * MiB, true);
  SimBackend& sim = v.sim;
  const PhysicalHandle a = v.create(2 * MiB);
  const PhysicalHandle b = v.create(2 * MiB);
  ASSERT_EQ(sim.map(0, v.r, 2 * MiB, a), kOk);
  ASSERT_EQ(sim.map(0, at(v.r, 2 * MiB), 2 * MiB, b), kOk);
  const int self = 0;
  ASSERT_EQ(sim.set_access(0, v.r, 4 * MiB, &self, 1), kOk) << sim.last_error();
  const std::size_t n = 3 * MiB + 100;  // across the two mappings
  void* device = at(v.r, 512 * KiB);
  const auto first = pattern(n, 1);
  std::memcpy(device, first.data(), n);

  void* host = nullptr;
  ASSERT_EQ(sim.allocate_host(0, n, &host), kOk) << sim.last_error();
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(addr(host) % 4096, 0u) << "page-aligned, as pinned memory is";
  EXPECT_EQ(sim.live_host_allocations(), 1u);
  ASSERT_EQ(sim.copy_to_host(0, host, device, n), kOk) << sim.last_error();
  EXPECT_EQ(std::memcmp(host, first.data(), n), 0);

  const auto second = pattern(n, 77);
  std::memcpy(host, second.data(), n);
  ASSERT_EQ(sim.copy_to_device(0, device, host, n), kOk) << sim.last_error();
  EXPECT_EQ(std::memcmp(device, second.data(), n), 0);

  // An ordinary segment: a part in its middle.
  void* segment = alloc(sim, 64 * KiB);
  const auto third = pattern(10 * KiB, 5);
  ASSERT_EQ(sim.copy_to_device(0, at(segment, 1000), third.data(), third.size()), kOk)
      << sim.last_error();
  std::vector<unsigned char> back(third.size());
  ASSERT_EQ(sim.copy_to_host(0, back.data(), at(segment, 1000), back.size()), kOk)
      << sim.last_error();
  EXPECT_EQ(back, third);

  EXPECT_EQ(sim.free_host(0, host), kOk) << sim.last_error();
  EXPECT_EQ(sim.live_host_allocations(), 0u);
  ASSERT_EQ(sim.unmap(0, v.r, 4 * MiB), kOk);
  EXPECT_EQ(sim.release_physical(0, a), kOk);
  EXPECT_EQ(sim.release_physical(0, b), kOk);
}

// An asynchronous copy is work on its stream: the bytes land (host backed), and an
// event recorded after it completes only with that stream's work. Its device range is
// checked as a synchronous copy's; it fails under injection as any call.
TEST(SimHostCopies, AnAsynchronousCopyIsWorkOnItsStream) {
  Vmm v(16 * MiB, true);
  SimBackend& sim = v.sim;
  void* segment = alloc(sim, 64 * KiB);
  const auto bytes = pattern(8 * KiB, 9);
  ASSERT_EQ(sim.copy_to_device_async(0, segment, bytes.data(), bytes.size(), 6), kOk)
      << sim.last_error();
  EventHandle e = 0;
  ASSERT_EQ(sim.create_event(0, &e), kOk);
  ASSERT_EQ(sim.record_event(0, e, 6), kOk);
  EXPECT_EQ(sim.query_event(0, e), kNotReady);
  EXPECT_EQ(sim.submitted(6), 2u);  // the copy, then the event
  EXPECT_EQ(sim.synchronize_event(0, e), kOk);
  EXPECT_EQ(std::memcmp(segment, bytes.data(), bytes.size()), 0);
  EXPECT_EQ(sim.counters().async_copies_to_device, 1u);
  EXPECT_EQ(sim.counters().copies_to_device, 1u);
  EXPECT_EQ(sim.copy_to_device_async(0, at(segment, 64 * KiB), bytes.data(), 16, 6), kError);
  EXPECT_EQ(sim.last_error().rfind("sim: copy_to_device_async: [", 0), 0u) << sim.last_error();
  sim.fail_operation_number(SimOp::copy_to_device_async, 1, kError);
  EXPECT_EQ(sim.copy_to_device_async(0, segment, bytes.data(), 16, 6), kError);
  EXPECT_EQ(sim.copy_to_device_async(0, segment, bytes.data(), 16, 6), kOk);
  EXPECT_EQ(sim.destroy_event(0, e), kOk);
  EXPECT_EQ(sim.deallocate(0, segment, 64 * KiB), kOk);
}

// The device range must be memory the device reaches; a refused copy touches nothing.
TEST(SimHostCopies, TheDeviceRangeMustBeMappedDeviceMemory) {
  Vmm v(16 * MiB, true);
  SimBackend& sim = v.sim;
  const PhysicalHandle a = v.create(2 * MiB);
  ASSERT_EQ(sim.map(0, v.r, 2 * MiB, a), kOk);
  std::vector<unsigned char> host(4 * KiB, 0x42);
  // Mapped, but no access granted yet.
  EXPECT_EQ(sim.copy_to_host(0, host.data(), v.r, host.size()), kError);
  const std::string prefix = "sim: copy_to_host: [" + sim::hex(addr(v.r)) + ", " +
                             sim::hex(addr(v.r) + host.size()) +
                             ") is not mapped device memory of device 0: ";
  EXPECT_EQ(sim.last_error().rfind(prefix, 0), 0u) << sim.last_error();
  EXPECT_NE(sim.last_error().find("set_access"), std::string::npos) << sim.last_error();
  const int self = 0;
  ASSERT_EQ(sim.set_access(0, v.r, 2 * MiB, &self, 1), kOk);
  EXPECT_EQ(sim.copy_to_host(0, host.data(), v.r, host.size()), kOk) << sim.last_error();

  // Past the mapping's end (the rest of the reservation is unmapped).
  EXPECT_EQ(sim.copy_to_host(0, host.data(), at(v.r, 2 * MiB - 1024), host.size()), kError);
  EXPECT_NE(sim.last_error().find("is not mapped device memory"), std::string::npos)
      << sim.last_error();
  EXPECT_EQ(sim.copy_to_device(0, at(v.r, 2 * MiB), host.data(), host.size()), kError);
  EXPECT_EQ(sim.last_error().rfind("sim: copy_to_device: [", 0), 0u) << sim.last_error();
  // Past a segment's end, and host memory posing as device memory.
  void* segment = alloc(sim, 4 * KiB);
  EXPECT_EQ(sim.copy_to_host(0, host.data(), segment, 4 * KiB + 512), kError);
  EXPECT_EQ(sim.copy_to_device(0, host.data(), segment, 16), kError);
  EXPECT_NE(sim.last_error().find("is not mapped device memory"), std::string::npos)
      << sim.last_error();
  EXPECT_EQ(sim.copy_to_host(0, nullptr, segment, 16), kError);
  EXPECT_EQ(sim.last_error(), "sim: copy_to_host: null dst");
  EXPECT_EQ(sim.copy_to_host(0, host.data(), segment, 0), kOk) << "nothing to copy";

  // A refused copy changes nothing: no work completes, nothing is counted.
  EventHandle e = 0;
  ASSERT_EQ(sim.create_event(0, &e), kOk);
  ASSERT_EQ(sim.record_event(0, e, 1), kOk);
  EXPECT_EQ(sim.copy_to_host(0, host.data(), at(v.r, 2 * MiB), 16), kError);
  EXPECT_EQ(sim.query_event(0, e), kNotReady);
  const SimCounters c = sim.counters();
  EXPECT_EQ(c.copies_to_host, 2u);  // the two that succeeded
  EXPECT_EQ(c.copies_to_device, 0u);
  EXPECT_EQ(c.bytes_to_host, host.size());

  ASSERT_EQ(sim.unmap(0, v.r, 2 * MiB), kOk);
  EXPECT_EQ(sim.copy_to_host(0, host.data(), v.r, 16), kError) << "unmapped again";
  EXPECT_EQ(sim.release_physical(0, a), kOk);
}

// Without host_backed, contents are not modelled: the copies succeed (after the same
// checks) without touching memory.
TEST(SimHostCopies, SyntheticCopiesTouchNoMemory) {
  SimBackend sim(small());
  void* segment = alloc(sim, 8 * KiB);
  void* host = nullptr;
  ASSERT_EQ(sim.allocate_host(0, 8 * KiB, &host), kOk) << sim.last_error();
  std::memset(host, 0x77, 8 * KiB);  // real host memory, whatever host_backed says
  ASSERT_EQ(sim.copy_to_host(0, host, segment, 8 * KiB), kOk) << sim.last_error();
  EXPECT_EQ(static_cast<unsigned char*>(host)[0], 0x77);
  EXPECT_EQ(static_cast<unsigned char*>(host)[8 * KiB - 1], 0x77);
  ASSERT_EQ(sim.copy_to_device(0, segment, host, 8 * KiB), kOk) << sim.last_error();
  EXPECT_EQ(sim.copy_to_device(0, at(segment, 8 * KiB), host, 512), kError) << "past its end";
  EXPECT_EQ(sim.free_host(0, host), kOk);
}

// A copy waits for itself only, as CUDA's copy on a stream of its own: the caller (the
// engine) synchronized the work that used the memory, and work submitted on other
// streams stays pending in every completion mode but eager. Like the synchronize
// calls, a copy is refused while a capture is under way.
TEST(SimHostCopies, CopiesWaitForNoOtherWork) {
  for (SimCompletion mode : {SimCompletion::manual, SimCompletion::host_waits, SimCompletion::paced,
                             SimCompletion::eager}) {
    SCOPED_TRACE(to_string(mode));
    SimOptions o = small();
    o.completion = mode;
    SimBackend sim(o);
    void* segment = alloc(sim, 4 * KiB);
    char host[64] = {};
    for (const bool to_host : {true, false}) {
      EventHandle e1 = 0, e2 = 0;
      ASSERT_EQ(sim.create_event(0, &e1), kOk);
      ASSERT_EQ(sim.create_event(0, &e2), kOk);
      sim.submit_work(1);
      ASSERT_EQ(sim.record_event(0, e1, 1), kOk);
      sim.submit_work(2);
      ASSERT_EQ(sim.record_event(0, e2, 2), kOk);
      sim.submit_work(2);
      ASSERT_EQ(to_host ? sim.copy_to_host(0, host, segment, sizeof host)
                        : sim.copy_to_device(0, segment, host, sizeof host),
                kOk)
          << sim.last_error();
      const bool eager = mode == SimCompletion::eager;
      EXPECT_EQ(sim.pending_events(1), eager ? 0u : 1u);
      EXPECT_EQ(sim.pending_events(2), eager ? 0u : 1u);
      EXPECT_EQ(sim.completed(2) == sim.submitted(2), eager);
      EXPECT_EQ(sim.query_event(0, e1) == kOk, eager) << "paced: a first query completes nothing";
      ASSERT_EQ(sim.synchronize_device(0), kOk);
      EXPECT_EQ(sim.query_event(0, e2), kOk);
      EXPECT_EQ(sim.destroy_event(0, e1), kOk);
      EXPECT_EQ(sim.destroy_event(0, e2), kOk);
    }
    EXPECT_EQ(sim.counters().device_syncs, 2u) << "the test's own two, none by a copy";

    sim.submit_work(1);
    sim.begin_capture(3);
    EXPECT_EQ(sim.copy_to_host(0, host, segment, sizeof host), kError);
    EXPECT_EQ(sim.last_error(), "sim: copy_to_host is not permitted while stream 3 is capturing");
    EXPECT_EQ(sim.copy_to_device(0, segment, host, sizeof host), kError);
    EXPECT_EQ(sim.capture_violations(), 2u);
    if (mode != SimCompletion::eager) {
      EXPECT_EQ(sim.completed(1) + 1, sim.submitted(1)) << "a refused copy waits for nothing";
    }
    sim.end_capture(3);
  }
}

TEST(SimHostCopies, FreeHostTakesOnlyWhatAllocateHostGave) {
  SimBackend sim(small());
  int local = 0;
  EXPECT_EQ(sim.free_host(0, &local), kError);
  EXPECT_EQ(sim.last_error(), "sim: free_host: " + sim::hex(addr(&local)) +
                                  " was not allocated by allocate_host (or was freed already)");
  void* host = nullptr;
  ASSERT_EQ(sim.allocate_host(0, 100, &host), kOk);
  EXPECT_EQ(sim.free_host(0, at(host, 64)), kError) << "not its start";
  EXPECT_EQ(sim.live_host_allocations(), 1u);
  EXPECT_EQ(sim.free_host(0, host), kOk);
  EXPECT_EQ(sim.free_host(0, host), kError) << "freed twice";
  EXPECT_NE(sim.last_error().find("was not allocated by allocate_host"), std::string::npos);
  EXPECT_EQ(sim.allocate_host(0, 0, &host), kError);
  EXPECT_EQ(sim.last_error(), "sim: allocate_host: size 0 or null ptr");
  EXPECT_EQ(sim.live_host_allocations(), 0u);
  const SimCounters c = sim.counters();
  EXPECT_EQ(c.host_allocs, 1u);
  EXPECT_EQ(c.host_frees, 1u);
  EXPECT_EQ(c.host_alloc_bytes, 100u);
}

// Host memory left behind is given back with the backend (no leak under sanitizers).
TEST(SimHostCopies, HostMemoryLeftBehindGoesWithTheBackend) {
  SimBackend sim(small());
  void* host = nullptr;
  ASSERT_EQ(sim.allocate_host(0, 3 * MiB, &host), kOk);
  std::memset(host, 1, 3 * MiB);
  EXPECT_EQ(sim.live_host_allocations(), 1u);
}

// Each new call takes injected faults like every other: every call, the nth, and the
// calls after a fault; allocate_host also as out of memory.
TEST(SimFaults, HostMemoryAndCopiesCanBeMadeToFail) {
  SimOptions o = small();
  o.host_backed = true;
  SimBackend sim(o);
  void* segment = alloc(sim, 4 * KiB);
  char host_buffer[256] = {};
  EXPECT_STREQ(to_string(SimOp::allocate_host), "allocate_host");
  EXPECT_STREQ(to_string(SimOp::free_host), "free_host");
  EXPECT_STREQ(to_string(SimOp::copy_to_host), "copy_to_host");
  EXPECT_STREQ(to_string(SimOp::copy_to_device), "copy_to_device");

  void* host = nullptr;
  sim.fail_operation(SimOp::allocate_host, kOom);
  EXPECT_EQ(sim.allocate_host(0, 4096, &host), kOom);
  EXPECT_EQ(sim.last_error(), "sim: injected out_of_memory in allocate_host");
  EXPECT_EQ(host, nullptr);
  EXPECT_EQ(sim.counters().failed_allocs, 0u) << "host memory is not device memory";
  sim.fail_operation(SimOp::allocate_host, kError);
  EXPECT_EQ(sim.allocate_host(0, 4096, &host), kError);
  EXPECT_EQ(sim.last_error(), "sim: injected error in allocate_host");
  sim.fail_operation(SimOp::allocate_host, kOk);
  ASSERT_EQ(sim.allocate_host(0, 4096, &host), kOk);

  std::memset(segment, 0x11, 256);
  for (SimOp op : {SimOp::copy_to_host, SimOp::copy_to_device}) {
    SCOPED_TRACE(to_string(op));
    auto copy = [&] {
      return op == SimOp::copy_to_host ? sim.copy_to_host(0, host_buffer, segment, 256)
                                       : sim.copy_to_device(0, segment, host_buffer, 256);
    };
    sim.fail_operation(op, kError);
    EXPECT_EQ(copy(), kError);
    EXPECT_EQ(sim.last_error(), std::string("sim: injected error in ") + to_string(op));
    sim.fail_operation(op, kOk);
    sim.fail_operation_number(op, 2, kError);
    EXPECT_EQ(copy(), kOk);
    EXPECT_EQ(copy(), kError);
    EXPECT_EQ(copy(), kOk);
    EXPECT_EQ(sim.calls(op), 4u);  // failed calls count too
  }
  EXPECT_EQ(static_cast<unsigned char>(host_buffer[0]), 0x11);

  // A failing copy, then the free of its buffer failing too (a device that keeps
  // refusing); the buffer stays until a free succeeds.
  sim.fail_after_fault(SimOp::free_host, 1, kError);
  sim.fail_operation_number(SimOp::copy_to_host, 1, kError);
  EXPECT_EQ(sim.copy_to_host(0, host, segment, 256), kError);
  EXPECT_EQ(sim.free_host(0, host), kError);
  EXPECT_EQ(sim.last_error(), "sim: injected error in free_host");
  EXPECT_EQ(sim.live_host_allocations(), 1u);
  EXPECT_EQ(sim.free_host(0, host), kOk);
  EXPECT_EQ(sim.live_host_allocations(), 0u);
  EXPECT_EQ(sim.calls(SimOp::free_host), 2u);
  EXPECT_EQ(sim.calls(SimOp::allocate_host), 3u);
  const SimCounters c = sim.counters();
  EXPECT_EQ(c.host_allocs, 1u);  // injected failures are not counted
  EXPECT_EQ(c.host_frees, 1u);
  EXPECT_EQ(c.copies_to_host, 2u);
  EXPECT_EQ(c.copies_to_device, 2u);
  EXPECT_EQ(c.bytes_to_host, 512u);
  EXPECT_EQ(c.bytes_to_device, 512u);
}

// ---- Counters, cost model, clock -----------------------------------------------------

TEST(SimCounters, CountCallsAndDeviceTime) {
  SimOptions o = small();
  o.alloc_us = 10;
  o.free_us = 5;
  o.map_us = 2;
  o.unmap_us = 1.5;
  SimBackend sim(o);
  sim.set_clock_us(1000);
  void* p = alloc(sim, 4 * KiB);
  alloc(sim, 8 * KiB);
  ASSERT_EQ(sim.deallocate(0, p, 4 * KiB), kOk);
  EventHandle e = 0;
  ASSERT_EQ(sim.create_event(0, &e), kOk);
  ASSERT_EQ(sim.record_event(0, e, 1), kOk);
  ASSERT_EQ(sim.query_event(0, e), kNotReady);
  ASSERT_EQ(sim.stream_wait_event(0, 2, e), kOk);
  ASSERT_EQ(sim.synchronize_event(0, e), kOk);
  ASSERT_EQ(sim.synchronize_stream(0, 1), kOk);
  ASSERT_EQ(sim.synchronize_device(0), kOk);
  ASSERT_EQ(sim.destroy_event(0, e), kOk);
  void* r = nullptr;
  ASSERT_EQ(sim.reserve_address_range(0, 2 * MiB, 0, &r), kOk);
  PhysicalHandle h = 0;
  ASSERT_EQ(sim.create_physical(0, 2 * MiB, &h), kOk);
  ASSERT_EQ(sim.map(0, r, 2 * MiB, h), kOk);
  ASSERT_EQ(sim.unmap(0, r, 2 * MiB), kOk);
  ASSERT_EQ(sim.release_physical(0, h), kOk);
  void* q = nullptr;
  ASSERT_EQ(sim.allocate(0, 1024 * MiB, &q), kOom);

  const SimCounters c = sim.counters();
  EXPECT_EQ(c.allocs, 2u);
  EXPECT_EQ(c.frees, 1u);
  EXPECT_EQ(c.alloc_bytes, 12 * KiB);
  EXPECT_EQ(c.free_bytes, 4 * KiB);
  EXPECT_EQ(c.failed_allocs, 1u);
  EXPECT_EQ(c.events_created, 1u);
  EXPECT_EQ(c.events_destroyed, 1u);
  EXPECT_EQ(c.events_recorded, 1u);
  EXPECT_EQ(c.event_queries, 1u);
  EXPECT_EQ(c.event_syncs, 1u);
  EXPECT_EQ(c.stream_waits, 1u);
  EXPECT_EQ(c.stream_syncs, 1u);
  EXPECT_EQ(c.device_syncs, 1u);
  EXPECT_EQ(c.physical_creates, 1u);
  EXPECT_EQ(c.physical_releases, 1u);
  EXPECT_EQ(c.maps, 1u);
  EXPECT_EQ(c.unmaps, 1u);
  EXPECT_EQ(c.reservations, 1u);
  EXPECT_EQ(c.host_allocs, 0u);
  EXPECT_EQ(c.copies_to_host + c.copies_to_device, 0u);
  EXPECT_DOUBLE_EQ(c.device_time_us, 10 + 10 + 5 + 2 + 1.5);
  EXPECT_EQ(sim.now_us(), 1000u + 28u);
  sim.advance_clock_us(7);
  EXPECT_EQ(sim.now_us(), 1035u);

  sim.reset_counters();
  const SimCounters zero = sim.counters();
  EXPECT_EQ(zero.allocs, 0u);
  EXPECT_EQ(zero.failed_allocs, 0u);
  EXPECT_EQ(zero.device_time_us, 0.0);
  EXPECT_EQ(sim.now_us(), 1035u);  // the clock does not run backwards
}

// ---- Concurrency --------------------------------------------------------------------

TEST(SimBackend, AllocateHookRunsOutsideTheLock) {
  SimBackend sim(small());
  std::mutex m;
  std::condition_variable cv;
  bool entered = false, release = false;
  std::atomic<int> calls{0};
  sim.set_allocate_hook([&] {
    ++calls;
    std::unique_lock lock(m);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  void* p = nullptr;
  std::thread t([&] { EXPECT_EQ(sim.allocate(0, 512, &p), kOk); });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return entered; });
  }
  // The allocation is blocked in its hook; the backend still answers.
  EXPECT_EQ(sim.live_segments(0), 0u);
  void* q = nullptr;
  sim.set_allocate_hook(nullptr);
  EXPECT_EQ(sim.allocate(0, 512, &q), kOk);
  {
    std::lock_guard lock(m);
    release = true;
  }
  cv.notify_all();
  t.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(sim.live_segments(0), 2u);
  EXPECT_NE(p, q);
}

TEST(SimBackend, ConcurrentAllocationsStayConsistent) {
  SimBackend sim(small(1024 * MiB));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&sim, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 500; ++i) {
        const std::size_t size = 1 + rng() % (256 * KiB);
        void* p = nullptr;
        ASSERT_EQ(sim.allocate(0, size, &p), kOk);
        mine.emplace_back(p, size);
        if (i % 3 == 2) {
          ASSERT_EQ(sim.deallocate(0, mine.front().first, mine.front().second), kOk);
          mine.erase(mine.begin());
        }
      }
      for (auto [p, size] : mine) ASSERT_EQ(sim.deallocate(0, p, size), kOk);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sim.used(0), 0u);
  EXPECT_EQ(sim.live_segments(0), 0u);
  EXPECT_EQ(sim.counters().allocs, 2000u);
}

}  // namespace
}  // namespace reservoir
