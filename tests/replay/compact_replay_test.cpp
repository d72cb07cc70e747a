// policy:compact on every bundled real trace (traces/*.trace.gz, captured on H200/H100):
// peak reserved within 5% of peak requested and the fit (the smallest memory fraction
// under which the whole trace runs, as PyTorch's limit) within 2% — where PyTorch's
// allocator reserves 1.02x to 3.8x and cudaMallocAsync 1.06x to 1.45x. The exact
// figures are pinned, so that a change of the policy shows in its numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "replay.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {
namespace {

struct Expected {
  const char* trace;
  std::uint64_t peak_reserved;        // bytes, the device keeping up (ReplayOptions default)
  std::uint64_t small_peak_reserved;  // the same, every size divided by 8
};

// Measured on the simulated device; page size 2 MiB. Without a memory fraction the
// policy trades a little memory for fewer device calls (extents of up to 16 pages, at
// most a 128th of the memory held, moved whole and kept mapped where they were as
// ghosts; growth by at least 4 pages; CompactPool::choose); under one (the fit) memory
// moves page by page, pure best fit: 1.0011, 1.0040, 1.0142 on the first three, where
// the ideal design of shared/design (every page unmapped the moment it holds nothing)
// reaches 1.0017, 1.0040 and 1.0166 (the first and third are below it: the stream
// caches hand a stream the block it freed last, a placement the model does not make).
// small_peak_reserved: the same trace with every size divided by 8 (a program of the
// same shape, 90-200 MB at its peak but gpt2's 1.6 GB), where sixteen-page extents
// from the start held 1.10-1.18x.
const Expected kTraces[] = {
    {"resnet50_train", 3217031168, 404750336},
    {"gpt2_train_varlen", 13184794624, 1663041536},
    {"multistream_train_overlap", 874512384, 111149056},
    {"textgen_varbatch", 748683264, 96468992},
    {"infer_varbatch", 1495269376, 190840832},
    {"pipeline_multistream", 811597824, 104857600},
    {"encoder_varbatch", 815792128, 109051904},
    {"threads_textgen", 941621248, 119537664},
};

// t with every request's size divided by divisor (rounded up), its peak recomputed.
Trace scaled_down(const Trace& t, std::uint64_t divisor) {
  Trace s = t;
  std::vector<std::uint64_t> size_of(t.allocations, 0);
  std::uint64_t live = 0;
  s.peak_live_bytes = 0;
  for (Event& e : s.events) {
    if (e.kind == EventKind::alloc) {
      e.size = (e.size + divisor - 1) / divisor;
      size_of[e.slot] = e.size;
      live += e.size;
      s.peak_live_bytes = std::max(s.peak_live_bytes, live);
    } else if (e.kind == EventKind::free) {
      live -= size_of[e.slot];
    }
  }
  return s;
}

// Without a memory fraction, at most max(1.05, 1.02 x) what the page-by-page mode (any
// memory fraction, here 1.0: never reached) reserves for the same trace.
// Returns the page-by-page ratio.
double expect_close_to_page_mode(const Trace& t, const ReplayResult& r) {
  ReplayOptions pages;
  pages.memory_fraction = 1.0;
  const ReplayResult p = replay_trace(t, "policy:compact", pages);
  EXPECT_EQ(p.ooms, 0u);
  EXPECT_LE(r.ratio, std::max(1.05, 1.02 * p.ratio))
      << r.peak_reserved << " reserved; page by page " << p.peak_reserved;
  return p.ratio;
}

class CompactOnRealTraces : public ::testing::TestWithParam<Expected> {
 protected:
  // Reads the parameter's bundled trace into *t; returns why it is not replayed here
  // ("" when it is). A missing file is a failure.
  std::string load(Trace* t) {
    const char* dir = std::getenv("RESERVOIR_TRACES");
    if (dir == nullptr) return "RESERVOIR_TRACES not set";
    const std::string path = std::string(dir) + "/" + GetParam().trace + ".trace.gz";
    if (!std::filesystem::exists(path)) {
      ADD_FAILURE() << path << " is missing";
      return "missing";
    }
    *t = read_trace(path);
#if defined(RESERVOIR_TEST_SLOW_BUILD)
    // The figures are the optimized flavour's to pin; here the validator walks the
    // replays of the traces small enough for CI time.
    if (t->events.size() > 100000)
      return std::to_string(t->events.size()) + " events: replayed by the optimized flavour only";
#endif
    return "";
  }
};

TEST_P(CompactOnRealTraces, ReservesWithin5PercentAndFitsWithin2Percent) {
  Trace t;
  if (const std::string why = load(&t); !why.empty()) GTEST_SKIP() << why;
  const ReplayResult r = replay_trace(t, "policy:compact");
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.peak_requested, t.peak_live_bytes);
  EXPECT_LE(r.ratio, 1.05) << r.peak_reserved << " reserved for " << r.peak_requested;
  EXPECT_EQ(r.peak_reserved, GetParam().peak_reserved) << "ratio " << r.ratio;
  const FitResult f = fit_memory_fraction(t, "policy:compact", r, FitOptions{});
  ASSERT_TRUE(f.capacity.has_value());
  const double fit = static_cast<double>(*f.capacity) / static_cast<double>(r.peak_requested);
  // Within 2%, or the page-by-page reserve where even that is above (threads_textgen:
  // four streams generating at once, 1.0295 page by page, fit 1.0296).
  const double page_ratio = expect_close_to_page_mode(t, r);
  EXPECT_LE(fit, std::max(1.02, page_ratio * 1.0005)) << *f.capacity << " bytes";
  // And the policy's point: PyTorch's default reserves more on each of them.
  EXPECT_GT(replay_trace(t, "").peak_reserved, r.peak_reserved);
}

