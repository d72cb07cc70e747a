// QuietCpu (quiet_cpu.*): the sweep covers the CPUs the thread may use, pins it to
// one of them, and gives the set back.
#include "quiet_cpu.hpp"

#include <gtest/gtest.h>

#include <string>

namespace reservoir_bench {
namespace {

cpu_set_t current_set() {
  cpu_set_t set;
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  return set;
}

int only_cpu(const cpu_set_t& set) {
  if (CPU_COUNT(&set) != 1) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) return cpu;
  return -1;
}

TEST(QuietCpu, PinsTheThreadToTheFastestCpuOfItsSetAndGivesTheSetBack) {
  const cpu_set_t before = current_set();
  {
    QuietCpu pin;
    const CpuSweep& s = pin.sweep();
    EXPECT_EQ(s.swept, CPU_COUNT(&before));
    ASSERT_GE(s.cpu, 0);
    EXPECT_TRUE(CPU_ISSET(s.cpu, &before));
    EXPECT_EQ(only_cpu(current_set()), s.cpu);
    EXPECT_GT(s.best_ns, 0.0);
    EXPECT_GT(s.chase_ns, 0.0);
    EXPECT_DOUBLE_EQ(s.best_score, s.best_ns * s.chase_ns);
    EXPECT_LE(s.best_score, s.median_score);  // the chosen CPU scored lowest
  }
  const cpu_set_t after = current_set();
  EXPECT_TRUE(CPU_EQUAL(&before, &after));
  EXPECT_NE(QuietCpu::describe().find("sweeps over"), std::string::npos);
}

TEST(QuietCpu, SweepsOnlyTheCpusTheThreadMayUse) {
  const cpu_set_t before = current_set();
  int first = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE && first < 0; ++cpu)
    if (CPU_ISSET(cpu, &before)) first = cpu;
  ASSERT_GE(first, 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);  // as under taskset -c FIRST
  {
    QuietCpu pin;
    EXPECT_EQ(pin.sweep().swept, 1);
    EXPECT_EQ(pin.sweep().cpu, first);
  }
  EXPECT_EQ(only_cpu(current_set()), first);  // the restricted set, as it was
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
}

TEST(QuietCpu, OffLeavesTheThreadWhereItWas) {
  const cpu_set_t before = current_set();
  QuietCpu::set_enabled(false);
  {
    QuietCpu pin;
    EXPECT_EQ(pin.sweep().cpu, -1);
    EXPECT_EQ(pin.sweep().swept, 0);
    const cpu_set_t inside = current_set();
    EXPECT_TRUE(CPU_EQUAL(&before, &inside));
  }
  EXPECT_NE(QuietCpu::describe().find("--no-pin"), std::string::npos);
  QuietCpu::set_enabled(true);
}

}  // namespace
}  // namespace reservoir_bench
