// Snapshots: totals against the statistics, the pickle read back by Python's pickle
// (check_snapshot.py), context frames, I/O errors, and the OOM report.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "front/snapshot_pickle.hpp"
#include "observability/sim_allocator.hpp"

namespace reservoir {
namespace {

using test::check_snapshot;
using test::file_exists;
using test::kMiB;
using test::SimAllocator;
using test::temp_path;

// Mixed sizes on two streams, some frees pending on a third stream.
std::vector<void*> mixed_workload(SimAllocator& s, int ops) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> lg(8.0, 26.0);
  std::vector<void*> live;
  for (int i = 0; i < ops; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      std::size_t k = rng() % live.size();
      if (rng() % 4 == 0) s.a.record_stream(live[k], 9);
      s.a.deallocate(live[k]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      const auto size = static_cast<std::size_t>(std::pow(2.0, lg(rng))) + rng() % 511;
      live.push_back(s.a.allocate(size, 1 + rng() % 2, 0));
    }
  }
  return live;
}

TEST(Snapshot, TotalsEqualTheStatistics) {
  SimAllocator s;
  std::vector<void*> live = mixed_workload(s, 600);
  const Snapshot snap = s.a.snapshot();
  const DeviceStats st = s.a.stats(0);
  std::int64_t total[3] = {}, allocated[3] = {}, active[3] = {}, requested[3] = {};
  for (const SegmentInfo& seg : snap.segments) {
    for (int pool : {0, seg.is_large ? 2 : 1}) {
      total[pool] += static_cast<std::int64_t>(seg.total_size);
      allocated[pool] += static_cast<std::int64_t>(seg.allocated_size);
      active[pool] += static_cast<std::int64_t>(seg.active_size);
      requested[pool] += static_cast<std::int64_t>(seg.requested_size);
    }
  }
  for (int pool = 0; pool < kPoolKinds; ++pool) {
    EXPECT_EQ(total[pool], st.reserved_bytes.pool[pool].current) << pool;
    EXPECT_EQ(allocated[pool], st.allocated_bytes.pool[pool].current) << pool;
    EXPECT_EQ(active[pool], st.active_bytes.pool[pool].current) << pool;
    EXPECT_EQ(requested[pool], st.requested_bytes.pool[pool].current) << pool;
  }
  EXPECT_EQ(static_cast<std::int64_t>(snap.segments.size()), st.segment.all().current);
  EXPECT_GT(st.active_bytes.all().current, st.allocated_bytes.all().current);  // some pending
  for (void* p : live) s.a.deallocate(p);
}

// The settings PyTorch's snapshot reports follow the configuration in force.
TEST(Snapshot, SettingsFollowTheConfiguration) {
  SimAllocator s;
  EXPECT_FALSE(s.a.snapshot().graph_capture_record_stream_reuse);
  s.a.set_allocator_settings(
      "graph_capture_record_stream_reuse:True,release_lock_on_cudamalloc:True");
  const Snapshot snap = s.a.snapshot();
  EXPECT_TRUE(snap.graph_capture_record_stream_reuse);
  EXPECT_TRUE(snap.release_lock_on_cudamalloc);
  EXPECT_EQ(snap.settings,
            "release_lock_on_cudamalloc:True,graph_capture_record_stream_reuse:True");
}

TEST(Snapshot, BlocksTileTheirSegmentInAddressOrder) {
  SimAllocator s;
  std::vector<void*> live = mixed_workload(s, 300);
  const Snapshot snap = s.a.snapshot();
  ASSERT_FALSE(snap.segments.empty());
  for (std::size_t i = 0; i < snap.segments.size(); ++i) {
    const SegmentInfo& seg = snap.segments[i];
    if (i) {
      EXPECT_LT(snap.segments[i - 1].address, seg.address);
    }
    std::uintptr_t next = seg.address;
    std::size_t allocated = 0;
    for (const BlockInfo& b : seg.blocks) {
      EXPECT_EQ(b.address, next);
      next += b.size;
      if (b.state == BlockStateInfo::active_allocated) allocated += b.size;
      if (b.state == BlockStateInfo::inactive) {
        EXPECT_EQ(b.requested_size, 0u);
      }
    }
    EXPECT_EQ(next, seg.address + seg.total_size);
    EXPECT_EQ(allocated, seg.allocated_size);
  }
  for (void* p : live) s.a.deallocate(p);
}

TEST(Snapshot, ContextStringsBecomeFrames) {
  using detail::context_frames;
  auto frames = context_frames("model.py:42 forward\ntrain.py:7 <module>\n");
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].filename, "model.py");
  EXPECT_EQ(frames[0].line, 42);
  EXPECT_EQ(frames[0].name, "forward");
  EXPECT_EQ(frames[1].name, "<module>");
  frames = context_frames("/a:b/c.py:9:fn::inner");  // PyTorch's "file:line:name"
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].filename, "/a:b/c.py");
  EXPECT_EQ(frames[0].line, 9);
  EXPECT_EQ(frames[0].name, "fn::inner");
  frames = context_frames("x.py:3");
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].name, "");
  frames = context_frames("step 12 of epoch 3\nx.py:3 f\n");  // not all frames: one
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].filename, "step 12 of epoch 3\nx.py:3 f");
  EXPECT_EQ(frames[0].line, 0);
  EXPECT_TRUE(context_frames("").empty());
}

