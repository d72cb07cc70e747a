// reservoir_driver_call_bench: the host cost of each device call policy:compact and
// expandable segments make, by size, on a real GPU (Google Benchmark, manual time:
// only the call itself is timed). Through CudaBackend, so these are the calls the
// engine makes, wrapper included:
//   - BM_CreatePhysical / BM_ReleasePhysical: cuMemCreate / cuMemRelease of N MiB;
//   - BM_Map / BM_Unmap: cuMemMap / cuMemUnmap of one handle of N MiB;
//   - BM_SetAccess: cuMemSetAccess over N MiB backed by one handle;
//   - BM_SetAccessPages / BM_UnmapPages: one call over N MiB backed by 2 MiB handles
//     (N / 2 of them), the case of a run of pages;
//   - BM_RecordEvent, BM_QueryEvent, BM_StreamWaitEvent: one event call.
// The question it answers: how the cost of a move (unmap + map + access) grows with
// the size of the physical unit, and so what a larger unit saves per byte moved.
//
//   reservoir_driver_call_bench [--benchmark_filter=...] [--benchmark_format=json]
// Skips with a message (exit 0) when no GPU is present.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "reservoir/cuda_backend.hpp"

namespace {

using reservoir::CudaBackend;
using reservoir::DeviceStatus;
using reservoir::EventHandle;
using reservoir::PhysicalHandle;
using reservoir::StreamHandle;
using Clock = std::chrono::steady_clock;

constexpr int kDevice = 0;
constexpr std::size_t kMiB = std::size_t{1} << 20;

CudaBackend& backend() {
  static CudaBackend b;
  return b;
}

void check(benchmark::State& state, DeviceStatus s, const char* what) {
  if (s != DeviceStatus::ok)
    state.SkipWithError((std::string(what) + ": " + backend().last_error()).c_str());
}

// Times one call: the iteration's time is the call's alone.
template <class F>
DeviceStatus timed(benchmark::State& state, F&& call) {
  const auto t = Clock::now();
  const DeviceStatus s = call();
  state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t).count());
  return s;
}

// An address range of bytes and the handles mapped into it, released at the end.
struct Range {
  void* base = nullptr;
  std::size_t bytes = 0;
  explicit Range(std::size_t b) : bytes(b) {
    (void)backend().reserve_address_range(kDevice, bytes, 0, &base);
  }
  ~Range() {
    if (base) (void)backend().release_address_range(kDevice, base, bytes);
  }
};

std::size_t bytes_of(const benchmark::State& state) {
  return static_cast<std::size_t>(state.range(0)) * kMiB;
}

void BM_CreatePhysical(benchmark::State& state) {
  const std::size_t bytes = bytes_of(state);
  for (auto _ : state) {
    PhysicalHandle h = 0;
    check(state, timed(state, [&] { return backend().create_physical(kDevice, bytes, &h); }),
          "create_physical");
    (void)backend().release_physical(kDevice, h);
  }
}

void BM_ReleasePhysical(benchmark::State& state) {
  const std::size_t bytes = bytes_of(state);
  for (auto _ : state) {
    PhysicalHandle h = 0;
    check(state, backend().create_physical(kDevice, bytes, &h), "create_physical");
    check(state, timed(state, [&] { return backend().release_physical(kDevice, h); }),
          "release_physical");
  }
}

// One handle of bytes, mapped and unmapped in a range of its own; times the call
// selected by which (0 map, 1 set_access, 2 unmap).
void map_cycle(benchmark::State& state, int which) {
  const std::size_t bytes = bytes_of(state);
  Range range(bytes);
  PhysicalHandle h = 0;
  check(state, backend().create_physical(kDevice, bytes, &h), "create_physical");
  const int devices[] = {kDevice};
  for (auto _ : state) {
    auto map = [&] { return backend().map(kDevice, range.base, bytes, h); };
    auto access = [&] { return backend().set_access(kDevice, range.base, bytes, devices, 1); };
    auto unmap = [&] { return backend().unmap(kDevice, range.base, bytes); };
    check(state, which == 0 ? timed(state, map) : map(), "map");
    check(state, which == 1 ? timed(state, access) : access(), "set_access");
    check(state, which == 2 ? timed(state, unmap) : unmap(), "unmap");
  }
  (void)backend().release_physical(kDevice, h);
}
void BM_Map(benchmark::State& state) {
  map_cycle(state, 0);
}
void BM_SetAccess(benchmark::State& state) {
  map_cycle(state, 1);
}
void BM_Unmap(benchmark::State& state) {
  map_cycle(state, 2);
}

