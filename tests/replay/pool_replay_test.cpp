// Traces with private pools (format v2's p, x, g, t, e, k, r, y and o lines): a
// program's CUDA graph captures, MemPool routes, checkpoints and restores, recorded and
// replayed, give the live run's peaks and each pool's memory under each policy; a
// recording that begins after a pool was made writes the pool as made there; the
// reader refuses pool lines against the engine's rules; settings without pools refuse
// such traces.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "replay.hpp"
#include "replay_test_util.hpp"
#include "report.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {
namespace {

using test::TempDir;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kCapacity = std::size_t{4} << 30;

// The live program's figures, read as the replay reads them: each pool's usage after
// every request routed to it and every restore, and at the end.
struct LiveRun {
  DeviceStats stats;
  std::map<std::uint64_t, PoolFigures> pools;  // by the order the trace numbers them
};

class PoolSampler {
 public:
  PoolSampler(Allocator& alloc, LiveRun& run) : alloc_(alloc), run_(run) {}
  // The trace numbers pools in order of first use; so does this.
  std::uint32_t number(PoolId id) {
    for (std::size_t k = 0; k < ids_.size(); ++k)
      if (ids_[k] == id) return static_cast<std::uint32_t>(k + 1);
    ids_.push_back(id);
    return static_cast<std::uint32_t>(ids_.size());
  }
  void sample(PoolId id) {
    const PrivatePoolUsage u = alloc_.pool_usage(id);
    PoolFigures& f = run_.pools[number(id)];
    f.peak_reserved = std::max<std::uint64_t>(f.peak_reserved, u.reserved_bytes);
    f.peak_allocated = std::max<std::uint64_t>(f.peak_allocated, u.allocated_bytes);
  }
  void* allocate(PoolId id, std::size_t size, StreamHandle stream) {
    void* p = alloc_.allocate(size, stream, 0);
    sample(id);
    return p;
  }
  void finish() {
    for (std::size_t k = 0; k < ids_.size(); ++k) {
      PoolFigures& f = run_.pools[k + 1];
      try {
        const PrivatePoolUsage u = alloc_.pool_usage(ids_[k]);
        f.end_reserved = u.reserved_bytes;
        f.end_allocated = u.allocated_bytes;
      } catch (const InvalidArgumentError&) {  // forgotten: it holds nothing
      }
    }
  }

 private:
  Allocator& alloc_;
  LiveRun& run_;
  std::vector<PoolId> ids_;
};

// Two captures into one graph pool (the second with a stream filter, as PyTorch's),
// a block used on another stream freed during a capture, a checkpoint and a restore
// (cudagraph trees), a MemPool routed by its thread with use_on_oom, its release with
// empty_cache while blocks of it are still live, and an empty_cache at the end.
LiveRun run_program(const std::string& config, const std::string& path) {
  LiveRun run;
  SimOptions so;
  so.capacity = kCapacity;
  Allocator alloc(std::make_shared<SimBackend>(so), Config::parse(config));
  PoolSampler pools(alloc, run);
  alloc.start_trace_recording(path);
  const StreamHandle s1 = 11, s2 = 22;
  std::vector<void*> eager;
  for (int i = 0; i < 6; ++i) eager.push_back(alloc.allocate((3 + 5 * i) * MiB + 512, s1, 0));
  alloc.record_stream(eager[1], s2);

  const PoolId graph{7, 0};
  alloc.begin_capture_to_pool(graph, s1);
  pools.number(graph);
  std::vector<void*> g1;
  for (int i = 0; i < 5; ++i) g1.push_back(pools.allocate(graph, (i + 1) * 3 * MiB + 100, s1));
  alloc.deallocate(eager[1]);  // used on s2: its free waits for the capture's end
  alloc.deallocate(g1[1]);     // reused within the capture
  g1[1] = pools.allocate(graph, 2 * MiB, s1);
  void* small = pools.allocate(graph, 4096, s1);
  alloc.end_allocate_to_pool(graph);

  // Checkpoints need fixed segments (a pool of expandable segments refuses them).
  const bool checkpoints = !alloc.config().expandable_segments;
  PoolCheckpoint cp;
  if (checkpoints) cp = alloc.checkpoint_pool(graph);

  alloc.begin_allocate_to_pool(graph, [s1](StreamHandle s) { return s == s1; });
  std::vector<void*> g2;
  for (int i = 0; i < 3; ++i) g2.push_back(pools.allocate(graph, (i + 2) * 4 * MiB, s1));
  alloc.deallocate(g2[0]);
  void* untouched = alloc.allocate(9 * MiB, s2, 0);  // s2 is not routed
  alloc.end_allocate_to_pool(graph);

  PoolRestore restored;
  if (checkpoints) {
    restored = alloc.restore_pool(cp);
    pools.sample(graph);
  } else {
    for (void* p : g1) alloc.deallocate(p);
    for (std::size_t i = 1; i < g2.size(); ++i) alloc.deallocate(g2[i]);
    alloc.deallocate(small);
  }

  PoolOptions options;
  options.use_on_oom = true;
  const PoolId mem = alloc.create_pool(options);
  pools.number(mem);
  alloc.begin_allocate_current_thread_to_pool(mem);
  std::vector<void*> m;
  for (int i = 0; i < 4; ++i) m.push_back(pools.allocate(mem, (i + 1) * 6 * MiB, s2));
  alloc.end_allocate_to_pool(mem);
  alloc.deallocate(m[0]);
  alloc.release_pool(mem);            // the route's use (use_mem_pool's exit)
  alloc.release_pool(mem, -1, true);  // m[1..3] still live: they give back once freed

  for (void* p : restored.allocated) alloc.deallocate(p);
  for (std::size_t i = 1; i < m.size(); ++i) alloc.deallocate(m[i]);
  alloc.deallocate(untouched);
  for (std::size_t i = 0; i < eager.size(); ++i)
    if (i != 1) alloc.deallocate(eager[i]);
  alloc.empty_cache();
  pools.finish();
  run.stats = alloc.stats(0);
  alloc.stop_trace_recording();
  alloc.release_pool(graph);
  return run;
}

class PoolReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(PoolReplay, RecordedPoolsReplayToTheLiveRunsFigures) {
  const std::string config = GetParam();
  TempDir dir;
  const std::string path = dir.file("pools.trace.gz");
  const LiveRun live = run_program(config, path);

