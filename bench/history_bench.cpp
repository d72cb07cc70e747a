// Host cost of history (Allocator::record_history) on the simulated device (Google
// Benchmark): alloc+free pairs, as BM_Pair in engine_bench.cpp, with history off, on
// without context, and on with a context recorder at every level that calls it.
// A pair with history on records alloc, free_requested and free_completed.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace {

using reservoir::Allocator;
using reservoir::ContextLevel;

enum class Mode { off, on, tracker, context_state, context_all };

// One allocator per mode, so that modes do not share a history.
Allocator& allocator(Mode mode) {
  static Allocator* allocators[5] = {};
  Allocator*& a = allocators[static_cast<int>(mode)];
  if (a) return *a;
  reservoir::SimOptions o;
  o.capacity = std::size_t{141} << 30;
  a = new Allocator(std::make_shared<reservoir::SimBackend>(o), reservoir::Config{});
  auto recorder = [] { return std::string("train.py:42 step"); };
  switch (mode) {
    case Mode::off:
      break;
    case Mode::on:
      a->record_history(true, 100000);
      break;
    case Mode::tracker:  // history off, one tracker that counts
      a->attach_trace_tracker([](const reservoir::TraceEntry& e) {
        static std::size_t n = 0;
        n += e.size != 0;
        benchmark::DoNotOptimize(n);
      });
      break;
    case Mode::context_state:  // the recorder runs once per allocation
      a->record_history(true, 100000, ContextLevel::state, recorder);
      break;
    case Mode::context_all:  // and once per free
      a->record_history(true, 100000, ContextLevel::all, recorder);
      break;
  }
  return *a;
}

void pairs(benchmark::State& state, Mode mode) {
  Allocator& a = allocator(mode);
  const auto size = static_cast<std::size_t>(state.range(0));
  for (int i = 0; i < 100; ++i) a.deallocate(a.allocate(size, 1, 0));
  for (auto _ : state) {
    void* p = a.allocate(size, 1, 0);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_PairHistoryOff(benchmark::State& state) {
  pairs(state, Mode::off);
}
void BM_PairHistoryOn(benchmark::State& state) {
  pairs(state, Mode::on);
}
void BM_PairTrackerOnly(benchmark::State& state) {
  pairs(state, Mode::tracker);
}
void BM_PairHistoryContextState(benchmark::State& state) {
  pairs(state, Mode::context_state);
}
void BM_PairHistoryContextAll(benchmark::State& state) {
  pairs(state, Mode::context_all);
}

BENCHMARK(BM_PairHistoryOff)->Arg(512)->Arg(1 << 20);
BENCHMARK(BM_PairHistoryOn)->Arg(512)->Arg(1 << 20);
BENCHMARK(BM_PairTrackerOnly)->Arg(512)->Arg(1 << 20);
BENCHMARK(BM_PairHistoryContextState)->Arg(512)->Arg(1 << 20);
BENCHMARK(BM_PairHistoryContextAll)->Arg(512)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
