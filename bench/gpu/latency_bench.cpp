#include "latency_bench.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

namespace reservoir_bench {

namespace {

constexpr std::uint32_t kLive = 512;  // live blocks per thread (mixed)
constexpr std::size_t kPairSize = std::size_t{1} << 20;

struct Cell {
  const char* name;
  bool mixed;  // log-uniform 256 B .. 64 MiB with kLive live, else same-size 1 MiB pairs
  int threads;
};
constexpr Cell kCells[] = {
    {"log-uniform 256 B-64 MiB, 512 live, 1 thread", true, 1},
    {"log-uniform 256 B-64 MiB, 512 live per thread, 8 threads, own streams", true, 8},
    {"pair 1 MiB, 1 thread", false, 1},
    {"pair 1 MiB, 8 threads, own streams", false, 8},
};

// One thread's share of a cell, all of it made before the timed loop.
// mixed: sizes = kLive fill sizes, then one per warm-up and timed step; picks = the
// live slot each step frees and refills.
struct Worker {
  explicit Worker(std::size_t calls) : alloc_ns(calls), free_ns(calls) {}
  cudaStream_t stream = nullptr;
  std::vector<std::size_t> sizes;
  std::vector<std::uint32_t> picks;
  std::vector<void*> live;
  CallTimes alloc_ns, free_ns;
};

void prepare(Worker& w, std::size_t steps, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> pick(0, kLive - 1);
  std::uniform_real_distribution<double> lg(8.0, 26.0);
  w.sizes.resize(kLive + steps);
  for (auto& z : w.sizes) z = static_cast<std::size_t>(std::pow(2.0, lg(rng)));
  w.picks.resize(steps);
  for (auto& k : w.picks) k = pick(rng);
  w.live.assign(kLive, nullptr);
}

// The untimed warm-up, then (once every thread of the cell has warmed up) the timed
// calls. One clock reading ends a call's interval and starts the next call's.
void run(const Api& a, const Cell& c, Worker& w, std::size_t warm, std::size_t calls,
         std::atomic<int>& ready) {
  CK(cudaSetDevice(0));
  const cudaStream_t s = w.stream;
  if (c.mixed) {
    for (std::uint32_t i = 0; i < kLive; ++i) w.live[i] = a.alloc(w.sizes[i], s);
    for (std::size_t i = 0; i < warm; ++i) {
      const std::uint32_t k = w.picks[i];
      a.free(w.live[k], s);
      w.live[k] = a.alloc(w.sizes[kLive + i], s);
    }
  } else {
    for (std::size_t i = 0; i < warm; ++i) a.free(a.alloc(kPairSize, s), s);
  }
  ready.fetch_add(1);
  while (ready.load() < c.threads) std::this_thread::yield();
  if (c.mixed) {
    for (std::size_t i = warm; i < warm + calls; ++i) {
      const std::uint32_t k = w.picks[i];
      const auto t0 = latency_clock::now();
      a.free(w.live[k], s);
      const auto t1 = latency_clock::now();
      w.live[k] = a.alloc(w.sizes[kLive + i], s);
      const auto t2 = latency_clock::now();
      w.free_ns.record(t0, t1);
      w.alloc_ns.record(t1, t2);
    }
    for (void*& p : w.live) {
      a.free(p, s);
      p = nullptr;
    }
  } else {
    for (std::size_t i = 0; i < calls; ++i) {
      const auto t0 = latency_clock::now();
      void* p = a.alloc(kPairSize, s);
      const auto t1 = latency_clock::now();
      a.free(p, s);
      const auto t2 = latency_clock::now();
      w.alloc_ns.record(t0, t1);
      w.free_ns.record(t1, t2);
    }
  }
}

std::string format_ns(std::int64_t ns, std::size_t calls) {
  return calls == 0 ? "n/a" : with_separators(ns);
}

}  // namespace

std::vector<LatencyRow> measure_latency(const Api& a, const std::string& allocator,
                                        const LatencyPlan& plan) {
  std::vector<LatencyRow> rows;
  const std::size_t calls = a.slow ? plan.slow_calls : plan.calls;
  for (int ci = 0; ci < static_cast<int>(std::size(kCells)); ++ci) {
    const Cell& c = kCells[ci];
    const auto threads = static_cast<std::size_t>(c.threads);
    const std::size_t per = (calls + threads - 1) / threads;
    const std::size_t warm = std::max<std::size_t>(per / 10, 100);
    std::vector<Worker> workers;
    workers.reserve(threads);
    for (std::size_t t = 0; t < threads; ++t) {
      Worker& w = workers.emplace_back(per);
      CK(cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking));
      if (c.mixed) prepare(w, warm + per, 42 + static_cast<unsigned>(t));
    }
    a.reset();
    std::atomic<int> ready{0};
    std::vector<std::thread> th;
    for (Worker& w : workers) th.emplace_back([&, wp = &w] { run(a, c, *wp, warm, per, ready); });
    for (auto& x : th) x.join();
    // Cached blocks go back while their streams still exist.
    a.reset();
    std::vector<const CallTimes*> allocs, frees;
    for (Worker& w : workers) {
      reservoir_bench::destroy_stream(a, w.stream);
      allocs.push_back(&w.alloc_ns);
      frees.push_back(&w.free_ns);
    }
    rows.push_back({ci, allocator, summarize(allocs, plan.clock_cost_ns),
                    summarize(frees, plan.clock_cost_ns)});
  }
  return rows;
}

TextTable latency_table(const std::vector<LatencyRow>& rows) {
  TextTable t;
  t.header = {"cell",      "allocator", "calls",    "alloc p50",  "alloc p99", "alloc p99.9",
              "alloc max", "free p50",  "free p99", "free p99.9", "free max"};
  std::vector<LatencyRow> sorted = rows;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const LatencyRow& x, const LatencyRow& y) { return x.cell < y.cell; });
  for (const LatencyRow& r : sorted) {
    std::vector<std::string> cells = {kCells[r.cell].name, r.allocator,
                                      with_separators(static_cast<long long>(r.alloc.calls))};
    for (const LatencySummary* s : {&r.alloc, &r.free})
      for (std::int64_t v : {s->p50, s->p99, s->p999, s->max})
        cells.push_back(format_ns(v, s->calls));
    t.rows.push_back(std::move(cells));
  }
  return t;
}

std::string describe_clock(const ClockCost& c) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Clock: std::chrono::steady_clock (clock_gettime(CLOCK_MONOTONIC), no rdtsc); "
                "one reading costs %lld ns (median of %zu back-to-back pairs; smallest "
                "non-zero %lld ns), taken off every call's time (floored at 0).",
                static_cast<long long>(c.median_ns), c.pairs,
                static_cast<long long>(c.smallest_ns));
  return buf;
}

}  // namespace reservoir_bench