  const Trace t = read_trace(path);
  EXPECT_EQ(t.pools, 2u);
  EXPECT_EQ(t.captures, 2u);
  const bool checkpoints = config != "expandable_segments:True";
  EXPECT_EQ(t.checkpoints, checkpoints ? 1u : 0u);
  EXPECT_EQ(t.restores, checkpoints ? 1u : 0u);
  ASSERT_EQ(t.alloc_pools.size(), t.allocations);

  ReplayOptions ro;
  ro.capacity = kCapacity;
  const ReplayResult r = replay_trace(t, config, ro);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.events, t.events.size());
  EXPECT_EQ(r.peak_requested, static_cast<std::uint64_t>(live.stats.requested_bytes.all().peak));
  EXPECT_EQ(r.peak_reserved, static_cast<std::uint64_t>(live.stats.reserved_bytes.all().peak));
  EXPECT_EQ(r.device_allocs, static_cast<std::uint64_t>(live.stats.num_device_alloc));
  EXPECT_EQ(r.device_frees, static_cast<std::uint64_t>(live.stats.num_device_free));
  ASSERT_EQ(r.pools.size(), 2u);
  for (const PoolFigures& f : r.pools) {
    SCOPED_TRACE("pool " + std::to_string(f.number));
    const PoolFigures& l = live.pools.at(f.number);
    EXPECT_GT(f.peak_reserved, 0u);
    EXPECT_EQ(f.peak_reserved, l.peak_reserved);
    EXPECT_EQ(f.peak_allocated, l.peak_allocated);
    EXPECT_EQ(f.end_reserved, l.end_reserved);
    EXPECT_EQ(f.end_allocated, l.end_allocated);
  }
  // The graph's pool keeps its memory for replays; the MemPool, released with
  // empty_cache and its blocks freed, gave it back at the empty_cache.
  EXPECT_GT(r.pools[0].end_reserved, 0u);
  EXPECT_FALSE(r.pools[0].released);
  EXPECT_TRUE(r.pools[1].released);
  EXPECT_EQ(r.pools[1].end_reserved, 0u);
  EXPECT_EQ(r.pools[1].requests, 4u);

