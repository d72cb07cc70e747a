#include "latency_percentiles.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace reservoir_bench {

std::int64_t nearest_rank(const std::vector<std::int64_t>& sorted, double pct) {
  if (sorted.empty() || !(pct > 0.0 && pct <= 100.0))
    throw std::invalid_argument("nearest_rank: needs samples and 0 < pct <= 100");
  const double n = static_cast<double>(sorted.size());
  // The epsilon keeps 99.9 % of 1000 at rank 999, not 1000 through rounding.
  auto rank = static_cast<std::size_t>(std::ceil(pct / 100.0 * n - 1e-9));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

LatencySummary summarize(const std::vector<const CallTimes*>& threads, std::int64_t clock_cost_ns) {
  std::size_t total = 0;
  for (const CallTimes* t : threads) total += t->size();
  LatencySummary s;
  if (total == 0) return s;
  std::vector<std::int64_t> all;
  all.reserve(total);
  for (const CallTimes* t : threads)
    for (std::int64_t ns : *t) all.push_back(std::max<std::int64_t>(ns - clock_cost_ns, 0));
  std::sort(all.begin(), all.end());
  s.calls = total;
  s.p50 = nearest_rank(all, 50);
  s.p99 = nearest_rank(all, 99);
  s.p999 = nearest_rank(all, 99.9);
  s.max = all.back();
  return s;
}

ClockCost measure_clock_cost(std::size_t pairs) {
  CallTimes times(pairs);
  for (int warm = 0; warm < 1000; ++warm) (void)latency_clock::now();
  for (std::size_t i = 0; i < pairs; ++i) {
    const auto t0 = latency_clock::now();
    const auto t1 = latency_clock::now();
    times.record(t0, t1);
  }
  ClockCost c;
  c.pairs = times.size();
  if (c.pairs == 0) return c;
  std::vector<std::int64_t> sorted(times.begin(), times.end());
  std::sort(sorted.begin(), sorted.end());
  c.median_ns = nearest_rank(sorted, 50);
  const auto nonzero = std::upper_bound(sorted.begin(), sorted.end(), std::int64_t{0});
  c.smallest_ns = nonzero == sorted.end() ? 0 : *nonzero;
  return c;
}

}  // namespace reservoir_bench
