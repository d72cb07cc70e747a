// The percentile machinery of reservoir_gpu_bench's single-call latency table: room for
// every call's time reserved before the timed loop, the cost of reading the clock, and
// p50 / p99 / p99.9 / max after that cost is taken off. Plain C++ (no CUDA), so its
// unit test (latency_percentiles_test.cpp) runs on every machine.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace reservoir_bench {

using latency_clock = std::chrono::steady_clock;  // clock_gettime(CLOCK_MONOTONIC), no rdtsc

// One thread's call times in ns, as read from the clock (its cost not yet taken off).
// Invariant: size() <= capacity(); record() never allocates (the timed loop must not),
// and a record past capacity is dropped and counted in dropped().
class CallTimes {
 public:
  explicit CallTimes(std::size_t capacity) : ns_(capacity) {}
  void record(latency_clock::time_point t0, latency_clock::time_point t1) noexcept {
    if (n_ == ns_.size()) {
      ++dropped_;
      return;
    }
    ns_[n_++] = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  }
  std::size_t size() const { return n_; }
  std::size_t capacity() const { return ns_.size(); }
  std::size_t dropped() const { return dropped_; }
  const std::int64_t* begin() const { return ns_.data(); }
  const std::int64_t* end() const { return ns_.data() + n_; }

 private:
  std::vector<std::int64_t> ns_;
  std::size_t n_ = 0;
  std::size_t dropped_ = 0;
};

// Nearest rank: the smallest sample with at least pct % of all samples <= it, i.e.
// sorted[ceil(pct / 100 * n) - 1]. Pre: sorted ascending, non-empty, 0 < pct <= 100.
std::int64_t nearest_rank(const std::vector<std::int64_t>& sorted, double pct);

// In ns, after the clock's cost is taken off every call (floored at 0).
// calls == 0: nothing was measured (the other fields are 0).
struct LatencySummary {
  std::size_t calls = 0;
  std::int64_t p50 = 0, p99 = 0, p999 = 0, max = 0;
};

// Every thread's calls together, less clock_cost_ns each.
LatencySummary summarize(const std::vector<const CallTimes*>& threads, std::int64_t clock_cost_ns);

// The cost of one reading: the time between two back-to-back readings, which is what a
// timed call's interval holds besides the call itself.
struct ClockCost {
  std::int64_t median_ns = 0;    // subtracted from every call
  std::int64_t smallest_ns = 0;  // the clock's granularity, at best
  std::size_t pairs = 0;
};
ClockCost measure_clock_cost(std::size_t pairs);

}  // namespace reservoir_bench
