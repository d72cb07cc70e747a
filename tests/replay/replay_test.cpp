// Replays through the engine on SimBackend: figures, OOM handling, timeline, fit
// search on the memory fraction, explanations, and the recorder -> reader -> replay
// round trip.
#include "replay.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "explain.hpp"
#include "replay_test_util.hpp"
#include "report.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {
namespace {

using test::TempDir;
constexpr std::uint64_t MiB = std::uint64_t{1} << 20;

// A device that lags (work completes at host waits): as in PyTorch, a freed block used
// on another stream stays counted in requested (and reserved) bytes until that
// stream's work at the free completes. In the sample trace block 0 (1 MiB, used on
// stream 1) is freed after the last "s,1", so it stays pending to the end: the peak is
// the trace's live peak plus 1 MiB.
ReplayOptions lagging() {
  ReplayOptions o;
  o.device_keeps_up = false;
  return o;
}

TEST(Replay, SampleTraceFigures) {
  const Trace t = parse_trace_text(test::sample_trace_text(), "sample");
  const ReplayResult r = replay_trace(t, "", lagging());
  EXPECT_EQ(r.config, "");
  EXPECT_EQ(r.events, 10u);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(t.peak_live_bytes, 35651584u);  // 32 MiB + 2 MiB live at event 8
  EXPECT_EQ(r.peak_requested, 35651584u + MiB);
  // Allocated at event 8: blocks 2 (32 MiB) and 3 (2 MiB); block 0 is pending, not
  // allocated. Reserved: a 2 MiB small segment (blocks 0 and 1), a 32 MiB segment for
  // block 2, and for block 3 (< 10 MiB, the pending block's segment being small) a
  // 20 MiB large segment; nothing is given back.
  EXPECT_EQ(r.peak_allocated, 32 * MiB + 2 * MiB);
  EXPECT_EQ(r.peak_reserved, (2 + 32 + 20) * MiB);
  EXPECT_EQ(r.device_allocs, 3u);
  EXPECT_EQ(r.device_frees, 0u);
  EXPECT_DOUBLE_EQ(r.ratio, 54.0 / 35.0);
  EXPECT_TRUE(r.timeline.requested.empty());

  const std::string json = format_json({r}, false);
  EXPECT_NE(json.find("\"peak_requested\": 36700160"), std::string::npos) << json;
}

// By default the device keeps up (as a GPU replaying the trace): the free of block 0
// completes at once, and the peak is the trace's live peak.
TEST(Replay, TheDeviceKeepsUpByDefault) {
  const Trace t = parse_trace_text(test::sample_trace_text(), "sample");
  const ReplayResult r = replay_trace(t, "");
  EXPECT_EQ(r.peak_requested, 35651584u);
  EXPECT_EQ(replay_trace(t, "", lagging()).peak_requested, 35651584u + MiB);
}

// Moving the host wait after the free completes the pending use: the block is
// released and the peak is the trace's live peak.
TEST(Replay, HostWaitReleasesBlocksUsedOnOtherStreams) {
  std::string text = test::sample_trace_text();
  const std::string wait = "s,1\n";
  text.erase(text.find(wait), wait.size());
  text.insert(text.find("a,3,"), wait);
  const Trace t = parse_trace_text(text, "sample2");
  const ReplayResult r = replay_trace(t, "", lagging());  // see SampleTraceFigures
  EXPECT_EQ(r.peak_requested, 35651584u);
  EXPECT_EQ(r.ooms, 0u);
}

// --calls: every device call the allocator makes is counted (and timed) by kind; the
// counts are the device's own.
TEST(Replay, DeviceCallsAreCountedByKind) {
  const Trace t = parse_trace_text(test::sample_trace_text(), "sample");
  for (const char* config : {"", "policy:compact"}) {
    SCOPED_TRACE(config);
    auto sim = std::make_shared<SimBackend>(SimOptions{});
    ReplayOptions o;
    o.backend = sim;
    o.profile_calls = true;
    const ReplayResult r = replay_trace(t, config, o);
    auto count = [&](CallKind k) -> std::uint64_t {
      for (const CallCount& c : r.calls)
        if (c.kind == k) return c.count;
      return 0;
    };
    const SimCounters c = sim->counters();
    EXPECT_EQ(count(CallKind::allocate), c.allocs);
    EXPECT_EQ(count(CallKind::create_physical), c.physical_creates);
    EXPECT_EQ(count(CallKind::map), c.maps);
    EXPECT_EQ(count(CallKind::record_event), c.events_recorded);
    EXPECT_EQ(count(CallKind::allocate) + count(CallKind::create_physical), r.device_allocs);
    EXPECT_GT(count(CallKind::allocate) + count(CallKind::map), 0u);
    for (const CallCount& k : r.calls) EXPECT_GT(k.count, 0u) << to_string(k.kind);
    const std::string json = format_json({r}, false);
    EXPECT_NE(json.find("\"calls\": {"), std::string::npos) << json;
  }
  // Off by default: nothing counted, no "calls" key.
  const ReplayResult plain = replay_trace(t, "");
  EXPECT_TRUE(plain.calls.empty());
  EXPECT_EQ(format_json({plain}, false).find("calls"), std::string::npos);
}

TEST(Replay, BadConfigThrowsConfigError) {
  const Trace t = parse_trace_text(test::sample_trace_text(), "sample");
  EXPECT_THROW(replay_trace(t, "no_such_key:1"), ConfigError);
}

TEST(Replay, OomIsCountedAndTheReplayGoesOn) {
  const Trace t = parse_trace_text(
      "a,0,41943040,0\n"  // 40 MiB
      "a,1,41943040,0\n"  // 40 MiB more: does not fit in 64 MiB
      "u,1,1\n"           // uses and frees of the failed allocation are skipped
      "f,1\n"
      "f,0\n"
      "a,2,10485760,0\n"
      "f,2\n",
      "oom");
  ReplayOptions o;
  o.capacity = 64 * MiB;
  const ReplayResult r = replay_trace(t, "", o);
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.events, 7u);
  ASSERT_TRUE(r.first_oom.has_value());
  EXPECT_EQ(r.peak_requested, 40 * MiB);

