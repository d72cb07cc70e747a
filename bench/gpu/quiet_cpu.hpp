// The quietest CPU for a single-threaded measurement, chosen just before it.
//
// On a shared host (a virtual machine whose CPUs share cores and caches with other
// tenants), the same loop runs up to twice as slow on one CPU as on another, and which
// CPUs are slow changes over minutes (measured on the H200 host: a glibc malloc+free
// pair of 512 B took 9.7 ns on its fastest CPU and 18.6 ns on its slowest, in one
// sweep). A single-threaded cell that lands on a busy CPU measures the neighbour, not
// the allocator. QuietCpu runs a short calibration loop (glibc malloc+free pairs of
// 512 B, an allocator-like mix of loads, stores and branches) on every CPU the process
// may use, pins the calling thread to the fastest for its lifetime and then gives the
// thread its whole CPU set back. Every allocator's cell is measured the same way.
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
  int cpu = -1;          // the CPU chosen (-1: pinning off, or no CPU could be pinned)
  double best_ns = 0;    // on the CPU chosen
  double median_ns = 0;  // the median over the CPUs swept
  int swept = 0;         // CPUs swept
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
