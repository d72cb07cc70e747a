// reservoir_gpu_bench's single-call latency section: every allocate and every free call
// timed on its own, on a mixed pattern and on 1 MiB pairs, with 1 thread and with 8
// threads each on its own stream; p50 / p99 / p99.9 / max per call kind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_api.hpp"
#include "latency_percentiles.hpp"
#include "text_table.hpp"

namespace reservoir_bench {

struct LatencyPlan {
  std::size_t calls = 0;       // allocate (and free) calls timed per cell, all threads together
  std::size_t slow_calls = 0;  // the same for a slow allocator (Api::slow: cudaMalloc)
  std::int64_t clock_cost_ns = 0;
};

struct LatencyRow {
  int cell = 0;  // which pattern and thread count, in the table's order
  std::string allocator;
  LatencySummary alloc, free;
};

// Every cell for one allocator, each from a cold cache (a.reset() before and after)
// and after an untimed warm-up.
std::vector<LatencyRow> measure_latency(const Api& a, const std::string& allocator,
                                        const LatencyPlan& plan);

// One row per cell and allocator: cells in order, allocators in the order measured.
TextTable latency_table(const std::vector<LatencyRow>& rows);

// One sentence on the clock and the cost taken off every call.
std::string describe_clock(const ClockCost& c);

}  // namespace reservoir_bench