// The reserve tracks the live bytes at every scale: the same program 8x smaller keeps
// its ratio within 2% of what page-by-page moves give (large extents would strand a
// larger share of a small pool's memory).
TEST_P(CompactOnRealTraces, ASmallerProgramOfTheSameShapeReservesAsClose) {
  Trace full;
  if (const std::string why = load(&full); !why.empty()) GTEST_SKIP() << why;
  const Trace t = scaled_down(full, 8);
  const ReplayResult r = replay_trace(t, "policy:compact");
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.peak_requested, t.peak_live_bytes);
  EXPECT_EQ(r.peak_reserved, GetParam().small_peak_reserved) << "ratio " << r.ratio;
  expect_close_to_page_mode(t, r);
}

// The CUDA graph programs (traces with private pools, captured on the H100 by
// bench/python/workloads): a graph's pool keeps its memory for the graph's replays
// (nothing there may move or go back while the graph lives), so reserved exceeds
// requested by what the pools hold between captures; the bound is then 1.02x the fit,
// which counts that memory too. Pinned: the peak and each pool's, and below what
// PyTorch's expandable segments reserved for the same program (traces/gpu_truth.json).
struct GraphExpected {
  const char* trace;
  std::uint64_t peak_reserved;
  std::uint64_t pool_peak_reserved;  // the trace's one private pool
  std::uint64_t pytorch_expandable;  // PyTorch's peak reserved, expandable_segments:True
};
const GraphExpected kGraphTraces[] = {
    {"graph_decode", 882900992, 58720256, 891289600},
    {"compile_gpt2_train", 2499805184, 1423966208, 2506096640},
};

class CompactOnGraphTraces : public ::testing::TestWithParam<GraphExpected> {};

TEST_P(CompactOnGraphTraces, ReservesWithinItsFitAndLessThanExpandableSegments) {
  const char* dir = std::getenv("RESERVOIR_TRACES");
  if (dir == nullptr) GTEST_SKIP() << "RESERVOIR_TRACES not set";
  const std::string path = std::string(dir) + "/" + GetParam().trace + ".trace.gz";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing";
  const Trace t = read_trace(path);
  const ReplayResult r = replay_trace(t, "policy:compact");
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.peak_reserved, GetParam().peak_reserved) << "ratio " << r.ratio;
  ASSERT_EQ(r.pools.size(), 1u);
  EXPECT_EQ(r.pools[0].peak_reserved, GetParam().pool_peak_reserved);
  EXPECT_LT(r.peak_reserved, GetParam().pytorch_expandable);
  const FitResult f = fit_memory_fraction(t, "policy:compact", r, FitOptions{});
  ASSERT_TRUE(f.capacity.has_value());
  const double fit = static_cast<double>(*f.capacity) / static_cast<double>(r.peak_requested);
  EXPECT_LE(r.ratio, std::max(1.05, 1.02 * fit)) << "fit " << fit;
}

INSTANTIATE_TEST_SUITE_P(Traces, CompactOnGraphTraces, ::testing::ValuesIn(kGraphTraces),
                         [](const ::testing::TestParamInfo<GraphExpected>& trace_info) {
                           return std::string(trace_info.param.trace);
                         });

INSTANTIATE_TEST_SUITE_P(Traces, CompactOnRealTraces, ::testing::ValuesIn(kTraces),
                         [](const ::testing::TestParamInfo<Expected>& trace_info) {
                           return std::string(trace_info.param.trace);
                         });

}  // namespace
}  // namespace reservoir::replay
