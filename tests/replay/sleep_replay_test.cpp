// Traces with tags, sleeps and wakes (format v2): a program's sleeps recorded and
// replayed give the live run's figures under each policy; the fit counts the memory a
// sleeping tag gave back; a wake without room is an OOM the report names; settings
// without pools refuse such traces before replaying.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../unit/sleep_test_util.hpp"
#include "explain.hpp"
#include "replay.hpp"
#include "replay_test_util.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {
namespace {

using test::TempDir;
namespace sleep_util = ::reservoir::test;
constexpr std::size_t MiB = std::size_t{1} << 20;

class SleepReplay : public ::testing::TestWithParam<std::string> {};

// A program of two tags on two streams: weights offloaded, a cache discarded, the
// freed memory used by untagged work while they sleep, one of the cache's blocks
// freed while asleep, one wake on a stream. Recorded, read back and replayed under the
// same setting: the same peaks, the same device calls.
TEST_P(SleepReplay, RecordedSleepsReplayToTheLiveRunsFigures) {
  const std::string config = GetParam();
  const std::string weights = sleep_util::tag_for("ReplayWeights", config);
  const std::string kv = sleep_util::tag_for("ReplayKv", config);
  TempDir dir;
  const std::string path = dir.file("sleep.trace.gz");
  DeviceStats live;
  {
    SimOptions so;
    so.capacity = std::size_t{2} << 30;
    Allocator alloc(std::make_shared<SimBackend>(so), Config::parse(config));
    alloc.start_trace_recording(path);
    const StreamHandle s1 = 11, s2 = 22;
    std::vector<void*> w, k;
    {
      TagScope scope(alloc, weights);
      for (int i = 0; i < 6; ++i) w.push_back(alloc.allocate((40 + 7 * i) * MiB + 4096, s1, 0));
    }
    {
      TagScope scope(alloc, kv);
      for (int i = 0; i < 5; ++i) k.push_back(alloc.allocate((i + 1) * 9 * MiB, s1, 0));
    }
    void* untagged = alloc.allocate(30 * MiB, s2, 0);
    alloc.sleep(weights, SleepMode::offload);
    alloc.sleep(kv, SleepMode::discard);
    alloc.deallocate(k[2]);  // freed while asleep: the books only
    std::vector<void*> meanwhile;
    for (int i = 0; i < 4; ++i) meanwhile.push_back(alloc.allocate(70 * MiB, s2, 0));
    for (void* p : meanwhile) alloc.deallocate(p);
    alloc.empty_cache();
    alloc.wake_async(kv, s2);
    alloc.wake(weights);
    {
      TagScope scope(alloc, kv);
      k[2] = alloc.allocate(5 * MiB, s1, 0);
    }
    alloc.deallocate(untagged);
    for (void* p : k) alloc.deallocate(p);
    for (void* p : w) alloc.deallocate(p);
    live = alloc.stats(0);
    alloc.stop_trace_recording();
  }

  const Trace t = read_trace(path);
  EXPECT_EQ(t.sleeps, 2u);
  EXPECT_EQ(t.wakes, 2u);
  EXPECT_EQ(t.allocations, 17u);
  EXPECT_EQ(t.empty_caches, 1u);
  ASSERT_EQ(t.tag_names.size(), 3u);
  EXPECT_EQ(t.tag_names[1], weights);
  EXPECT_EQ(t.tag_names[2], kv);

  ReplayOptions ro;
  ro.capacity = std::size_t{2} << 30;
  const ReplayResult r = replay_trace(t, config, ro);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.events, t.events.size());
  EXPECT_EQ(r.peak_requested, static_cast<std::uint64_t>(live.requested_bytes.all().peak));
  EXPECT_EQ(r.peak_reserved, static_cast<std::uint64_t>(live.reserved_bytes.all().peak));
  EXPECT_EQ(r.device_allocs, static_cast<std::uint64_t>(live.num_device_alloc));
  EXPECT_EQ(r.device_frees, static_cast<std::uint64_t>(live.num_device_free));
}