// bytes backed by 2 MiB handles: one set_access (which 0) or one unmap (which 1)
// over the whole run.
void pages_cycle(benchmark::State& state, int which) {
  const std::size_t bytes = bytes_of(state);
  const std::size_t page = 2 * kMiB;
  Range range(bytes);
  std::vector<PhysicalHandle> handles(bytes / page);
  for (PhysicalHandle& h : handles)
    check(state, backend().create_physical(kDevice, page, &h), "create_physical");
  const int devices[] = {kDevice};
  auto* base = static_cast<char*>(range.base);
  for (auto _ : state) {
    for (std::size_t i = 0; i < handles.size(); ++i)
      check(state, backend().map(kDevice, base + i * page, page, handles[i]), "map");
    auto access = [&] { return backend().set_access(kDevice, base, bytes, devices, 1); };
    auto unmap = [&] { return backend().unmap(kDevice, base, bytes); };
    check(state, which == 0 ? timed(state, access) : access(), "set_access");
    check(state, which == 1 ? timed(state, unmap) : unmap(), "unmap");
  }
  for (PhysicalHandle h : handles) (void)backend().release_physical(kDevice, h);
}
void BM_SetAccessPages(benchmark::State& state) {
  pages_cycle(state, 0);
}
void BM_UnmapPages(benchmark::State& state) {
  pages_cycle(state, 1);
}

// Event calls on a stream of the backend's own (nothing else submitted to it).
void event_call(benchmark::State& state, int which) {
  StreamHandle a = 0, b = 0;
  EventHandle e = 0;
  check(state, backend().create_stream(kDevice, &a), "create_stream");
  check(state, backend().create_stream(kDevice, &b), "create_stream");
  check(state, backend().create_event(kDevice, &e), "create_event");
  for (auto _ : state) {
    auto record = [&] { return backend().record_event(kDevice, e, a); };
    check(state, which == 0 ? timed(state, record) : record(), "record_event");
    if (which == 1) {
      const DeviceStatus s = timed(state, [&] { return backend().query_event(kDevice, e); });
      if (s != DeviceStatus::ok && s != DeviceStatus::not_ready) check(state, s, "query_event");
    }
    if (which == 2)
      check(state, timed(state, [&] { return backend().stream_wait_event(kDevice, b, e); }),
            "stream_wait_event");
  }
  (void)backend().synchronize_device(kDevice);
  (void)backend().destroy_event(kDevice, e);
  (void)backend().destroy_stream(kDevice, a);
  (void)backend().destroy_stream(kDevice, b);
}
void BM_RecordEvent(benchmark::State& state) {
  event_call(state, 0);
}
void BM_QueryEvent(benchmark::State& state) {
  event_call(state, 1);
}
void BM_StreamWaitEvent(benchmark::State& state) {
  event_call(state, 2);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int mib : {2, 8, 32, 128, 512}) b->Arg(mib);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_CreatePhysical)->Apply(sizes);
BENCHMARK(BM_ReleasePhysical)->Apply(sizes);
BENCHMARK(BM_Map)->Apply(sizes);
BENCHMARK(BM_SetAccess)->Apply(sizes);
BENCHMARK(BM_Unmap)->Apply(sizes);
BENCHMARK(BM_SetAccessPages)
    ->Arg(8)
    ->Arg(32)
    ->Arg(128)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_UnmapPages)->Arg(8)->Arg(32)->Arg(128)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RecordEvent)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_QueryEvent)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StreamWaitEvent)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  if (!CudaBackend::available()) {
    std::printf("reservoir_driver_call_bench: skipped, no GPU: %s\n",
                CudaBackend::unavailable_reason().c_str());
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("device 0: %s\n", backend().device_name(kDevice).c_str());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
