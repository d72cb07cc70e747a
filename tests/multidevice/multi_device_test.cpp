// Several simulated devices behind one Allocator: per-device engines, statistics,
// snapshots and empty_cache; frees from threads whose current device differs; two
// threads driving two devices at once; peer access and copies between devices from
// ordinary and expandable memory (the peer gets access to pages mapped later too, as
// NCCL needs on virtual memory); invalid device indices refused. 18 devices: past
// the engine slots kept inside the caching allocator (16).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// (device count, configuration)
class MultiDevice : public ::testing::TestWithParam<std::tuple<int, const char*>> {
 protected:
  void SetUp() override {
    SimOptions o;
    o.device_count = std::get<0>(GetParam());
    o.capacity = std::size_t{1} << 30;
    o.host_backed = true;  // copies move real bytes
    sim_ = std::make_shared<SimBackend>(o);
    alloc_ = std::make_unique<Allocator>(sim_, Config::parse(std::get<1>(GetParam())));
  }
  int devices() const { return std::get<0>(GetParam()); }
  bool expandable() const { return alloc_->config().expandable_segments; }

  std::shared_ptr<SimBackend> sim_;
  std::unique_ptr<Allocator> alloc_;
};

TEST_P(MultiDevice, EachDeviceHasItsOwnStatisticsSnapshotAndCache) {
  std::vector<void*> held;
  for (int d = 0; d < devices(); ++d) {
    for (int k = 0; k <= d; ++k) held.push_back(alloc_->allocate(3 * MiB, 0x1, d));
  }
  for (int d = 0; d < devices(); ++d) {
    const DeviceStats s = alloc_->stats(d);
    EXPECT_EQ(s.requested_bytes.all().current, static_cast<std::int64_t>((d + 1) * 3 * MiB)) << d;
    EXPECT_GT(s.reserved_bytes.all().current, 0) << d;
  }
  const Snapshot snap = alloc_->snapshot();
  std::vector<std::size_t> blocks(static_cast<std::size_t>(devices()));
  for (const SegmentInfo& seg : snap.segments) {
    ASSERT_GE(seg.device, 0);
    ASSERT_LT(seg.device, devices());
    for (const BlockInfo& b : seg.blocks)
      if (b.state == BlockStateInfo::active_allocated)
        ++blocks[static_cast<std::size_t>(seg.device)];
  }
  for (int d = 0; d < devices(); ++d) EXPECT_EQ(blocks[static_cast<std::size_t>(d)], d + 1u);
  for (void* p : held) alloc_->deallocate(p);
  // empty_cache(d) empties device d only; empty_cache() all of them.
  alloc_->empty_cache(1);
  EXPECT_EQ(alloc_->stats(1).reserved_bytes.all().current, 0);
  EXPECT_GT(alloc_->stats(0).reserved_bytes.all().current, 0);
  alloc_->empty_cache();
  for (int d = 0; d < devices(); ++d) EXPECT_EQ(alloc_->stats(d).reserved_bytes.all().current, 0);
  alloc_->validate();
}

TEST_P(MultiDevice, APointerIsFreedFromAThreadWhoseCurrentDeviceDiffers) {
  const int last = devices() - 1;
  void* p = alloc_->allocate(5 * MiB, 0x1, last);
  std::thread t([&] {
    sim_->set_current_device(0);  // this thread works on device 0
    alloc_->deallocate(p);        // the block goes back to device last's cache
  });
  t.join();
  EXPECT_EQ(alloc_->stats(last).allocated_bytes.all().current, 0);
  EXPECT_EQ(alloc_->stats(0).allocated_bytes.all().freed, 0);
  // device -1: the calling thread's current device.
  sim_->set_current_device(last);
  void* q = alloc_->allocate(MiB, 0x1);
  EXPECT_EQ(alloc_->stats(last).allocated_bytes.all().current,
            static_cast<std::int64_t>(alloc_->block_size(q)));
  alloc_->deallocate(q);
  sim_->set_current_device(0);
  alloc_->validate();
}