  o.stop_at_first_oom = true;
  const ReplayResult s = replay_trace(t, "", o);
  EXPECT_EQ(s.ooms, 1u);
  EXPECT_EQ(s.events, 2u);
}

// The first OOM in the trace's terms: its event, its trace stream (not the device
// stream handle), and the allocator's state after the ladder.
TEST(Replay, OomFactsSpeakOfTheTrace) {
  const Trace t = parse_trace_text(
      "a,0,41943040,3\n"
      "s,3\n"
      "a,1,41943040,3\n"
      "f,0\n",
      "oom");
  ReplayOptions o;
  o.capacity = 64 * MiB;
  const ReplayResult r = replay_trace(t, "", o);
  ASSERT_TRUE(r.first_oom.has_value());
  const OomFacts& f = *r.first_oom;
  EXPECT_EQ(f.event, 2u);
  EXPECT_EQ(f.stream, 3u);
  EXPECT_EQ(f.requested, 40 * MiB);
  EXPECT_EQ(f.device_request, 40 * MiB);
  EXPECT_EQ(f.device_total, 64 * MiB);
  EXPECT_EQ(f.device_free, 24 * MiB);
  EXPECT_EQ(f.reserved, 40 * MiB);
  EXPECT_EQ(f.allocated, 40 * MiB);
  EXPECT_EQ(f.allowed, 0u);
  EXPECT_TRUE(f.simulated);
  const std::string m = describe_oom(f);
  EXPECT_NE(m.find("event 2 (an allocation of 40.00 MiB on trace stream 3)"), std::string::npos)
      << m;

  // Under a memory fraction the cap is named.
  o.capacity = 128 * MiB;
  o.memory_fraction = 0.5;
  const ReplayResult capped = replay_trace(t, "", o);
  ASSERT_TRUE(capped.first_oom.has_value());
  EXPECT_EQ(capped.first_oom->allowed, 64 * MiB);
  EXPECT_DOUBLE_EQ(capped.first_oom->fraction, 0.5);
  EXPECT_NE(describe_oom(*capped.first_oom).find("memory fraction 0.5 allows 64.00 MiB"),
            std::string::npos);
}

// Streams are numbered freely below 65536: 3 and 65535 are two streams.
TEST(Replay, SparseStreamNumbers) {
  const Trace t = parse_trace_text("a,0,4096,3\na,1,4096,65535\nu,0,65535\nf,0\nf,1\n", "sparse");
  EXPECT_EQ(t.streams, 2u);
  EXPECT_EQ(t.stream_ids, (std::vector<std::uint16_t>{3, 65535}));
  const ReplayResult r = replay_trace(t, "");
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.events, 5u);
}

