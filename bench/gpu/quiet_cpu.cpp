// QuietCpu: the calibration sweep and the pin (see quiet_cpu.hpp).
#include "quiet_cpu.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <random>

namespace reservoir_bench {

namespace {

// Per calibration pass: malloc+free pairs, and steps of a pointer chase over 1 MiB (a
// random cycle through 16384 cache lines: it fits a core's own cache when nothing
// else uses it, so it slows down on a CPU whose caches a neighbour shares). Passes per
// CPU: the fastest counts (a pass is short enough for one interrupt to spoil it).
constexpr int kPairs = 20000;
constexpr int kChaseSteps = 20000;
constexpr std::size_t kChaseLines = 16384;
constexpr std::size_t kLineWords = 64 / sizeof(std::uint32_t);
constexpr int kPasses = 3;

bool g_enabled = true;
std::mutex g_mutex;  // guards the records below
std::vector<CpuSweep> g_sweeps;

bool pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof one, &one) == 0;
}

// The chase's cycle: word kLineWords * i holds the line after line i (fixed seed).
const std::vector<std::uint32_t>& chase_cycle() {
  static const std::vector<std::uint32_t> cycle = [] {
    std::vector<std::uint32_t> order(kChaseLines);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    std::vector<std::uint32_t> words(kChaseLines * kLineWords, 0);
    for (std::size_t i = 0; i < kChaseLines; ++i)
      words[order[i] * kLineWords] = order[(i + 1) % kChaseLines];
    return words;
  }();
  return cycle;
}

struct Calibration {
  double pair_ns = 0;   // per glibc malloc+free pair of 512 B
  double chase_ns = 0;  // per step of the chase
};

// Both loops' best pass on the CPU the thread runs on.
Calibration calibrate() {
  using clock = std::chrono::steady_clock;
  const std::vector<std::uint32_t>& cycle = chase_cycle();
  Calibration best{1e30, 1e30};
  for (int pass = 0; pass < kPasses; ++pass) {
    auto t0 = clock::now();
    for (int i = 0; i < kPairs; ++i) {
      void* p = std::malloc(512);
      asm volatile("" : : "r"(p) : "memory");  // the pair is not optimized away
      std::free(p);
    }
    auto t1 = clock::now();
    best.pair_ns =
        std::min(best.pair_ns, std::chrono::duration<double, std::nano>(t1 - t0).count() / kPairs);
    std::uint32_t line = 0;
    t0 = clock::now();
    for (int i = 0; i < kChaseSteps; ++i) line = cycle[line * kLineWords];
    t1 = clock::now();
    asm volatile("" : : "r"(line));  // the chase is not optimized away
    best.chase_ns = std::min(
        best.chase_ns, std::chrono::duration<double, std::nano>(t1 - t0).count() / kChaseSteps);
  }
  return best;
}

}  // namespace

QuietCpu::QuietCpu() {
  if (!enabled() || sched_getaffinity(0, sizeof saved_, &saved_) != 0) return;
  restore_ = true;
  std::vector<double> pairs, scores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &saved_) || !pin_to(cpu)) continue;
    const Calibration c = calibrate();
    // Both loops count alike, whatever their scales: the product of their times.
    const double score = c.pair_ns * c.chase_ns;
    pairs.push_back(c.pair_ns);
    scores.push_back(score);
    if (sweep_.cpu < 0 || score < sweep_.best_score) {
      sweep_.cpu = cpu;
      sweep_.best_ns = c.pair_ns;
      sweep_.chase_ns = c.chase_ns;
      sweep_.best_score = score;
    }
  }
  sweep_.swept = static_cast<int>(pairs.size());
  if (pairs.empty()) return;
  std::sort(pairs.begin(), pairs.end());
  std::sort(scores.begin(), scores.end());
  sweep_.median_ns = pairs[pairs.size() / 2];
  sweep_.median_score = scores[scores.size() / 2];
  if (!pin_to(sweep_.cpu)) sweep_.cpu = -1;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sweeps.push_back(sweep_);
}

QuietCpu::~QuietCpu() {
  if (restore_) sched_setaffinity(0, sizeof saved_, &saved_);
}

void QuietCpu::set_enabled(bool on) {
  g_enabled = on;
}

bool QuietCpu::enabled() {
  return g_enabled;
}

std::string QuietCpu::describe() {
  if (!g_enabled) return "Single-thread cells ran wherever the scheduler put them (--no-pin).";
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_sweeps.empty()) return "No CPU could be pinned: every cell ran unpinned.";
  double best_lo = 1e30, best_hi = 0, median_lo = 1e30, median_hi = 0;
  double chase_lo = 1e30, chase_hi = 0;
  int swept = 0;
  for (const CpuSweep& s : g_sweeps) {
    best_lo = std::min(best_lo, s.best_ns);
    best_hi = std::max(best_hi, s.best_ns);
    chase_lo = std::min(chase_lo, s.chase_ns);
    chase_hi = std::max(chase_hi, s.chase_ns);
    median_lo = std::min(median_lo, s.median_ns);
    median_hi = std::max(median_hi, s.median_ns);
    swept = std::max(swept, s.swept);
  }
  char text[640];
  std::snprintf(text, sizeof text,
                "Single-thread cells (pairs, log-uniform, replays) each ran pinned to the CPU "
                "on which two calibration loops (glibc malloc+free of 512 B; a pointer chase "
                "over 1 MiB) ran fastest just before it, for every allocator alike (%zu "
                "sweeps over %d CPUs; on the CPUs chosen a calibration pair took %.1f-%.1f ns "
                "(median over all CPUs %.1f-%.1f) and a chase step %.1f-%.1f ns); the stream "
                "turn rows of a column ran on one such CPU, their rounds alternating; thread "
                "cells and the latency table ran unpinned.",
                g_sweeps.size(), swept, best_lo, best_hi, median_lo, median_hi, chase_lo, chase_hi);
  return text;
}

}  // namespace reservoir_bench
