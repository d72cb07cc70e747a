// QuietCpu: the calibration sweep and the pin (see quiet_cpu.hpp).
#include "quiet_cpu.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace reservoir_bench {

namespace {

// Pairs per calibration pass, and passes per CPU (the fastest pass counts: a pass is
// short enough for one interrupt to spoil it).
constexpr int kPairs = 20000;
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

// ns per glibc malloc+free pair of 512 B on the CPU the thread runs on.
double calibrate() {
  double best = 1e30;
  for (int pass = 0; pass < kPasses; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPairs; ++i) {
      void* p = std::malloc(512);
      asm volatile("" : : "r"(p) : "memory");  // the pair is not optimized away
      std::free(p);
    }
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / kPairs);
  }
  return best;
}

}  // namespace

QuietCpu::QuietCpu() {
  if (!enabled() || sched_getaffinity(0, sizeof saved_, &saved_) != 0) return;
  restore_ = true;
  std::vector<double> times;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &saved_) || !pin_to(cpu)) continue;
    const double ns = calibrate();
    times.push_back(ns);
    if (sweep_.cpu < 0 || ns < sweep_.best_ns) {
      sweep_.cpu = cpu;
      sweep_.best_ns = ns;
    }
  }
  sweep_.swept = static_cast<int>(times.size());
  if (times.empty()) return;
  std::sort(times.begin(), times.end());
  sweep_.median_ns = times[times.size() / 2];
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
  int swept = 0;
  for (const CpuSweep& s : g_sweeps) {
    best_lo = std::min(best_lo, s.best_ns);
    best_hi = std::max(best_hi, s.best_ns);
    median_lo = std::min(median_lo, s.median_ns);
    median_hi = std::max(median_hi, s.median_ns);
    swept = std::max(swept, s.swept);
  }
  char text[512];
  std::snprintf(text, sizeof text,
                "Single-thread cells (pairs, log-uniform, replays) each ran pinned to the CPU "
                "on which a calibration loop (glibc malloc+free of 512 B) ran fastest just "
                "before it, for every allocator alike (%zu sweeps over %d CPUs; calibration "
                "pair on the CPU chosen %.1f-%.1f ns, median over the CPUs %.1f-%.1f ns); "
                "thread cells and the latency table ran unpinned.",
                g_sweeps.size(), swept, best_lo, best_hi, median_lo, median_hi);
  return text;
}

}  // namespace reservoir_bench