// Memory a sleeping tag gave back serves other requests in the replay as in the
// program: the fit of a trace that sleeps its weights while as much again is live
// needs about one copy, the same trace without the sleep two.
TEST_P(SleepReplay, TheFitCountsWhatASleepGaveBack) {
  const std::string config = GetParam();
  const std::string tag = sleep_util::tag_for("ReplayFit", config);
  const std::string head = "n,1," + tag + "\n";
  std::string tagged;
  for (int i = 0; i < 8; ++i)
    tagged += "a," + std::to_string(i) + "," + std::to_string(64 * MiB) + ",0,1\n";
  std::string other;
  for (int i = 0; i < 8; ++i)
    other += "a," + std::to_string(100 + i) + "," + std::to_string(64 * MiB) + ",0\n";
  for (int i = 0; i < 8; ++i) other += "f," + std::to_string(100 + i) + "\n";
  const Trace asleep =
      parse_trace_text(head + tagged + "z,1,discard\n" + other + "w,1\n", "asleep");
  const Trace awake = parse_trace_text(head + tagged + other, "awake");
  EXPECT_EQ(asleep.peak_live_bytes, 512 * MiB);
  EXPECT_EQ(awake.peak_live_bytes, 1024 * MiB);

  FitOptions fo;
  fo.device_total = std::size_t{4} << 30;
  const auto fit_of = [&](const Trace& t) {
    const ReplayResult r = replay_trace(t, config);
    EXPECT_EQ(r.ooms, 0u);
    const FitResult f = fit_memory_fraction(t, config, r, fo);
    EXPECT_TRUE(f.capacity.has_value());
    return f.capacity.value_or(0);
  };
  const std::uint64_t with_sleep = fit_of(asleep);
  const std::uint64_t without = fit_of(awake);
  EXPECT_LT(with_sleep, 560 * MiB) << "fit " << with_sleep / MiB << " MiB";
  EXPECT_GE(without, 1024 * MiB);
}

// A wake without room is out of memory, as in a program: counted, named in the
// report, the tag left asleep, so that its requests fail and its sleeps are skipped
// until a wake succeeds; frees of its blocks go on.
TEST_P(SleepReplay, AWakeWithoutRoomIsAnOomTheReportNames) {
  const std::string config = GetParam();
  const std::string tag = sleep_util::tag_for("ReplayWakeOom", config);
  const std::string text = "n,1," + tag +
                           "\n"
                           "a,0,629145600,0,1\n"  // 600 MiB
                           "z,1,offload\n"
                           "a,1,629145600,0\n"  // its memory taken
                           "w,1\n"              // no room under 1 GiB: OOM
                           "a,2,1048576,0,1\n"  // under the sleeping tag: fails too
                           "z,1,offload\n"      // asleep still: nothing to do
                           "f,1\n"
                           "w,1\n"  // room now
                           "a,3,1048576,0,1\n"
                           "f,0\n"
                           "f,3\n";
  const Trace t = parse_trace_text(text, "wake-oom");
  ReplayOptions ro;
  ro.capacity = std::size_t{1} << 30;
  const ReplayResult r = replay_trace(t, config, ro);
  EXPECT_EQ(r.ooms, 2u);
  EXPECT_EQ(r.events, t.events.size());
  ASSERT_TRUE(r.first_oom.has_value());
  EXPECT_EQ(r.first_oom->event, 3u);  // the n line is no event
  EXPECT_EQ(r.first_oom->wake_tag, tag);
  EXPECT_GE(r.first_oom->requested, 600 * MiB);
  const std::string why = describe_oom(*r.first_oom);
  EXPECT_NE(why.find("(the wake of tag '" + tag + "', 600.00 MiB asleep) failed"),
            std::string::npos)
      << why;
}

// Threads allocating under a tag while another puts it to sleep and wakes it: each
// request is recorded on its side of each sleep (a request the sleep refused is not
// recorded), so the reader, which refuses a request under a sleeping tag, accepts the
// trace, and the replay serves every request.
TEST_P(SleepReplay, ThreadsBesideSleepsGiveAValidTrace) {
  const std::string config = GetParam();
  const std::string tag = sleep_util::tag_for("ReplayThreads", config);
  TempDir dir;
  const std::string path = dir.file("threads.trace.gz");
  {
    SimOptions so;
    so.capacity = std::size_t{2} << 30;
    Allocator alloc(std::make_shared<SimBackend>(so), Config::parse(config));
    {
      TagScope scope(alloc, tag);  // the tag exists before the sleeps
      alloc.deallocate(alloc.allocate(MiB, 1, 0));
    }
    alloc.start_trace_recording(path);
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        TagScope scope(alloc, tag);
        std::vector<void*> held;
        for (int i = 0; !stop.load(); ++i) {
          try {
            held.push_back(alloc.allocate((i % 7 + 1) * 256 * 1024, StreamHandle(t + 1), 0));
          } catch (const InvalidArgumentError&) {  // asleep: refused, not recorded
          }
          if (held.size() > 4) {
            alloc.deallocate(held.front());  // frees go on while it sleeps
            held.erase(held.begin());
          }
        }
        for (void* p : held) alloc.deallocate(p);
      });
    }
    for (int i = 0; i < 20; ++i) {
      alloc.sleep(tag, i % 2 ? SleepMode::discard : SleepMode::offload, 0);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      alloc.wake(tag, 0);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    stop = true;
    for (auto& th : threads) th.join();
    alloc.stop_trace_recording();
  }
  const Trace t = read_trace(path);  // throws on a request recorded under a sleeping tag
  EXPECT_EQ(t.sleeps, 20u);
  EXPECT_EQ(t.wakes, 20u);
  EXPECT_GT(t.allocations, 0u);
  ReplayOptions ro;
  ro.capacity = std::size_t{2} << 30;
  const ReplayResult r = replay_trace(t, config, ro);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.events, t.events.size());
}