TEST(Replay, TimelineKeepsTheMaximumPerBucket) {
  const Trace t = parse_trace_text(test::sample_trace_text(), "sample");
  ReplayOptions o = lagging();
  o.timeline_points = 4;
  const ReplayResult r = replay_trace(t, "", o);
  EXPECT_EQ(r.timeline.bucket, 3u);
  // Block 0 stays pending (see SampleTraceFigures): 1 MiB from event 6 on.
  const std::vector<std::uint64_t> requested = {34607104, 34607104, 36700160, 1048576};
  EXPECT_EQ(r.timeline.requested, requested);
  ASSERT_EQ(r.timeline.reserved.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_GE(r.timeline.reserved[i], requested[i]);
}

TEST(Replay, ProgressIsReported) {
  const Trace t = parse_trace_text(test::sample_trace_text(), "sample");
  ReplayOptions o;
  std::size_t calls = 0, last = 0;
  o.progress = [&](std::size_t done, std::size_t total) {
    ++calls;
    last = done;
    EXPECT_EQ(total, 10u);
  };
  replay_trace(t, "", o);
  EXPECT_GE(calls, 2u);
  EXPECT_EQ(last, 10u);
}

// A trace whose peak is reached twice with different layouts, so the cache
// matters: the fit lies between peak requested and peak reserved.
std::string fragmenting_trace() {
  std::string s;
  std::uint64_t id = 0;
  for (int round = 0; round < 4; ++round) {
    const std::uint64_t a = id++, b = id++, c = id++;
    s += "a," + std::to_string(a) + "," + std::to_string((6 + round) * MiB + 4096) + ",0\n";
    s += "a," + std::to_string(b) + "," + std::to_string(20 * MiB - 512 * round) + ",0\n";
    s += "f," + std::to_string(a) + "\n";
    s += "a," + std::to_string(c) + "," + std::to_string((9 - round) * MiB) + ",0\n";
    s += "f," + std::to_string(b) + "\nf," + std::to_string(c) + "\n";
  }
  return s;
}

// PyTorch's meaning: the smallest memory fraction of the device under which the
// trace runs, to the relative precision asked; a little less fails.
TEST(Fit, SmallestMemoryFractionThatRunsWithoutOom) {
  const Trace t = parse_trace_text(fragmenting_trace(), "frag");
  const ReplayResult unconstrained = replay_trace(t, "");
  ASSERT_EQ(unconstrained.ooms, 0u);
  int steps = 0;
  FitOptions fo;
  fo.device_total = std::size_t{1} << 30;
  fo.on_step = [&](int run) { EXPECT_EQ(run, ++steps); };
  const FitResult f = fit_memory_fraction(t, "", unconstrained, fo);
  ASSERT_TRUE(f.fraction.has_value());
  ASSERT_TRUE(f.capacity.has_value());
  EXPECT_EQ(steps, f.runs);
  EXPECT_EQ(f.device_total, fo.device_total);
  EXPECT_EQ(*f.capacity,
            static_cast<std::uint64_t>(*f.fraction * static_cast<double>(fo.device_total)));
  EXPECT_GE(*f.capacity, unconstrained.peak_requested);
  EXPECT_LE(*f.capacity, unconstrained.peak_reserved + unconstrained.peak_reserved / 100);

  ReplayOptions at;
  at.capacity = fo.device_total;
  at.memory_fraction = *f.fraction;
  EXPECT_EQ(replay_trace(t, "", at).ooms, 0u) << "fit " << *f.fraction;
  at.memory_fraction = *f.fraction * (1 - 1.5 * fo.precision);
  EXPECT_GT(replay_trace(t, "", at).ooms, 0u) << "fit " << *f.fraction;
}

// The fit is memory, not a share: on a device twice as large the fraction halves and
// the bytes stay (within the precision).
TEST(Fit, BytesDoNotDependOnTheDeviceSize) {
  const Trace t = parse_trace_text(fragmenting_trace(), "frag");
  const ReplayResult unconstrained = replay_trace(t, "");
  FitOptions small, large;
  small.device_total = std::size_t{1} << 30;
  large.device_total = std::size_t{2} << 30;
  const FitResult a = fit_memory_fraction(t, "", unconstrained, small);
  const FitResult b = fit_memory_fraction(t, "", unconstrained, large);
  ASSERT_TRUE(a.capacity && b.capacity);
  const double rel = std::abs(static_cast<double>(*a.capacity) - static_cast<double>(*b.capacity)) /
                     static_cast<double>(*a.capacity);
  EXPECT_LE(rel, 2 * small.precision) << *a.capacity << " vs " << *b.capacity;
  EXPECT_NEAR(*a.fraction, 2 * *b.fraction, 4 * small.precision * *a.fraction);
}

TEST(Fit, LargerThanTheDeviceDoesNotFit) {
  const Trace t = parse_trace_text(fragmenting_trace(), "frag");
  FitOptions tiny;
  tiny.device_total = 16 * MiB;  // below the trace's live peak
  const FitResult f = fit_memory_fraction(t, "", replay_trace(t, ""), tiny);
  EXPECT_FALSE(f.fraction.has_value());
  EXPECT_FALSE(f.capacity.has_value());

  FitOptions tight;
  tight.device_total = 30 * MiB;  // above the live peak, below what the cache needs
  EXPECT_FALSE(fit_memory_fraction(t, "", replay_trace(t, ""), tight).capacity.has_value());
}

// backend:cudaMallocAsync: the memory fraction caps allocated bytes only, so a fit on
// it would answer the peak request (1.0000x) while a device that large runs out; the
// fit is the smallest device on which the whole trace runs (the shipped ResNet-50).
TEST(Fit, CudaMallocAsyncFitsTheDeviceItNeeds) {
  const char* dir = std::getenv("RESERVOIR_TRACES");
  if (dir == nullptr) GTEST_SKIP() << "RESERVOIR_TRACES not set";
  const std::string path = std::string(dir) + "/resnet50_train.trace.gz";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " missing";
  const Trace t = read_trace(path);
  const std::string config = "backend:cudaMallocAsync";
  const ReplayResult unconstrained = replay_trace(t, config);
  ASSERT_EQ(unconstrained.ooms, 0u);
  ASSERT_GT(unconstrained.peak_reserved, unconstrained.peak_requested);
  const FitResult f = fit_memory_fraction(t, config, unconstrained);
  EXPECT_TRUE(f.by_capacity);
  ASSERT_TRUE(f.capacity.has_value());
  EXPECT_GT(*f.capacity, unconstrained.peak_requested);
  EXPECT_LE(*f.capacity, unconstrained.peak_reserved + unconstrained.peak_reserved / 100);

  ReplayOptions on;
  on.capacity = *f.capacity;  // a device of the size the fit answers runs the trace
  EXPECT_EQ(replay_trace(t, config, on).ooms, 0u) << *f.capacity;
  on.capacity = static_cast<std::size_t>(unconstrained.peak_requested);  // the old answer
  EXPECT_GT(replay_trace(t, config, on).ooms, 0u);
  // The caching engine's fit is still on the fraction.
  EXPECT_FALSE(fit_memory_fraction(parse_trace_text(fragmenting_trace(), "frag"), "",
                                   replay_trace(parse_trace_text(fragmenting_trace(), "frag"), ""))
                   .by_capacity);
}

TEST(Fit, TraceWithNothingLive) {
  const Trace t = parse_trace_text("# empty\n", "empty");
  const FitResult f = fit_memory_fraction(t, "", replay_trace(t, ""));
  ASSERT_TRUE(f.capacity.has_value());
  EXPECT_EQ(*f.capacity, 0u);
}

// Oversize requests of ever smaller sizes: with max_split_size_mb each takes a new
// segment (an oversize block serves only requests at most 20 MiB smaller), so the
// cache piles up; by default the first segment is split and reused. The report
// says why, from the statistics.
TEST(Explain, OversizeSegmentsPileUpUnderMaxSplitSize) {
  std::string text;
  for (int i = 0; i < 21; ++i) {
    const std::uint64_t size = (900 - 30 * static_cast<std::uint64_t>(i)) * MiB;
    text +=
        "a," + std::to_string(i) + "," + std::to_string(size) + ",0\nf," + std::to_string(i) + "\n";
  }
  const Trace t = parse_trace_text(text, "shrinking");
  const ReplayResult split = replay_trace(t, "");
  EXPECT_LT(split.ratio, kExplainRatio);
  EXPECT_EQ(explain_ratio(split), "");

  const ReplayResult r = replay_trace(t, "max_split_size_mb:256");
  EXPECT_EQ(r.device_allocs, 21u);
  EXPECT_GT(r.ratio, 10.0);
  EXPECT_EQ(r.cache.max_split_size, 256 * MiB);
  EXPECT_EQ(r.cache.oversize_segments_peak, 21u);
  EXPECT_EQ(r.cache.oversize_allocations_peak, 1u);
  EXPECT_TRUE(r.cache.at_peak);
  EXPECT_EQ(r.cache.oversize_segment_bytes, r.peak_reserved);
  const std::string why = explain_ratio(r);
  EXPECT_NE(why.find("never split"), std::string::npos) << why;
  EXPECT_NE(why.find("21 such segments"), std::string::npos) << why;
  EXPECT_NE(why.find("100% of peak reserved"), std::string::npos) << why;
  EXPECT_NE(why.find("at most 1 oversize allocations"), std::string::npos) << why;
}

// Record a scripted workload through the allocator, read the trace back and
// replay it: the same requests give the same peak requested.
TEST(RoundTrip, RecordedWorkloadReplaysTheSame) {
  TempDir dir;
  const std::string path = dir.file("workload.trace.gz");
  SimOptions so;
  so.capacity = std::size_t{4} << 30;
  auto sim = std::make_shared<SimBackend>(so);
  std::int64_t recorded_peak = 0;
  {
    Allocator alloc(sim, Config{});
    void* early = alloc.allocate(3 * MiB, 11, 0);  // before recording: never in the trace
    alloc.start_trace_recording(path);
    const StreamHandle s1 = 11, s2 = 22;
    std::vector<void*> live;
    for (int i = 0; i < 20; ++i) {
      live.push_back(alloc.allocate((i % 5 + 1) * MiB + 100 * i, s1, 0));
      if (i % 3 == 0) live.push_back(alloc.allocate(512 * (i + 1), s2, 0));
      if (i % 4 == 3) {
        alloc.record_stream(live.front(), s2);
        alloc.deallocate(live.front());
        live.erase(live.begin());
      }
      if (i % 6 == 5) {
        sim->advance(s2);
        alloc.notify_host_wait(s2, 0);
      }
    }
    alloc.deallocate(early);  // unknown to the recorder: not written
    for (std::size_t i = 0; i + 2 < live.size(); ++i) alloc.deallocate(live[i]);
    recorded_peak = alloc.stats(0).requested_bytes.all().peak;
    alloc.stop_trace_recording();
    for (std::size_t i = live.size() - 2; i < live.size(); ++i) alloc.deallocate(live[i]);
  }

  const Trace t = read_trace(path);
  EXPECT_EQ(t.allocations, 27u);
  EXPECT_EQ(t.uses, 5u);
  EXPECT_EQ(t.host_waits, 3u);
  EXPECT_EQ(t.streams, 2u);
  EXPECT_EQ(t.live_at_end, 2u);
  EXPECT_EQ(t.frees, 25u);

  const ReplayResult r = replay_trace(t, "");
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.events, t.events.size());
  EXPECT_EQ(r.peak_requested, t.peak_live_bytes);
  // The recorded run also held `early` (3 MiB, unrecorded) all through the loop.
  EXPECT_EQ(static_cast<std::int64_t>(r.peak_requested + 3 * MiB), recorded_peak);
}

