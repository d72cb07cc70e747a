// Host cost of the engine on the simulated device (Google Benchmark). The same
// patterns as the GPU anchors (shared/tools/anchor_bench.cpp): alloc+free pairs at
// 512 B / 1 MiB / 64 MiB, log-uniform 256 B-64 MiB with 512 live blocks, and 1 MiB
// pairs with 2 and 8 threads each on its own stream (time per pair = total time /
// all pairs, as the anchors count it), and one thread taking turns between 1, 2, 8,
// 128 and 512 streams, and mixed sizes taking turns between 1, 8 and 64 streams. BM_GlibcPair is
// the host peer timed in the same run: the host-cost target bounds a 512 B Reservoir pair on the
// simulated device at 4x a glibc malloc+free pair of 512 B (BM_PairOverGlibc: that ratio, from
// alternated slices). CI runs it with --benchmark_min_time=0.002 as a smoke test.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace {

using reservoir::Allocator;

Allocator& shared_allocator() {
  static auto* a = [] {
    reservoir::SimOptions o;
    o.capacity = std::size_t{141} << 30;
    // RESERVOIR_ALLOC_CONF as the library reads it (e.g. policy:compact).
    return new Allocator(std::make_shared<reservoir::SimBackend>(o),
                         reservoir::Config::from_environment());
  }();
  return *a;
}

void BM_Pair(benchmark::State& state) {
  Allocator& a = shared_allocator();
  const auto size = static_cast<std::size_t>(state.range(0));
  for (int i = 0; i < 100; ++i) a.deallocate(a.allocate(size, 1, 0));
  for (auto _ : state) {
    void* p = a.allocate(size, 1, 0);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pair)->Arg(512)->Arg(1 << 20)->Arg(64 << 20);

// The same pair through allocate's default device argument (-1, the current device),
// as the README's example calls it: with one device it costs what device 0 costs.
void BM_PairCurrentDevice(benchmark::State& state) {
  Allocator& a = shared_allocator();
  const auto size = static_cast<std::size_t>(state.range(0));
  for (int i = 0; i < 100; ++i) a.deallocate(a.allocate(size, 1));
  for (auto _ : state) {
    void* p = a.allocate(size, 1);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PairCurrentDevice)->Arg(512);

// The peer: glibc's malloc+free of the same size (its thread cache serves 512 B).
void BM_GlibcPair(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(size);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_GlibcPair)->Arg(512);

// The 4x bound as one figure: slices of 512 B pairs through Reservoir and glibc,
// alternated (2,000 pairs each), so that both see the same clock speed; reports the
// median of the slices' ratios (Reservoir ns / glibc ns) and each side's median ns.
// A shared machine's speed swings within seconds: separate runs compare poorly.
void BM_PairOverGlibc(benchmark::State& state) {
  using Clock = std::chrono::steady_clock;
  Allocator& a = shared_allocator();
  const auto size = static_cast<std::size_t>(state.range(0));
  constexpr int kSlice = 2000;
  for (int i = 0; i < 100; ++i) a.deallocate(a.allocate(size, 1, 0));
  std::vector<double> ratios, ours, glibc;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kSlice; ++i) {
      void* p = a.allocate(size, 1, 0);
      benchmark::DoNotOptimize(p);
      a.deallocate(p);
    }
    const auto t1 = Clock::now();
    for (int i = 0; i < kSlice; ++i) {
      void* p = std::malloc(size);
      benchmark::DoNotOptimize(p);
      std::free(p);
    }
    const auto t2 = Clock::now();
    ours.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kSlice);
    glibc.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count() / kSlice);
    ratios.push_back(ours.back() / glibc.back());
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  if (ratios.empty()) return;
  state.counters["ratio"] = median(ratios);
  state.counters["reservoir_ns"] = median(ours);
  state.counters["glibc_ns"] = median(glibc);
  state.SetItemsProcessed(state.iterations() * kSlice);
}
BENCHMARK(BM_PairOverGlibc)->Arg(512);

