// Expandable segments on the simulated device: injected failures while creating
// and mapping pages, peer access for pages mapped before and after it is granted,
// and the device calls (and segment-map entries) a grow and a shrink cost.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Forwards to a SimBackend and records set_access calls.
class AccessRecorder final : public Backend {
 public:
  explicit AccessRecorder(SimOptions o) : sim(o) {}
  SimBackend sim;
  struct Grant {
    void* ptr;
    std::size_t size;
    std::vector<int> devices;
  };
  std::vector<Grant> grants;

  const char* name() const noexcept override { return "recorder"; }
  std::uint32_t capabilities() const noexcept override { return sim.capabilities(); }
  DeviceStatus device_count(int* c) override { return sim.device_count(c); }
  DeviceStatus current_device(int* d) override { return sim.current_device(d); }
  DeviceStatus memory_info(int d, MemoryInfo* i) override { return sim.memory_info(d, i); }
  DeviceStatus allocate(int d, std::size_t s, void** p) override { return sim.allocate(d, s, p); }
  DeviceStatus deallocate(int d, void* p, std::size_t s) override {
    return sim.deallocate(d, p, s);
  }
  DeviceStatus create_event(int d, EventHandle* e) override { return sim.create_event(d, e); }
  DeviceStatus destroy_event(int d, EventHandle e) override { return sim.destroy_event(d, e); }
  DeviceStatus record_event(int d, EventHandle e, StreamHandle s) override {
    return sim.record_event(d, e, s);
  }
  DeviceStatus query_event(int d, EventHandle e) override { return sim.query_event(d, e); }
  DeviceStatus synchronize_event(int d, EventHandle e) override {
    return sim.synchronize_event(d, e);
  }
  DeviceStatus synchronize_stream(int d, StreamHandle s) override {
    return sim.synchronize_stream(d, s);
  }
  DeviceStatus synchronize_device(int d) override { return sim.synchronize_device(d); }
  DeviceStatus granularity(int d, std::size_t* b) override { return sim.granularity(d, b); }
  DeviceStatus reserve_address_range(int d, std::size_t s, std::size_t a, void** p) override {
    return sim.reserve_address_range(d, s, a, p);
  }
  DeviceStatus release_address_range(int d, void* p, std::size_t s) override {
    return sim.release_address_range(d, p, s);
  }
  DeviceStatus create_physical(int d, std::size_t s, PhysicalHandle* h) override {
    return sim.create_physical(d, s, h);
  }
  DeviceStatus release_physical(int d, PhysicalHandle h) override {
    return sim.release_physical(d, h);
  }
  DeviceStatus map(int d, void* p, std::size_t s, PhysicalHandle h) override {
    return sim.map(d, p, s, h);
  }
  DeviceStatus unmap(int d, void* p, std::size_t s) override { return sim.unmap(d, p, s); }
  DeviceStatus set_access(int d, void* p, std::size_t s, const int* devs, int n) override {
    grants.push_back(Grant{p, s, std::vector<int>(devs, devs + n)});
    return sim.set_access(d, p, s, devs, n);
  }
  DeviceStatus enable_peer_access(int d, int peer) override {
    return sim.enable_peer_access(d, peer);
  }
};

// Giving free pages back synchronizes the stream that used them (as PyTorch does);
// once the program said it destroys the stream (release_stream), the whole device is
// waited for instead, so empty_cache never names the destroyed stream, and the pages
// still wait for the work that used them.
TEST(ExpandableOnSim, PagesOfAReleasedStreamWaitForTheDeviceNotTheStream) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config::parse("expandable_segments:True"));
  void* p = a.allocate(8 * MiB, 1, 0);
  sim->submit_work(1);  // a kernel still using p
  const std::uint64_t used_until = sim->submitted(1);
  a.deallocate(p);
  a.release_stream(1);
  sim->destroy_stream(1);  // its work still completes, but naming it fails
  a.empty_cache();         // a wait naming stream 1 would throw
  EXPECT_GE(sim->completed(1), used_until);
  EXPECT_EQ(a.stats(0).reserved_bytes.all().current, 0);
  EXPECT_EQ(sim->used(0), 0u);
  a.validate();
}