// The shipped ResNet-50 trace: peak requested and peak reserved equal PyTorch's
// figures (traces/README.md).
TEST(Replay, RealTracePeakRequestedMatchesPyTorch) {
  const char* dir = std::getenv("RESERVOIR_TRACES");
  if (dir == nullptr) GTEST_SKIP() << "RESERVOIR_TRACES not set";
  const std::string path = std::string(dir) + "/resnet50_train.trace.gz";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " missing";
  const Trace t = read_trace(path);
  const ReplayResult r = replay_trace(t, "");
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.events, 23975u);
  EXPECT_EQ(r.peak_requested, 3192592912u);
  // PyTorch's native allocator on the same trace (traces/README.md).
  EXPECT_EQ(r.peak_reserved, 3797942272u);
  EXPECT_EQ(r.device_allocs, 104u);
  EXPECT_EQ(explain_ratio(r), "");  // 1.19: nothing extreme to explain
}

// The most streams a trace can name, each used once and never again: every new
// stream costs the same (a table of 65,536 entries; statistics are per thread, so a
// stream adds nothing to them), so the replay takes seconds.
TEST(Replay, SixtyFiveThousandStreamsReplayAtConstantCostEach) {
  std::string text = "# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM\n";
  constexpr std::uint64_t kStreams = 65536;
  for (std::uint64_t s = 0; s < kStreams; ++s) {
    text += "a," + std::to_string(s) + ",4096," + std::to_string(s) + "\n";
    text += "f," + std::to_string(s) + "\n";
  }
  const Trace t = parse_trace_text(text, "streams");
  const ReplayResult r = replay_trace(t, "", ReplayOptions{});
  EXPECT_EQ(r.events, 2 * kStreams);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.device_allocs, kStreams);  // one small segment per stream, kept cached
  EXPECT_EQ(r.peak_reserved, kStreams * 2 * MiB);
}

}  // namespace
}  // namespace reservoir::replay
