// The GPU benchmark's CPU parts: percentiles of call times less the clock's cost
// (latency_percentiles.*) and its tables (text_table.*).
#include "latency_percentiles.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "text_table.hpp"

namespace reservoir_bench {
namespace {

// Records each of ns as one call's time.
void record_all(CallTimes& t, std::initializer_list<std::int64_t> ns) {
  const latency_clock::time_point t0{};
  for (std::int64_t v : ns) t.record(t0, t0 + std::chrono::nanoseconds(v));
}

std::vector<std::int64_t> one_to(std::int64_t n) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 1; i <= n; ++i) v.push_back(i);
  return v;
}

TEST(NearestRank, IsTheSmallestSampleWithPctAtOrBelowIt) {
  const auto v = one_to(1000);
  EXPECT_EQ(nearest_rank(v, 50), 500);
  EXPECT_EQ(nearest_rank(v, 99), 990);
  EXPECT_EQ(nearest_rank(v, 99.9), 999);
  EXPECT_EQ(nearest_rank(v, 100), 1000);
  EXPECT_EQ(nearest_rank(v, 0.01), 1);
  // Few samples: the rank rounds up, so p99 of three is the largest.
  EXPECT_EQ(nearest_rank({10, 20, 30}, 50), 20);
  EXPECT_EQ(nearest_rank({10, 20, 30}, 99), 30);
  EXPECT_EQ(nearest_rank({7}, 99.9), 7);
}

TEST(NearestRank, RefusesNoSamplesAndPercentagesOutOfRange) {
  EXPECT_THROW(nearest_rank({}, 50), std::invalid_argument);
  EXPECT_THROW(nearest_rank({1, 2}, 0), std::invalid_argument);
  EXPECT_THROW(nearest_rank({1, 2}, 100.5), std::invalid_argument);
}

TEST(CallTimes, NeverGrowsPastItsCapacityAndCountsWhatItDrops) {
  CallTimes t(3);
  const std::int64_t* storage = t.begin();
  record_all(t, {5, 6, 7, 8, 9});
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.capacity(), 3u);
  EXPECT_EQ(t.dropped(), 2u);
  EXPECT_EQ(t.begin(), storage);  // no reallocation: the timed loop allocates nothing
  EXPECT_EQ(std::vector<std::int64_t>(t.begin(), t.end()), (std::vector<std::int64_t>{5, 6, 7}));
}

TEST(Summarize, MergesThreadsAndTakesTheClockCostOff) {
  // Thread a: 1..500 ns + 10, thread b: 501..1000 ns + 10 (the clock's cost).
  CallTimes a(500), b(500);
  const latency_clock::time_point t0{};
  for (int i = 1; i <= 500; ++i) a.record(t0, t0 + std::chrono::nanoseconds(i + 10));
  for (int i = 501; i <= 1000; ++i) b.record(t0, t0 + std::chrono::nanoseconds(i + 10));
  const LatencySummary s = summarize({&b, &a}, 10);
  EXPECT_EQ(s.calls, 1000u);
  EXPECT_EQ(s.p50, 500);
  EXPECT_EQ(s.p99, 990);
  EXPECT_EQ(s.p999, 999);
  EXPECT_EQ(s.max, 1000);
}

TEST(Summarize, FloorsAtZeroAndSaysWhenNothingWasMeasured) {
  CallTimes t(4);
  record_all(t, {3, 4, 50, 60});
  const LatencySummary s = summarize({&t}, 5);
  EXPECT_EQ(s.p50, 0);  // 3 and 4 ns, less a 5 ns clock, are 0, not negative
  EXPECT_EQ(s.max, 55);
  CallTimes none(4);
  EXPECT_EQ(summarize({&none}, 5).calls, 0u);
  EXPECT_EQ(summarize({}, 5).calls, 0u);
}

TEST(ClockCost, MeasuresEveryPairAndACostBelowAMillisecond) {
  const ClockCost c = measure_clock_cost(1000);
  EXPECT_EQ(c.pairs, 1000u);
  EXPECT_GE(c.median_ns, 0);
  EXPECT_LT(c.median_ns, 1000000);  // a reading costs ns to a few us on any machine
  if (c.median_ns > 0) {
    EXPECT_GT(c.smallest_ns, 0);
    EXPECT_LE(c.smallest_ns, c.median_ns);
  }
}

TEST(TextTable, FormatsNumbersAsTheAnchorsDo) {
  EXPECT_EQ(with_separators(999), "999");
  EXPECT_EQ(with_separators(1234567), "1,234,567");
  EXPECT_EQ(with_separators(-1234), "-1,234");
  EXPECT_EQ(format_value(-1), "n/a");
  EXPECT_EQ(format_value(87.24), "87.2");
  EXPECT_EQ(format_value(1190.6), "1,191");
  EXPECT_EQ(format_value(1.1416, true), "1.142");
}

TEST(TextTable, MarkdownRightAlignsEveryColumnButTheFirst) {
  const TextTable t{{"cell", "p50"}, {{"pair", "87"}, {"mixed", "1,234"}}};
  EXPECT_EQ(markdown_table(t), "| cell | p50 |\n|---|---:|\n| pair | 87 |\n| mixed | 1,234 |\n");
}

TEST(TextTable, PrintsColumnsAsWideAsTheirWidestCell) {
  const TextTable t{{"cell", "p50"}, {{"pair", "87"}, {"mixed", "1,234"}}};
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  ASSERT_NE(f, nullptr);
  print_table(t, f);
  std::fclose(f);
  const std::string out(buf, len);
  std::free(buf);
  EXPECT_EQ(out, "cell  |   p50\n-------------\npair  |    87\nmixed | 1,234\n");
}

}  // namespace
}  // namespace reservoir_bench