TEST(Snapshot, PickleRoundTripsThroughPython) {
  SimAllocator s;
  s.a.record_history(true, 100000, ContextLevel::all, [] { return "demo.py:42 train_step"; });
  s.a.record_annotation("forward", "START", 0);
  std::vector<void*> live = mixed_workload(s, 1000);  // > 1000 entries: batched lists
  const std::string path = temp_path("roundtrip.pickle");
  s.a.dump_snapshot(path);
  const DeviceStats st = s.a.stats(0);
  const int rc = check_snapshot(
      path, "--reserved " + std::to_string(st.reserved_bytes.all().current) + " --allocated " +
                std::to_string(st.allocated_bytes.all().current) + " --active " +
                std::to_string(st.active_bytes.all().current) + " --requested " +
                std::to_string(st.requested_bytes.all().current) +
                " --frame demo.py:42:train_step --annotation forward:START --min-entries 1001");
  std::remove(path.c_str());
  if (rc == -1) GTEST_SKIP() << "no Python interpreter";
  EXPECT_EQ(rc, 0);
  for (void* p : live) s.a.deallocate(p);
}

TEST(Snapshot, EncodesEdgeValuesExactly) {
  // Integers at every opcode boundary, invalid UTF-8, and SIZE_MAX written as -1.
  Snapshot snap;
  SegmentInfo seg;
  seg.address = 0x7fff00000000;
  seg.total_size = std::size_t{1} << 31;
  seg.is_large = true;
  seg.stream = std::uintptr_t{1} << 40;
  const std::size_t sizes[] = {255, 65535, 65536, seg.total_size - 255 - 65535 - 65536};
  const BlockStateInfo states[] = {BlockStateInfo::active_allocated,
                                   BlockStateInfo::active_pending_free, BlockStateInfo::inactive,
                                   BlockStateInfo::inactive};
  std::uintptr_t at = seg.address;
  for (int i = 0; i < 4; ++i) {
    BlockInfo b;
    b.address = at;
    b.size = sizes[i];
    b.state = states[i];
    b.requested_size = i == 0 ? 200 : i == 1 ? sizes[1] : 0;
    at += b.size;
    seg.blocks.push_back(b);
  }
  seg.blocks[0].context = std::make_shared<const std::string>("a.py:12 f\nb.py:3 <module>");
  seg.allocated_size = 255;
  seg.active_size = 255 + 65535;
  seg.requested_size = 200 + 65535;
  snap.segments.push_back(seg);
  auto entry = [](TraceAction action, std::uintptr_t address, const char* context) {
    TraceEntry e;
    e.action = action;
    e.address = address;
    e.size = 1;
    e.time_us = (std::uint64_t{1} << 53) + 1;
    if (context) e.context = std::make_shared<const std::string>(context);
    return e;
  };
  snap.device_traces.push_back({entry(TraceAction::alloc, 0, "no frame here"),
                                entry(TraceAction::alloc, 0x7fffffffffffffff, "bad\xff.py:1 g"),
                                entry(TraceAction::segment_alloc, ~std::uintptr_t{0}, nullptr),
                                entry(TraceAction::oom, 12345, nullptr)});
  snap.annotations.push_back(Annotation{0, 99, "backward", "END"});
  snap.settings = "max_split_size_mb:\xc3\xa9";
  snap.max_split_size = ~std::size_t{0};
  snap.garbage_collection_threshold = 0.8;
  snap.graph_capture_record_stream_reuse = true;
  for (std::size_t i = 1; i <= kRoundupIntervals; ++i) snap.roundup_power2_divisions.push_back(i);
  const std::string path = temp_path("crafted.pickle");
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string bytes = detail::snapshot_pickle(snap);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  const int rc = check_snapshot(path, "--crafted");
  std::remove(path.c_str());
  if (rc == -1) GTEST_SKIP() << "no Python interpreter";
  EXPECT_EQ(rc, 0);
}

TEST(Snapshot, DumpToAnUnwritablePathThrowsNamingIt) {
  SimAllocator s;
  s.a.deallocate(s.a.allocate(4096, 1, 0));
  const std::string path = "/nonexistent-dir/reservoir/snap.pickle";
  try {
    s.a.dump_snapshot(path);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Snapshot, OomWithOomSnapshotWritesTheFile) {
  SimOptions o;
  o.capacity = 64 * kMiB;
  const std::string path = temp_path("oom.pickle");
  SimAllocator s("oom_snapshot:" + path, o);
  s.a.record_history(true, 1000);
  void* p = s.a.allocate(40 * kMiB, 1, 0);
  try {
    s.a.allocate(40 * kMiB, 1, 0);
    FAIL() << "no OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("out of memory"), std::string::npos) << what;
    EXPECT_NE(what.find("A snapshot was written to " + path + "."), std::string::npos) << what;
  }
  ASSERT_TRUE(file_exists(path));
  EXPECT_EQ(s.a.stats(0).num_ooms, 1);
  const int rc = check_snapshot(path, "--oom --allocated " + std::to_string(40 * kMiB));
  std::remove(path.c_str());
  if (rc != -1) {
    EXPECT_EQ(rc, 0);
  }
  s.a.deallocate(p);
}

TEST(Snapshot, OomSnapshotWriteFailureDoesNotMaskTheOom) {
  SimOptions o;
  o.capacity = 64 * kMiB;
  const std::string path = "/nonexistent-dir/oom.pickle";
  SimAllocator s("oom_snapshot:" + path, o);
  void* p = s.a.allocate(40 * kMiB, 1, 0);
  try {
    s.a.allocate(40 * kMiB, 1, 0);
    FAIL() << "no OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("(writing the OOM snapshot to " + path + " failed: "), std::string::npos)
        << what;
    EXPECT_EQ(what.find("A snapshot was written"), std::string::npos) << what;
  }
  s.a.deallocate(p);
  s.a.validate();
}

}  // namespace
}  // namespace reservoir
