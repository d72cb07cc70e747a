// Private pools whose segments come from a SegmentSource (PyTorch's
// MemPool(allocator=...)): segments from the source, blocks split and cached inside
// them, counted as any pool's; given back through the source once free, after the
// pool's stream; its failures surface as the spec's (out of memory: the ladder, then
// OutOfMemoryError; anything else: DeviceError naming the source); never expandable.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/segment_source.hpp"
#include "reservoir/sim_backend.hpp"
#include "support/sim_allocator.hpp"

namespace reservoir {
namespace {

using test::SimAllocator;
constexpr std::size_t MiB = std::size_t{1} << 20;

// Device memory of the simulated device, through the program's own calls: what a
// communication library's or a sleep/wake allocator's source does.
class CountingSource final : public SegmentSource {
 public:
  explicit CountingSource(std::shared_ptr<SimBackend> sim) : sim_(std::move(sim)) {}
  DeviceStatus allocate(int device, std::size_t size, StreamHandle stream, void** ptr) override {
    ++allocs;
    last_stream = stream;
    if (refuse != DeviceStatus::ok) return refuse;
    const DeviceStatus st = sim_->allocate(device, size, ptr);
    if (st == DeviceStatus::ok) {
      if (misalign) *ptr = static_cast<char*>(*ptr) + 256;
      live.push_back({*ptr, size});
    }
    return st;
  }
  DeviceStatus deallocate(int device, void* ptr, std::size_t size, StreamHandle stream) override {
    ++frees;
    syncs_at_free.push_back(sim_->counters().stream_syncs);
    last_stream = stream;
    for (auto it = live.begin(); it != live.end(); ++it)
      if (it->first == ptr && it->second == size) {
        live.erase(it);
        void* base = misalign ? static_cast<char*>(ptr) - 256 : ptr;
        return sim_->deallocate(device, base, size);
      }
    return DeviceStatus::error;  // not one of ours: the test fails on live below
  }
  std::string last_error() const override { return "the test's source said no"; }

