// Replays through the engine on SimBackend: figures, OOM handling, timeline, fit
// search, and the recorder -> reader -> replay round trip.
#include "replay.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

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

// As in PyTorch, a freed block used on another stream stays counted in requested
// (and reserved) bytes until that stream's work at the free completes. In the sample
// trace block 0 (1 MiB, used on stream 1) is freed after the last "s,1", so it stays
// pending to the end: the peak is the trace's live peak plus 1 MiB.
TEST(Replay, SampleTraceFigures) {
  const Trace t = parse_trace_text(test::sample_trace_text(), "sample");
  const ReplayResult r = replay_trace(t, "");
  EXPECT_EQ(r.config, "");
  EXPECT_EQ(r.events, 10u);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(t.peak_live_bytes, 35651584u);  // 32 MiB + 2 MiB live at event 8
  EXPECT_EQ(r.peak_requested, 35651584u + MiB);
  EXPECT_GE(r.peak_allocated, t.peak_live_bytes);
  EXPECT_GE(r.peak_reserved, r.peak_requested);
  EXPECT_DOUBLE_EQ(r.ratio,
                   static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_requested));
  EXPECT_GE(r.device_allocs, 1u);
  EXPECT_GT(r.device_time_us, 0.0);
  EXPECT_GT(r.ns_per_event, 0.0);
  EXPECT_TRUE(r.timeline.requested.empty());

  const std::string json = format_json({r}, false);
  EXPECT_NE(json.find("\"peak_requested\": 36700160"), std::string::npos) << json;
}

// Moving the host wait after the free completes the pending use: the block is
// released and the peak is the trace's live peak.
TEST(Replay, HostWaitReleasesBlocksUsedOnOtherStreams) {
  std::string text = test::sample_trace_text();
  const std::string wait = "s,1\n";
  text.erase(text.find(wait), wait.size());
  text.insert(text.find("a,3,"), wait);
  const Trace t = parse_trace_text(text, "sample2");
  const ReplayResult r = replay_trace(t, "");
  EXPECT_EQ(r.peak_requested, 35651584u);
  EXPECT_EQ(r.ooms, 0u);
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
  EXPECT_FALSE(r.first_oom.empty());
  EXPECT_EQ(r.peak_requested, 40 * MiB);

  o.stop_at_first_oom = true;
  const ReplayResult s = replay_trace(t, "", o);
  EXPECT_EQ(s.ooms, 1u);
  EXPECT_EQ(s.events, 2u);
}

TEST(Replay, TimelineKeepsTheMaximumPerBucket) {
  const Trace t = parse_trace_text(test::sample_trace_text(), "sample");
  ReplayOptions o;
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

TEST(Fit, SmallestCapacityThatRunsWithoutOom) {
  const Trace t = parse_trace_text(fragmenting_trace(), "frag");
  const ReplayResult unconstrained = replay_trace(t, "");
  ASSERT_EQ(unconstrained.ooms, 0u);
  int steps = 0;
  FitOptions fo;
  fo.on_step = [&](int run) { EXPECT_EQ(run, ++steps); };
  const FitResult f = fit_capacity(t, "", unconstrained, fo);
  ASSERT_TRUE(f.capacity.has_value());
  EXPECT_EQ(steps, f.runs);
  const std::uint64_t fit = *f.capacity;
  EXPECT_GE(fit, unconstrained.peak_requested);
  EXPECT_LE(fit, unconstrained.peak_reserved + unconstrained.peak_reserved / 100);

  ReplayOptions at;
  at.capacity = fit;
  EXPECT_EQ(replay_trace(t, "", at).ooms, 0u) << "fit " << fit;
  at.capacity = fit - 2 * MiB;
  EXPECT_GT(replay_trace(t, "", at).ooms, 0u) << "fit " << fit;
}

TEST(Fit, TraceWithNothingLive) {
  const Trace t = parse_trace_text("# empty\n", "empty");
  const FitResult f = fit_capacity(t, "", replay_trace(t, ""));
  ASSERT_TRUE(f.capacity.has_value());
  EXPECT_EQ(*f.capacity, 0u);
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

// The shipped ResNet-50 trace: peak requested must equal PyTorch's figure
// (traces/README.md), whatever the engine reserves.
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
  EXPECT_GE(r.peak_reserved, r.peak_requested);
}

}  // namespace
}  // namespace reservoir::replay
