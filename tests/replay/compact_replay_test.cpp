// policy:compact on every bundled real trace (traces/*.trace.gz, captured on an H200):
// peak reserved within 5% of peak requested and the fit (the smallest memory fraction
// under which the whole trace runs, as PyTorch's limit) within 2% — where PyTorch's
// allocator reserves 1.02x to 3.8x and cudaMallocAsync 1.06x to 1.45x. The exact
// figures are pinned, so that a change of the policy shows in its numbers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "replay.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {
namespace {

struct Expected {
  const char* trace;
  std::uint64_t peak_reserved;  // bytes, the device keeping up (ReplayOptions default)
};

// Measured on the simulated device; page size 2 MiB. Without a memory fraction the
// policy trades a little memory for fewer device calls (extents of up to 16 pages moved
// whole and kept mapped where they were as ghosts, growth by at least 4 pages,
// CompactPool::choose); under one (the fit) memory moves page by page, pure best
// fit: 1.0018, 1.0040, 1.0142 on the first three, where the ideal design of
// shared/design (every page unmapped the moment it holds nothing) reaches 1.0017,
// 1.0040 and 1.0166 (the third is below it: the stream caches hand a stream the block
// it freed last, a placement the model does not make).
const Expected kTraces[] = {
    {"resnet50_train", 3225419776},           {"gpt2_train_varlen", 13245612032},
    {"multistream_train_overlap", 878706688}, {"textgen_varbatch", 763363328},
    {"infer_varbatch", 1493172224},           {"pipeline_multistream", 838860800},
};

class CompactOnRealTraces : public ::testing::TestWithParam<Expected> {};

TEST_P(CompactOnRealTraces, ReservesWithin5PercentAndFitsWithin2Percent) {
  const char* dir = std::getenv("RESERVOIR_TRACES");
  if (dir == nullptr) GTEST_SKIP() << "RESERVOIR_TRACES not set";
  const std::string path = std::string(dir) + "/" + GetParam().trace + ".trace.gz";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const Trace t = read_trace(path);
#if defined(RESERVOIR_TEST_SLOW_BUILD)
  // The figures are the optimized flavour's to pin; here the validator walks the
  // replays of the traces small enough for CI time.
  if (t.events.size() > 100000)
    GTEST_SKIP() << t.events.size() << " events: replayed by the optimized flavour only";
#endif
  const ReplayResult r = replay_trace(t, "policy:compact");
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.peak_requested, t.peak_live_bytes);
  EXPECT_LE(r.ratio, 1.05) << r.peak_reserved << " reserved for " << r.peak_requested;
  EXPECT_EQ(r.peak_reserved, GetParam().peak_reserved) << "ratio " << r.ratio;
  const FitResult f = fit_memory_fraction(t, "policy:compact", r, FitOptions{});
  ASSERT_TRUE(f.capacity.has_value());
  const double fit = static_cast<double>(*f.capacity) / static_cast<double>(r.peak_requested);
  EXPECT_LE(fit, 1.02) << *f.capacity << " bytes";
  // And the policy's point: PyTorch's default reserves more on each of them.
  EXPECT_GT(replay_trace(t, "").peak_reserved, r.peak_reserved);
}

INSTANTIATE_TEST_SUITE_P(Traces, CompactOnRealTraces, ::testing::ValuesIn(kTraces),
                         [](const ::testing::TestParamInfo<Expected>& trace_info) {
                           return std::string(trace_info.param.trace);
                         });

}  // namespace
}  // namespace reservoir::replay
