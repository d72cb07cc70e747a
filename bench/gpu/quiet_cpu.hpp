// The quietest CPU for a single-threaded measurement, chosen just before it.
//
// On a shared host (a virtual machine whose CPUs share cores and caches with other
// tenants), the same loop runs up to twice as slow on one CPU as on another, and which
// CPUs are slow changes over minutes (measured on the H200 host: a glibc malloc+free
// pair of 512 B took 9.7 ns on its fastest CPU and 18.6 ns on its slowest, in one
// sweep). A single-threaded cell that lands on a busy CPU measures the neighbour, not
// the allocator. QuietCpu runs two short calibration loops on every CPU the process
// may use: glibc malloc+free pairs of 512 B (an allocator-like mix of loads, stores and
// branches) and a pointer chase over 1 MiB (slow where a neighbour shares the core's
// caches, which the first loop hardly sees: on 2026-12-03 13:41 the log-uniform cell,
// whose blocks do not fit the first-level cache, took 285.9 and 236.4 ns in two tables
// a minute apart whose pairs and first loops were alike). It pins the calling thread to the CPU
// with the lowest product of the two times for its lifetime, then gives the thread
// its whole CPU set back. Every allocator's cell is measured the same way.
//
// Threads created while a QuietCpu is alive inherit the pin: multi-threaded cells run
// outside one.
#pragma once

#include <sched.h>

#include <string>
#include <vector>

namespace reservoir_bench {

// What one calibration sweep found (ns per calibration pair).
struct CpuSweep {
  int cpu = -1;             // the CPU chosen (-1: pinning off, or no CPU could be pinned)
  double best_ns = 0;       // a calibration pair on the CPU chosen
  double chase_ns = 0;      // a chase step on the CPU chosen
  double median_ns = 0;     // a calibration pair: the median over the CPUs swept
  double best_score = 0;    // pair ns x chase ns on the CPU chosen: the lowest swept
  double median_score = 0;  // the median score over the CPUs swept
  int swept = 0;            // CPUs swept
};

class QuietCpu {
 public:
  // Sweeps and pins the calling thread (nothing when pinning is off).
  QuietCpu();
  ~QuietCpu();  // the calling thread's CPU set as it was
  QuietCpu(const QuietCpu&) = delete;
  QuietCpu& operator=(const QuietCpu&) = delete;
  const CpuSweep& sweep() const { return sweep_; }

  // Off: every QuietCpu does nothing (reservoir_gpu_bench --no-pin).
  static void set_enabled(bool on);
  static bool enabled();
  // One sentence on the sweeps so far (how many, the CPU times' ranges), for reports.
  static std::string describe();

 private:
  cpu_set_t saved_;
  bool restore_ = false;
  CpuSweep sweep_;
};

}  // namespace reservoir_bench