// 512 live blocks of log-uniform sizes 256 B-2^max_log2 B: each step frees a random
// one and allocates on the next of n streams from first (seeded: the same sequence
// every run).
void log_uniform_steps(benchmark::State& state, std::uint64_t seed, double max_log2,
                       reservoir::StreamHandle first, reservoir::StreamHandle n) {
  Allocator& a = shared_allocator();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(0, 511);
  std::uniform_real_distribution<double> lg(8.0, max_log2);
  std::vector<std::size_t> sizes(1 << 16);
  for (auto& z : sizes) z = static_cast<std::size_t>(std::pow(2.0, lg(rng)));
  std::vector<void*> live(512);
  for (std::size_t i = 0; i < live.size(); ++i) live[i] = a.allocate(sizes[i], first + i % n, 0);
  std::size_t i = 0;
  for (auto _ : state) {
    const int k = pick(rng);
    a.deallocate(live[k]);
    live[k] = a.allocate(sizes[i & (sizes.size() - 1)], first + i % n, 0);
    ++i;
  }
  for (void* p : live) a.deallocate(p);
  state.SetItemsProcessed(state.iterations());
}
void BM_LogUniform512Live(benchmark::State& state) {
  log_uniform_steps(state, 42, 26.0, 2, 1);
}
BENCHMARK(BM_LogUniform512Live);

void BM_PairThreadsOwnStreams(benchmark::State& state) {
  Allocator& a = shared_allocator();
  const reservoir::StreamHandle stream =
      100 + static_cast<reservoir::StreamHandle>(state.thread_index());
  for (int i = 0; i < 100; ++i) a.deallocate(a.allocate(1 << 20, stream, 0));
  for (auto _ : state) {
    void* p = a.allocate(1 << 20, stream, 0);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
}
// Real time: the anchors divide wall time by all pairs of all threads.
BENCHMARK(BM_PairThreadsOwnStreams)->Threads(1)->Threads(2)->Threads(8)->UseRealTime();

// One thread taking turns between N streams, a 1 KiB pair on each in turn (a compute
// stream and a copy or communication stream taking turns is the common shape of real
// programs): the per-pair cost should not depend on N. Streams 1000.. are this
// benchmark's own, warmed first.
void BM_PairInterleavedStreams(benchmark::State& state) {
  Allocator& a = shared_allocator();
  const auto n = static_cast<reservoir::StreamHandle>(state.range(0));
  for (reservoir::StreamHandle s = 0; s < n; ++s)
    for (int i = 0; i < 4; ++i) a.deallocate(a.allocate(1024, 1000 + s, 0));
  reservoir::StreamHandle s = 0;
  for (auto _ : state) {
    void* p = a.allocate(1024, 1000 + s, 0);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
    if (++s == n) s = 0;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PairInterleavedStreams)->Arg(1)->Arg(2)->Arg(8)->Arg(128)->Arg(512);

// Mixed sizes (log-uniform 256 B-4 MiB, 512 live) taking turns between N streams: each
// request on the next stream, freeing a random live block (of any stream). Under
// policy:compact the memory of one stream's frees serves the others, after device-side
// waits for their work: the waits and the bookkeeping of the streams' marks per
// request. Streams 2000.. are this benchmark's own.
void BM_LogUniformInterleavedStreams(benchmark::State& state) {
  log_uniform_steps(state, 7, 22.0, 2000, static_cast<reservoir::StreamHandle>(state.range(0)));
}
BENCHMARK(BM_LogUniformInterleavedStreams)->Arg(1)->Arg(8)->Arg(64);

// A host wait (Stream.synchronize) on one stream while N other streams each have a
// free pending on a busy stream: the wait should visit only the pools waiting on the
// stream waited for, whatever N. Streams 3000.. are this benchmark's own.
void BM_HostWaitBesideWaitingStreams(benchmark::State& state) {
  Allocator& a = shared_allocator();
  const auto n = static_cast<reservoir::StreamHandle>(state.range(0));
  constexpr reservoir::StreamHandle kBusy = 2998, kWaited = 2999;
  for (reservoir::StreamHandle s = 0; s < n; ++s) {
    void* p = a.allocate(4096, 3000 + s, 0);
    a.record_stream(p, kBusy);
    a.deallocate(p);
  }
  for (auto _ : state) a.notify_host_wait(kWaited, 0);
  state.SetItemsProcessed(state.iterations());
  a.notify_host_wait(kBusy, 0);  // the pending frees complete: nothing stays behind
  for (reservoir::StreamHandle s = 0; s < n; ++s) a.release_stream(3000 + s, 0);
}
BENCHMARK(BM_HostWaitBesideWaitingStreams)->Arg(1)->Arg(512);

}  // namespace

BENCHMARK_MAIN();