// A recording may begin while a tag sleeps (its first line wakes it: nothing to wake
// in the replay) or after its blocks were made (a sleep of blocks the trace lacks).
TEST_P(SleepReplay, ARecordingThatBeginsWhileATagSleepsReplays) {
  const std::string tag = sleep_util::tag_for("ReplayLate", GetParam());
  const Trace t = parse_trace_text("n,1," + tag +
                                       "\nw,1\nz,1,offload\nw,1,2\n"
                                       "a,0,1048576,0,1\nz,1,discard\nw,1\nf,0\n",
                                   "late");
  const ReplayResult r = replay_trace(t, GetParam());
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.events, t.events.size());
  EXPECT_EQ(r.peak_requested, 1048576u);
}

// A trace recorded on a GPU: tests/python/gpu/sleep_worker.py under policy:compact on
// an H100 (2026-12-07, `--config policy:compact,record_trace:PATH --cycles 2`), a
// GPT-2-shaped model whose weights and cache sleep and wake 7 times (once on a stream),
// with 8 empty_cache calls and a co-tenant allocation of all the free memory while
// they sleep. Replayed on the simulated device it reserves what the live run reserved
// at its peak (memory_stats' reserved_bytes.all.peak, requested_bytes.all.peak).
TEST(SleepReplayRecorded, AGpuRecordingReplaysToTheLiveRunsPeaks) {
#if defined(RESERVOIR_TEST_SLOW_BUILD)
  // 40,000 pages at the peak: the validator after every event would take minutes; the
  // optimized flavour pins the figures.
  GTEST_SKIP() << "replayed by the optimized flavour only";
#endif
  const Trace t =
      read_trace(std::string(RESERVOIR_REPLAY_TEST_DATA) + "/sleep_worker_h100.trace.gz");
  EXPECT_EQ(t.sleeps, 7u);
  EXPECT_EQ(t.wakes, 7u);
  EXPECT_EQ(t.empty_caches, 8u);
  ReplayOptions ro;
  ro.capacity = std::size_t{80} << 30;
  const ReplayResult r = replay_trace(t, "policy:compact", ro);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.peak_reserved, 83953188864u);
  EXPECT_EQ(r.peak_requested, 84480505880u);
}

INSTANTIATE_TEST_SUITE_P(Policies, SleepReplay, sleep_util::kSleepPolicies,
                         sleep_util::sleep_policy_name);

// Settings without pools cannot tag memory: a trace that does is refused before any
// replay, with the reason; a trace without tags is not.
TEST(SleepReplayRefusal, SettingsWithoutPoolsRefuseTaggedTraces) {
  const Trace tagged = parse_trace_text("n,1,refused-tag\na,0,64,0,1\nz,1,offload\nw,1\n", "t");
  const std::string why = trace_refusal(tagged, "backend:cudaMallocAsync");
  EXPECT_EQ(
      why.rfind("--config 'backend:cudaMallocAsync': the trace tags its memory (1 sleeps)", 0), 0u)
      << why;
  EXPECT_NE(why.find("cannot tag memory"), std::string::npos) << why;
  EXPECT_EQ(trace_refusal(tagged, ""), "");
  EXPECT_EQ(trace_refusal(tagged, "policy:compact"), "");
  EXPECT_EQ(trace_refusal(parse_trace_text("a,0,64,0\n", "u"), "backend:cudaMallocAsync"), "");
}

// A device that cannot map memory cannot sleep: the replay stops with the engine's
// InvalidArgumentError (reservoir-replay prints it, exit status 2).
TEST(SleepReplayRefusal, ADeviceWithoutVirtualMemoryCannotReplayASleep) {
  const Trace t = parse_trace_text("n,1,novmm-replay\na,0,64,0,1\nz,1,offload\nw,1\n", "t");
  SimOptions so;
  so.virtual_memory = false;
  ReplayOptions ro;
  ro.backend = std::make_shared<SimBackend>(so);
  try {
    replay_trace(t, "", ro);
    FAIL() << "a sleep replayed on a device without virtual memory";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("sleep needs virtual memory management"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace reservoir::replay