// Without release_stream the same empty_cache names the destroyed stream: undefined
// on CUDA (docs/reliability.md); the simulated device refuses it, and the allocator
// stays consistent with the pages still mapped and counted.
TEST(ExpandableOnSim, AStreamDestroyedWithoutReleaseStreamFailsEmptyCacheConsistently) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config::parse("expandable_segments:True"));
  void* p = a.allocate(8 * MiB, 1, 0);
  a.deallocate(p);
  sim->destroy_stream(1);
  const std::int64_t reserved = a.stats(0).reserved_bytes.all().current;
  try {
    a.empty_cache();
    ADD_FAILURE() << "empty_cache synchronized a destroyed stream without an error";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("synchronizing the stream before unmapping"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("destroyed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.stats(0).reserved_bytes.all().current, reserved);
  a.validate();
}

TEST(ExpandableOnSim, PhysicalMemoryExhaustedIsAnOutOfMemoryErrorAndConsistent) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config::parse("expandable_segments:True"));
  void* p = a.allocate(3 * MiB, 1, 0);
  sim->fail_operation(SimOp::create_physical, DeviceStatus::out_of_memory);
  EXPECT_THROW(a.allocate(30 * MiB, 1, 0), OutOfMemoryError);  // needs a new page
  a.validate();
  EXPECT_EQ(a.stats(0).reserved_bytes.all().current, static_cast<std::int64_t>(20 * MiB));
  sim->clear_faults();
  void* q = a.allocate(30 * MiB, 1, 0);
  EXPECT_EQ(q, static_cast<char*>(p) + 3 * MiB);
  a.deallocate(p);
  a.deallocate(q);
  a.validate();
}

TEST(ExpandableOnSim, AMapErrorSurfacesAsDeviceErrorWithNothingHalfMapped) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config::parse("expandable_segments:True"));
  void* p = a.allocate(3 * MiB, 1, 0);
  sim->fail_operation_number(SimOp::map, 2, DeviceStatus::error);  // second page of two
  try {
    a.allocate(50 * MiB, 1, 0);
    FAIL() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("mapping a page"), std::string::npos) << e.what();
  }
  a.validate();
  EXPECT_EQ(a.stats(0).reserved_bytes.all().current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(sim->used(0), 20 * MiB);  // the first new page was given back
  a.deallocate(p);
  a.deallocate(a.allocate(50 * MiB, 1, 0));
  a.validate();
}

// Like a GPU, the simulated device has address space far beyond its memory: 512
// streams each reserve a range per pool (device memory + 1/8 each, 1024 ranges of
// 157 GiB on an H200), where 104 used to exhaust its window ("internal error").
TEST(ExpandableOnSim, HundredsOfStreamsEachReserveTheirRanges) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config::parse("expandable_segments:True"));
  constexpr StreamHandle kStreams = 512;
  std::vector<void*> blocks;
  for (StreamHandle s = 1; s <= kStreams; ++s) {
    blocks.push_back(a.allocate(1024, s, 0));     // the small pool's range
    blocks.push_back(a.allocate(3 * MiB, s, 0));  // the large pool's
  }
  EXPECT_EQ(sim->counters().reservations, 2 * kStreams);
  a.validate();
  for (void* p : blocks) a.deallocate(p);
  a.empty_cache();
  a.validate();
}

// When the address space is used up all the same, a new range is out of memory
// (the driver's answer), not a device error: the ladder gives back the ranges of
// empty cached segments, and the request is served if that made room.
TEST(ExpandableOnSim, AnAddressSpaceUsedUpIsOutOfMemory) {
  SimOptions o;
  o.capacity = std::size_t{8} << 30;  // a window of 256 TiB
  auto sim = std::make_shared<SimBackend>(o);
  Allocator a(sim, Config::parse("expandable_segments:True,expandable_segments_reserve:65536GiB"));
  std::vector<void*> blocks;
  for (StreamHandle s = 1; s <= 3; ++s) blocks.push_back(a.allocate(3 * MiB, s, 0));
  EXPECT_THROW(a.allocate(3 * MiB, 4, 0), OutOfMemoryError);  // a fourth 64 TiB range
  a.validate();
  a.deallocate(blocks[0]);
  void* p = a.allocate(3 * MiB, 4, 0);  // stream 1's range, cached empty, went back
  a.validate();
  a.deallocate(p);
  a.deallocate(blocks[1]);
  a.deallocate(blocks[2]);
}

TEST(ExpandableOnSim, ReservationSizeIsConfigurable) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config::parse("expandable_segments:True,expandable_segments_reserve:1GiB"));
  void* p = a.allocate(3 * MiB, 1, 0);
  void* q = a.allocate(900 * MiB, 1, 0);  // fits in the 1 GiB range
  EXPECT_EQ(q, static_cast<char*>(p) + 3 * MiB);
  void* r = a.allocate(200 * MiB, 1, 0);  // does not: a second segment
  EXPECT_EQ(a.stats(0).segment.large().current, 2);
  EXPECT_EQ(sim->counters().reservations, 2u);
  a.deallocate(p), a.deallocate(q), a.deallocate(r);
}