TEST_P(MultiDevice, TwoThreadsDriveTwoDevicesAtOnce) {
  // Several GPUs driven from one process, a thread per device (as DDP's ranks in
  // threads would), frees crossing over at the end.
  std::vector<std::vector<void*>> kept(2);
  auto drive = [&](int device) {
    sim_->set_current_device(device);
    const StreamHandle stream = 0x10 + static_cast<StreamHandle>(device);
    std::vector<void*> live;
    for (int i = 0; i < 400; ++i) {
      live.push_back(alloc_->allocate((static_cast<std::size_t>(i % 7) + 1) * 300 * 1024, stream));
      if (i % 3 == 2) {
        alloc_->deallocate(live.front());
        live.erase(live.begin());
      }
    }
    kept[static_cast<std::size_t>(device)] = live;
  };
  std::thread a(drive, 0), b(drive, 1);
  a.join();
  b.join();
  for (int d = 0; d < 2; ++d) {
    std::int64_t bytes = 0;
    for (void* p : kept[static_cast<std::size_t>(d)])
      bytes += static_cast<std::int64_t>(alloc_->block_size(p));
    EXPECT_EQ(alloc_->stats(d).allocated_bytes.all().current, bytes) << d;
  }
  // Each thread frees the other's blocks.
  std::thread c([&] {
    sim_->set_current_device(0);
    for (void* p : kept[1]) alloc_->deallocate(p);
  });
  std::thread e([&] {
    sim_->set_current_device(1);
    for (void* p : kept[0]) alloc_->deallocate(p);
  });
  c.join();
  e.join();
  for (int d = 0; d < 2; ++d) EXPECT_EQ(alloc_->stats(d).allocated_bytes.all().current, 0);
  alloc_->validate();
}

TEST_P(MultiDevice, PeersReachAndCopyOnceAccessIsEnabled) {
  char* src = static_cast<char*>(alloc_->allocate(6 * MiB, 0x1, 1));
  char* dst = static_cast<char*>(alloc_->allocate(6 * MiB, 0x1, 0));
  std::memset(src, 0x5a, 6 * MiB);
  std::string why;
  EXPECT_FALSE(sim_->can_reach(0, src, 6 * MiB, &why)) << "before peer access";
  EXPECT_NE(sim_->copy(0, dst, src, 6 * MiB), "");
  alloc_->enable_peer_access(0, 1);
  EXPECT_TRUE(sim_->can_reach(0, src, 6 * MiB, &why)) << why;
  EXPECT_EQ(sim_->copy(0, dst, src, 6 * MiB), "");
  EXPECT_EQ(dst[0], 0x5a);
  EXPECT_EQ(dst[6 * MiB - 1], 0x5a);
  EXPECT_FALSE(sim_->can_reach(1, dst, MiB)) << "peer access is one way";
  // Memory device 1 maps after access was enabled (new pages of an expandable
  // segment, or a new segment) is reachable from device 0 too.
  char* later = static_cast<char*>(alloc_->allocate(40 * MiB, 0x1, 1));
  EXPECT_TRUE(sim_->can_reach(0, later, 40 * MiB, &why)) << why;
  EXPECT_EQ(sim_->copy(0, later + MiB, dst, MiB), "");
  EXPECT_EQ(later[2 * MiB - 1], 0x5a);
  for (void* p : {static_cast<void*>(src), static_cast<void*>(dst), static_cast<void*>(later)})
    alloc_->deallocate(p);
  // After empty_cache the expandable pages are mapped afresh, with the peer's access.
  alloc_->empty_cache();
  char* again = static_cast<char*>(alloc_->allocate(8 * MiB, 0x1, 1));
  EXPECT_TRUE(sim_->can_reach(0, again, 8 * MiB, &why)) << why;
  alloc_->deallocate(again);
  alloc_->validate();
}

TEST_P(MultiDevice, InvalidDeviceIndicesAreRefused) {
  for (int bad : {devices(), devices() + 7, -2}) {
    EXPECT_THROW(alloc_->allocate(MiB, 0x1, bad), InvalidArgumentError) << bad;
    EXPECT_THROW(alloc_->stats(bad), InvalidArgumentError) << bad;
    EXPECT_THROW(alloc_->empty_cache(bad), InvalidArgumentError) << bad;
    EXPECT_THROW(alloc_->enable_peer_access(0, bad), InvalidArgumentError) << bad;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, MultiDevice,
                         ::testing::Combine(::testing::Values(2, 3, 4, 18),
                                            ::testing::Values("", "expandable_segments:True")),
                         [](const ::testing::TestParamInfo<std::tuple<int, const char*>>& p) {
                           return std::to_string(std::get<0>(p.param)) + "devices" +
                                  (*std::get<1>(p.param) ? "_expandable" : "");
                         });

}  // namespace
}  // namespace reservoir