  std::shared_ptr<SimBackend> sim_;
  int allocs = 0, frees = 0;
  StreamHandle last_stream = 0;
  DeviceStatus refuse = DeviceStatus::ok;
  bool misalign = false;
  std::vector<std::pair<void*, std::size_t>> live;
  std::vector<std::uint64_t> syncs_at_free;
};

struct Rig {
  explicit Rig(const std::string& config = "") : s(config) {
    source = std::make_shared<CountingSource>(s.sim);
    pool = s.a.create_pool(source, {}, 0);
  }
  // A request routed to the pool (this thread).
  void* alloc(std::size_t size, StreamHandle stream = 1) {
    s.a.begin_allocate_current_thread_to_pool(pool, 0);
    struct End {
      Rig& r;
      ~End() {
        r.s.a.end_allocate_to_pool(r.pool, 0);
        r.s.a.release_pool(r.pool, 0);  // the route's use
      }
    } end{*this};
    return s.a.allocate(size, stream, 0);
  }
  SimAllocator s;
  std::shared_ptr<CountingSource> source;
  PoolId pool;
};

TEST(SegmentSource, SegmentsComeFromTheSourceAndBlocksAreCachedInsideThem) {
  Rig r;
  void* a = r.alloc(MiB / 2);
  void* b = r.alloc(MiB / 2);  // the same 2 MiB segment, split
  EXPECT_EQ(r.source->allocs, 1);
  EXPECT_EQ(r.source->last_stream, 1u);
  ASSERT_EQ(r.source->live.size(), 1u);
  const auto base = reinterpret_cast<std::uintptr_t>(r.source->live[0].first);
  for (void* p : {a, b}) {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    EXPECT_TRUE(at >= base && at < base + r.source->live[0].second) << "not in the source's segment";
  }
  EXPECT_EQ(r.s.a.stats(0).private_pool_reserved_bytes, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(r.s.a.stats(0).reserved_bytes.all().current, static_cast<std::int64_t>(2 * MiB));
  r.s.a.deallocate(a);
  void* again = r.alloc(MiB / 2);  // cached: no new segment
  EXPECT_EQ(again, a);
  EXPECT_EQ(r.source->allocs, 1);
  r.s.a.deallocate(again);
  r.s.a.deallocate(b);
  r.s.a.empty_cache();  // the pool lives: its memory stays
  EXPECT_EQ(r.source->frees, 0);
  r.s.a.release_pool(r.pool, 0);
  const std::uint64_t syncs = r.s.sim->counters().stream_syncs;
  r.s.a.empty_cache();
  EXPECT_EQ(r.source->frees, 1);
  EXPECT_TRUE(r.source->live.empty()) << "a segment was not given back through the source";
  ASSERT_EQ(r.source->syncs_at_free.size(), 1u);
  EXPECT_GT(r.source->syncs_at_free[0], syncs) << "the pool's stream was not waited for first";
  EXPECT_EQ(r.s.a.stats(0).reserved_bytes.all().current, 0);
  r.s.a.validate();
}

TEST(SegmentSource, ItsOutOfMemoryRunsTheLadderAndItsErrorsNameIt) {
  Rig r;
  r.source->refuse = DeviceStatus::out_of_memory;
  EXPECT_THROW(r.alloc(4 * MiB), OutOfMemoryError);
  r.source->refuse = DeviceStatus::error;
  try {
    r.alloc(4 * MiB);
    ADD_FAILURE() << "served";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("segment source of private pool"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("the test's source said no"), std::string::npos)
        << e.what();
  }
  r.source->refuse = DeviceStatus::ok;
  r.source->misalign = true;  // a segment the pool cannot use: given straight back
  EXPECT_THROW(r.alloc(4 * MiB), DeviceError);
  EXPECT_TRUE(r.source->live.empty());
  EXPECT_EQ(r.s.a.stats(0).reserved_bytes.all().current, 0);
  r.source->misalign = false;
  void* p = r.alloc(4 * MiB);
  r.s.a.deallocate(p);
  r.s.a.release_pool(r.pool, 0);
  r.s.a.empty_cache();
  EXPECT_TRUE(r.source->live.empty());
  r.s.a.validate();
}

// Expandable segments and policy:compact leave such a pool's segments to its source.
TEST(SegmentSource, UnderEveryPolicyThePoolsSegmentsAreTheSources) {
  for (const char* config : {"expandable_segments:True", "policy:compact"}) {
    SCOPED_TRACE(config);
    Rig r(config);
    void* p = r.alloc(3 * MiB);
    EXPECT_EQ(r.source->allocs, 1);
    for (const SegmentInfo& seg : r.s.a.snapshot().segments) {
      if (seg.pool == r.pool) {
        EXPECT_FALSE(seg.is_expandable);
      }
    }
    void* eager = r.s.a.allocate(3 * MiB, 1, 0);  // not routed: the device's
    EXPECT_EQ(r.source->allocs, 1);
    r.s.a.deallocate(eager);
    r.s.a.deallocate(p);
    r.s.a.release_pool(r.pool, 0);
    r.s.a.empty_cache();
    EXPECT_TRUE(r.source->live.empty());
    r.s.a.validate();
  }
}

// The pool's stream released (it may be destroyed): the whole device is waited for
// before a segment goes back through the source, not the stream.
TEST(SegmentSource, AfterItsStreamIsReleasedTheDeviceIsWaitedFor) {
  Rig r;
  r.s.a.deallocate(r.alloc(3 * MiB, 5));
  r.s.a.release_stream(5, 0);
  r.s.a.release_pool(r.pool, 0);
  const SimCounters before = r.s.sim->counters();
  r.s.a.empty_cache();
  EXPECT_EQ(r.source->frees, 1);
  EXPECT_GT(r.s.sim->counters().device_syncs, before.device_syncs);
  EXPECT_TRUE(r.source->live.empty());
  r.s.a.validate();
}

TEST(SegmentSource, ANullSourceIsRefused) {
  SimAllocator s;
  EXPECT_THROW(s.a.create_pool(std::shared_ptr<SegmentSource>{}, {}, 0), InvalidArgumentError);
}

}  // namespace
}  // namespace reservoir