TEST(ExpandableOnSim, PeersGetAccessToPagesMappedBeforeAndAfter) {
  SimOptions o;
  o.device_count = 2;
  auto backend = std::make_shared<AccessRecorder>(o);
  Allocator a(backend, Config::parse("expandable_segments:True"));
  void* p = a.allocate(3 * MiB, 1, 0);  // maps a page of device 0 (access: 0 only)
  ASSERT_EQ(backend->grants.size(), 1u);
  EXPECT_EQ(backend->grants[0].devices, std::vector<int>{0});
  a.enable_peer_access(1, 0);             // device 1 may use device 0's memory
  ASSERT_EQ(backend->grants.size(), 2u);  // the existing page, for device 1
  EXPECT_EQ(backend->grants[1].ptr, p);
  EXPECT_EQ(backend->grants[1].devices, std::vector<int>{1});
  void* q = a.allocate(30 * MiB, 1, 0);  // a new page: granted to 0 and 1 at once
  EXPECT_EQ(backend->grants.back().devices, (std::vector<int>{0, 1}));
  a.deallocate(p);
  a.deallocate(q);
}

// On a GPU each driver call costs microseconds of host time. Growing by N pages needs
// N physical creates and N maps (a map takes one handle) but one access grant for the
// run; giving a contiguous run of N pages back needs one unmap and N releases.
TEST(ExpandableOnSim, AGrowOfNPagesGrantsAccessOnceAndAShrinkUnmapsOnce) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config::parse("expandable_segments:True"));
  void* p = a.allocate(100 * MiB, 1, 0);  // five 20 MiB pages of a new segment
  EXPECT_EQ(sim->counters().physical_creates, 5u);
  EXPECT_EQ(sim->calls(SimOp::map), 5u);
  EXPECT_EQ(sim->calls(SimOp::set_access), 1u);
  a.deallocate(p);
  a.empty_cache();
  EXPECT_EQ(sim->calls(SimOp::unmap), 1u);
  EXPECT_EQ(sim->counters().physical_releases, 5u);
  EXPECT_EQ(sim->used(0), 0u);
  // The same pages again, then a run with a hole: each contiguous run is one unmap.
  void* q = a.allocate(100 * MiB, 1, 0);
  void* r = a.allocate(40 * MiB, 1, 0);
  void* t = a.allocate(40 * MiB, 1, 0);
  EXPECT_EQ(r, static_cast<char*>(q) + 100 * MiB);
  a.deallocate(q);
  a.deallocate(t);
  a.empty_cache();  // [q, q + 100 MiB) and t's two pages: two runs
  EXPECT_EQ(sim->calls(SimOp::unmap), 3u);
  a.validate();
  a.deallocate(r);
}

std::string free_error(Allocator& a, void* p) {
  try {
    a.deallocate(p);
  } catch (const InvalidPointerError& e) {
    return e.what();
  }
  return "";
}

// Only the pages a segment mapped are in the segment map, not its whole reservation
// (device memory plus 1/8 per stream and pool: registering that cost more host time
// on a multi-stream trace than all of its allocations). An address past the mapped
// pages is no Reservoir memory; one in a mapped page holds no block.
TEST(ExpandableOnSim, OnlyMappedPagesAreInTheSegmentMap) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config::parse("expandable_segments:True"));
  char* p = static_cast<char*>(a.allocate(3 * MiB, 1, 0));  // one 20 MiB page
  EXPECT_NE(free_error(a, p + 4 * MiB).find("no block is allocated there"), std::string::npos);
  EXPECT_NE(free_error(a, p + 1024 * MiB).find("no Reservoir segment contains it"),
            std::string::npos);
  // Growing registers the new pages before any block there is handed out.
  void* q = a.allocate(1024 * MiB, 1, 0);
  EXPECT_EQ(q, p + 3 * MiB);
  EXPECT_NE(free_error(a, p + 1024 * MiB).find("inside the allocated block"), std::string::npos);
  a.validate();
  a.deallocate(q);
  a.deallocate(p);
  a.empty_cache();  // unmapped pages stay registered until the segment goes
  a.deallocate(a.allocate(3 * MiB, 1, 0));
  a.validate();
}

}  // namespace
}  // namespace reservoir