  const std::string table = format_table(t, kCapacity, {r}, false);
  EXPECT_NE(table.find(checkpoints ? "2 private pools (2 captures, 1 checkpoints, 1 restores)"
                                   : "2 private pools (2 captures, 0 checkpoints, 0 restores)"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("pool 1: reserved at end"), std::string::npos) << table;
  EXPECT_NE(table.find("pool 2: reserved at end"), std::string::npos) << table;
  EXPECT_NE(format_json({r}, false).find("\"pools\": [{\"pool\": 1"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Policies, PoolReplay,
                         ::testing::Values("", "expandable_segments:True", "policy:compact"),
                         [](const auto& param_info) {
                           const std::string& p = param_info.param;
                           return p.empty()               ? std::string("Default")
                                  : p == "policy:compact" ? std::string("Compact")
                                                          : std::string("Expandable");
                         });

// The lines a recording writes for pools, in order.
TEST(PoolTrace, TheRecorderWritesEachPoolCall) {
  TempDir dir;
  const std::string path = dir.file("calls.trace");
  {
    Allocator alloc(std::make_shared<SimBackend>(), Config{});
    alloc.start_trace_recording(path);
    PoolOptions both;
    both.use_on_oom = true;
    both.no_split = true;
    const PoolId m = alloc.create_pool(both);
    alloc.retain_pool(m);
    alloc.begin_capture_to_pool(m, 5);
    void* a = alloc.allocate(1000, 5, 0);
    void* b = alloc.allocate(1000, 6, 0);  // another stream: not routed
    alloc.end_allocate_to_pool(m);
    alloc.deallocate(a);
    alloc.deallocate(b);
    alloc.release_pool(m);
    alloc.release_pool(m, -1, true);
    alloc.stop_trace_recording();
  }
  const std::string text = test::read_gzip(path);
  const std::string body = text.substr(text.find('\n') + 1);
  EXPECT_EQ(body,
            "p,1,use_on_oom+no_split\n"
            "p,1\n"
            "g,1,0\n"
            "a,0,1000,0,0,1\n"
            "a,1,1000,1\n"
            "e,1\n"
            "f,0\n"
            "f,1\n"
            "x,1\n"
            "x,1,empty\n");
}

// A recording that begins while a pool holds uses and a route is on writes the pool as
// made at its first line: its uses, then its route; the trace replays, and the pool's
// last release leaves it released as in the program.
TEST(PoolTrace, ARecordingThatBeginsLateWritesThePoolAsMadeThere) {
  TempDir dir;
  const std::string path = dir.file("late.trace");
  {
    Allocator alloc(std::make_shared<SimBackend>(), Config{});
    const PoolId m = alloc.create_pool();
    alloc.retain_pool(m);
    alloc.begin_allocate_current_thread_to_pool(m);  // three uses
    void* before = alloc.allocate(4 * MiB, 1, 0);    // unknown to the recording
    alloc.start_trace_recording(path);
    void* a = alloc.allocate(2 * MiB, 1, 0);
    alloc.end_allocate_to_pool(m);
    alloc.release_pool(m);
    alloc.release_pool(m);
    alloc.release_pool(m);
    alloc.deallocate(a);
    alloc.deallocate(before);
    alloc.stop_trace_recording();
  }
  const std::string text = test::read_gzip(path);
  EXPECT_NE(text.find("\np,1\np,1\nt,1\na,0,2097152,0,0,1\ne,1\nx,1\nx,1\nx,1\nf,0\n"),
            std::string::npos)
      << text;
  const Trace t = read_trace(path);
  const ReplayResult r = replay_trace(t, "");
  EXPECT_EQ(r.ooms, 0u);
  ASSERT_EQ(r.pools.size(), 1u);
  EXPECT_TRUE(r.pools[0].released);
}

// A restore's blocks: the reader takes them from the checkpoint (sizes, streams), and
// frees its y blocks; the fit's floor counts them.
TEST(PoolTrace, ARestoreFreesItsBlocksAndAllocatesTheCheckpoints) {
  const Trace t = parse_trace_text(
      "g,1,0\n"
      "a,0,100,0,0,1\n"
      "a,1,200,0,0,1\n"
      "a,2,50,0\n"  // not routed: not in the checkpoint
      "e,1\n"
      "k,1,1\n"
      "f,0\n"
      "g,1\n"
      "a,3,1000,0,0,1\n"
      "e,1\n"
      "r,1\n"
      "y,1\n"
      "y,3\n"
      "o,4,0\n"
      "o,5,1\n"
      "f,4\n"
      "f,5\n"
      "x,1\n"
      "x,1\n",
      "restore");
  EXPECT_EQ(t.allocations, 6u);
  EXPECT_EQ(t.peak_live_bytes, 1250u);  // 200 + 50 + 1000
  EXPECT_EQ(t.pool_peak_live[1], 1200u);
  EXPECT_EQ(t.live_at_end, 1u);  // ID 2
  EXPECT_EQ(t.restores, 1u);
  const ReplayResult r = replay_trace(t, "");
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.events, t.events.size());
  ASSERT_EQ(r.pools.size(), 1u);
  EXPECT_TRUE(r.pools[0].released);
}

struct BadPoolLine {
  std::string text;
  std::string error;
};
class PoolTraceErrors : public ::testing::TestWithParam<BadPoolLine> {};

TEST_P(PoolTraceErrors, AreRefusedWithTheirLine) {
  try {
    (void)parse_trace_text(GetParam().text, "p.trace");
    FAIL() << "accepted: " << GetParam().text;
  } catch (const TraceError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(GetParam().error, 0), 0u) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Lines, PoolTraceErrors,
    ::testing::Values(
        BadPoolLine{"a,0,10,0,0,1\n", "p.trace:1: pool 1 is not known (a p, g or t line"},
        BadPoolLine{"p,1\na,0,10,0,0,1\n",
                    "p.trace:2: allocation routed to pool 1, to which no route is on"},
        BadPoolLine{"p,0\n", "p.trace:1: pool number 0 is out of range (1 to 65535; 0 is no pool)"},
        BadPoolLine{"p,65536\n", "p.trace:1: pool number 65536 is out of range"},
        BadPoolLine{"p,1,oom\n", "p.trace:1: expected p,POOL[,OPTIONS] (OPTIONS use_on_oom"},
        BadPoolLine{"x,1\n", "p.trace:1: pool 1 is not known"},
        BadPoolLine{"p,1\nx,1\np,1\n",
                    "p.trace:3: pool 1 was released at line 2 (its last use dropped"},
        BadPoolLine{"p,1\nx,1,all\n", "p.trace:2: expected x,POOL[,empty], got 'x,1,all'"},
        BadPoolLine{"g,1\nt,1\n", "p.trace:2: a route to pool 1 is on already (line 1; one route"},
        BadPoolLine{"t,1,0\n", "p.trace:1: expected t,POOL, got 't,1,0'"},
        BadPoolLine{"p,1\ne,1\n", "p.trace:2: end of a route to pool 1, which has none on"},
        BadPoolLine{"p,1\nk,1,1\nk,1,1\n", "p.trace:3: checkpoint 1 is already declared (line 2)"},
        BadPoolLine{"p,1\nk,0,1\n", "p.trace:2: expected k,CKPT,POOL"},
        BadPoolLine{"r,4\n", "p.trace:1: restore of checkpoint 4, which no k line declared"},
        BadPoolLine{"p,1\nk,1,1\ng,2\nr,1\n",
                    "p.trace:4: restore of checkpoint 1 while a capture is under way"},
        BadPoolLine{"p,1\nk,1,1\nx,1\nr,1\n",
                    "p.trace:4: restore of checkpoint 1 of pool 1, released at line 3"},
        BadPoolLine{"a,0,1,0\ny,0\n", "p.trace:2: y line outside a restore (it follows an r line)"},
        BadPoolLine{"p,1\nk,1,1\nr,1\ns,0\no,1,0\n", "p.trace:5: o line outside a restore"},
        BadPoolLine{"p,1\nk,1,1\nr,1\no,1,0\n",
                    "p.trace:4: ID 0 was not a live block of pool 1 at checkpoint 1 (line 2)"},
        BadPoolLine{"g,1\na,0,5,0,0,1\ne,1\nk,1,1\nr,1\no,0,0\n",
                    "p.trace:6: ID 0 is already live (allocated at line 2 and not freed)"},
        BadPoolLine{"p,1\nr,1\n", "p.trace:2: restore of checkpoint 1, which no k line declared"}));

// The capture ladder: each capture's requests, the reserved growth during it, and what
// the pools reserve at its end, as a program that captures three graphs into one pool
// (largest first, as engines do) left them.
TEST(PoolTrace, EachCaptureReportsWhatTheGraphsHoldSoFar) {
  std::string text = "a,0," + std::to_string(300 * MiB) + ",0\n";  // weights, before
  std::uint64_t id = 1;
  for (std::uint64_t batch : {32, 16, 8}) {
    text += "g,1,0\n";
    for (int layer = 0; layer < 4; ++layer)
      text += "a," + std::to_string(id++) + "," + std::to_string(batch * MiB / 2) + ",0,0,1\n";
    for (int layer = 1; layer < 4; ++layer) text += "f," + std::to_string(id - layer - 1) + "\n";
    text += "e,1\n";
  }
  const Trace t = parse_trace_text(text, "ladder");
  const ReplayResult r = replay_trace(t, "");
  ASSERT_EQ(r.captures.size(), 3u);
  for (const CaptureFigures& c : r.captures) {
    EXPECT_TRUE(c.ended);
    EXPECT_EQ(c.requests, 4u);
  }
  EXPECT_EQ(r.captures[0].requested_bytes, 4 * 16 * MiB);
  // The first graph maps what it needs; the smaller ones fit in what its frees left,
  // beside the blocks it keeps: the pool grows by less each time, never shrinks.
  EXPECT_EQ(r.captures[0].reserved_after - r.captures[0].reserved_before,
            r.captures[0].pools_reserved_after);
  EXPECT_LE(r.captures[0].pools_reserved_after, r.captures[1].pools_reserved_after);
  EXPECT_LE(r.captures[1].pools_reserved_after, r.captures[2].pools_reserved_after);
  EXPECT_EQ(r.captures[2].pools_reserved_after, r.pools[0].end_reserved);
  const std::string table = format_table(t, kCapacity, {r}, false);
  EXPECT_NE(table.find("captures under default"), std::string::npos) << table;
  EXPECT_NE(format_json({r}, false).find("\"captures\": [{\"pool\": 1, \"requests\": 4"),
            std::string::npos);
}

// The KV cache question: the largest cache that still lets the program run on the
// budget, made before its first capture. A program that profiles with 1 GiB, then
// loads 512 MiB of weights (into half of the profiling's cached segment, whose other
// half no larger request can use) and captures a 256 MiB graph leaves, on a 4 GiB
// device, 4 - 1 - 0.25 GiB for the cache; a cache one token larger does not run.
TEST(PoolTrace, TheKvCacheIsTheLargestThatStillRuns) {
  const std::string text = "a,0," + std::to_string(1024 * MiB) + ",0\n" +  // profiling
                           "f,0\n" + "a,1," + std::to_string(512 * MiB) + ",0\n" +  // weights
                           "g,1,0\n" + "a,2," + std::to_string(256 * MiB) + ",0,0,1\n" +
                           "e,1\n";
  const Trace t = parse_trace_text(text, "kv");
  constexpr std::uint64_t kPerToken = 64 * 1024;
  const KvCacheFit k = kv_cache_fit(t, "", kPerToken, std::uint64_t{4} << 30, 4);
  ASSERT_TRUE(k.fits);
  EXPECT_EQ(k.at_event, 3u);  // the g line
  EXPECT_EQ(k.tokens * kPerToken, (std::uint64_t{11} << 30) / 4);  // 2.75 GiB
  auto runs = [&](std::uint64_t tokens) {
    ReplayOptions ro;
    ro.capacity = std::uint64_t{4} << 30;
    ro.extra_at = k.at_event;
    ro.extra_sizes.assign(4, (tokens * kPerToken + 3) / 4);
    return replay_trace(t, "", ro).ooms == 0;
  };
  EXPECT_TRUE(runs(k.tokens));
  EXPECT_FALSE(runs(k.tokens + 1));
  // A budget the program alone does not fit: no cache.
  EXPECT_FALSE(kv_cache_fit(t, "", kPerToken, std::uint64_t{1} << 29, 1).fits);
  ReplayResult r;
  r.kv_cache = k;
  EXPECT_NE(describe_kv_cache(r).find("tokens of 64.00 KiB"), std::string::npos)
      << describe_kv_cache(r);
}

// A restore whose freed blocks the trace does not list (edited by hand, or of a program
// whose pools the replay does not reproduce) stops the replay, naming the event.
TEST(PoolTrace, ARestoreThatDivergesStopsTheReplay) {
  const Trace t = parse_trace_text("g,1,0\na,0,4096,0,0,1\ne,1\nk,1,1\nr,1\n", "diverged");
  try {
    (void)replay_trace(t, "");
    FAIL() << "replayed";
  } catch (const TraceError& e) {
    EXPECT_EQ(std::string(e.what()),
              "diverged: the replay's restore of checkpoint 1 (event 4) freed a block the "
              "recorded restore did not: the replay diverged from the program (its pools hold "
              "other blocks)");
  }
}

// Settings that keep no pools refuse a trace that routes to them, before replaying.
TEST(PoolTrace, SettingsWithoutPoolsRefuseTheTrace) {
  const Trace routed = parse_trace_text("g,1\na,0,64,0,0,1\ne,1\n", "routed");
  const std::string why = trace_refusal(routed, "backend:cudaMallocAsync");
  EXPECT_NE(why.find("the trace routes requests to private pools (1 pools, 1 captures)"),
            std::string::npos)
      << why;
  EXPECT_EQ(trace_refusal(routed, ""), "");
  EXPECT_EQ(trace_refusal(routed, "policy:compact"), "");
}

}  // namespace
}  // namespace reservoir::replay
