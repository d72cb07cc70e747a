// reservoir_c10_replay: a trace (docs/trace_format.md, plain or gzip) replayed through
// PyTorch's native caching allocator (c10) or cudaMallocAsync on the GPU: the ground
// truth Reservoir's replays are compared with (scripts/gpu/truth.sh). Built with
// -DTORCH_DIR; reservoir_async_replay is the same program without c10 (--api async).
//
//   reservoir_c10_replay TRACE [--api c10|async] [--fit] [--no-warmup]
//
// Prints one JSON line: peak reserved / requested / allocated, device allocations and
// frees, host ns per event, ok (no OOM); with --fit (c10 only) the smallest
// per-process memory fraction under which the whole trace runs (bisection to 0.05%
// relative precision, each probe from an empty cache) as fit_bytes (fraction * total
// from cudaMemGetInfo) and fit_ratio (/ peak requested).
//
// c10 reads PYTORCH_CUDA_ALLOC_CONF once, at its initialization: one process per
// setting. Lines: a = raw_alloc_with_stream on the trace stream's own CUDA stream,
// f = raw_delete, u = recordStream on the block (as Tensor.record_stream), s =
// cudaStreamSynchronize. async: cudaMallocAsync / cudaFreeAsync on the allocating
// stream of the default pool with release threshold UINT64_MAX; a block used on other
// streams is freed after the allocating stream waits for them (events); peak reserved
// is cudaMemPoolAttrReservedMemHigh, peak requested the peak of live bytes.
// The measured run follows a warm-up run (CUDA and c10 initialized), from a cold
// cache (emptyCache / pool trimmed to 0, peaks and counters reset).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "trace_reader.hpp"
#if RESERVOIR_BENCH_WITH_C10
#include "c10_api.hpp"
#endif

namespace {

using reservoir::replay::EventKind;
using reservoir::replay::Trace;

constexpr double kFitPrecision = 0.0005;  // (hi - lo) / hi at the end of the bisection

const char* kUsage =
    "usage: reservoir_c10_replay TRACE [--api c10|async] [--fit] [--no-warmup]\n"
    "  --api c10    PyTorch's native caching allocator (default; PYTORCH_CUDA_ALLOC_CONF applies)\n"
    "  --api async  cudaMallocAsync on the device's default pool, nothing released\n"
    "  --fit        also the smallest memory fraction that runs the trace (c10)\n"
    "  --no-warmup  measure the first run (CUDA and allocator start-up included)\n";

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "reservoir_c10_replay: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

struct Run {
  bool ok = true;
  std::uint64_t events = 0;  // replayed before the first OOM (all when ok)
  double ns_per_event = 0;
  std::uint64_t peak_live = 0;
};

// The allocator under test, as the replay loop sees it.
struct Api {
  virtual ~Api() = default;
  virtual void cold() = 0;  // empty cache, peaks and counters reset
  virtual bool alloc(std::size_t size, cudaStream_t s, void** p) = 0;
  virtual void free(void* p, cudaStream_t alloc_stream, const std::vector<cudaStream_t>& uses) = 0;
  virtual void use(void* p, cudaStream_t s) = 0;
};

Run replay(const Trace& t, const std::vector<cudaStream_t>& streams, Api& api) {
  std::vector<void*> ptrs(t.allocations, nullptr);
  std::vector<std::uint64_t> sizes(t.allocations, 0);
  std::vector<std::uint16_t> stream_of(t.allocations, 0);  // the allocating trace stream
  std::vector<std::vector<cudaStream_t>> uses(t.allocations);
  std::uint64_t live = 0;
  Run r;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& ev : t.events) {
    const cudaStream_t s = streams[ev.stream];
    switch (ev.kind) {
      case EventKind::alloc:
        if (!api.alloc(ev.size, s, &ptrs[ev.slot])) {
          r.ok = false;
          break;
        }
        sizes[ev.slot] = ev.size;
        stream_of[ev.slot] = ev.stream;
        live += ev.size;
        r.peak_live = std::max(r.peak_live, live);
        break;
      case EventKind::free:
        if (ptrs[ev.slot] != nullptr) api.free(ptrs[ev.slot], s, uses[ev.slot]);
        ptrs[ev.slot] = nullptr;
        uses[ev.slot].clear();
        live -= sizes[ev.slot];
        break;
      case EventKind::use:
        if (ptrs[ev.slot] != nullptr) {
          api.use(ptrs[ev.slot], streams[ev.stream]);
          uses[ev.slot].push_back(streams[ev.stream]);
        }
        break;
      case EventKind::host_wait:
        cudaStreamSynchronize(s);
        break;
      default:
        break;  // sleeps, wakes, empty_cache and pools: refused at load
    }
    if (!r.ok) break;
    ++r.events;
  }
  const auto t1 = std::chrono::steady_clock::now();
  r.ns_per_event = r.events ? std::chrono::duration<double, std::nano>(t1 - t0).count() /
                                  static_cast<double>(r.events)
                            : 0.0;
  // What the trace never freed (weights), and what an OOM left, goes back.
  for (std::uint32_t i = 0; i < t.allocations; ++i)
    if (ptrs[i] != nullptr) api.free(ptrs[i], streams[stream_of[i]], uses[i]);
  cudaDeviceSynchronize();
  return r;
}

class AsyncApi final : public Api {
 public:
  AsyncApi() {
    check(cudaDeviceGetDefaultMemPool(&pool_, 0), "cudaDeviceGetDefaultMemPool");
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep),
          "cudaMemPoolSetAttribute(ReleaseThreshold)");
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~AsyncApi() override { cudaEventDestroy(event_); }
  void cold() override {
    cudaDeviceSynchronize();
    cudaMemPoolTrimTo(pool_, 0);
    std::uint64_t zero = 0;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero);
  }
  bool alloc(std::size_t size, cudaStream_t s, void** p) override {
    if (size == 0) {
      *p = nullptr;
      return true;
    }
    if (cudaMallocAsync(p, size, s) == cudaSuccess) return true;
    (void)cudaGetLastError();
    return false;
  }
  void free(void* p, cudaStream_t s, const std::vector<cudaStream_t>& uses) override {
    // Stream-ordered free: after the other streams' work on the block, as a program
    // using cudaMallocAsync across streams must order it.
    for (cudaStream_t u : uses) {
      cudaEventRecord(event_, u);
      cudaStreamWaitEvent(s, event_, 0);
    }
    cudaFreeAsync(p, s);
  }
  void use(void*, cudaStream_t) override {}
  std::uint64_t reserved_high() {
    std::uint64_t hi = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &hi);
    return hi;
  }

 private:
  cudaMemPool_t pool_ = nullptr;
  cudaEvent_t event_ = nullptr;
};

#if RESERVOIR_BENCH_WITH_C10
class C10Api final : public Api {
 public:
  C10Api() { reservoir_bench::c10_api::init(); }
  void cold() override { reservoir_bench::c10_api::reset_all(); }
  bool alloc(std::size_t size, cudaStream_t s, void** p) override {
    return reservoir_bench::c10_api::try_alloc(size, s, p);
  }
  void free(void* p, cudaStream_t, const std::vector<cudaStream_t>&) override {
    reservoir_bench::c10_api::free(p, nullptr);
  }
  void use(void* p, cudaStream_t s) override { reservoir_bench::c10_api::record_stream(p, s); }
};
#endif

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

struct Options {
  std::string trace, api = "c10";
  bool fit = false, warmup = true;
};

int run(const Options& o) {
#if !RESERVOIR_BENCH_WITH_C10
  if (o.api == "c10") {
    std::fprintf(stderr, "reservoir_c10_replay: built without c10 (configure with -DTORCH_DIR)\n");
    return 2;
  }
#endif
  const Trace t = reservoir::replay::read_trace(o.trace);
  if (t.sleeps + t.wakes + t.empty_caches > 0 || t.pools > 0) {
    std::fprintf(stderr,
                 "reservoir_c10_replay: %s sleeps and wakes tags, empties the cache or routes "
                 "to private pools, which this tool does not replay (reservoir-replay does)\n",
                 o.trace.c_str());
    return 2;
  }
  if (!check(cudaSetDevice(0), "cudaSetDevice") || !check(cudaFree(nullptr), "CUDA init")) return 1;
  std::size_t free_bytes = 0, total = 0;
  if (!check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo")) return 1;
  std::vector<cudaStream_t> streams(std::max<std::uint32_t>(t.streams, 1));
  for (auto& s : streams)
    if (!check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate")) return 1;

  std::unique_ptr<Api> api;
  AsyncApi* async = nullptr;
  if (o.api == "async") {
    auto a = std::make_unique<AsyncApi>();
    async = a.get();
    api = std::move(a);
  } else {
#if RESERVOIR_BENCH_WITH_C10
    api = std::make_unique<C10Api>();
#endif
  }
  if (o.warmup) {
    api->cold();
    (void)replay(t, streams, *api);
  }
  api->cold();
  const Run base = replay(t, streams, *api);

  const char* conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  std::string out =
      "{\"api\": " + json_string(o.api) +
      ", \"trace\": " + json_string(std::filesystem::path(o.trace).filename().string()) +
      ", \"conf\": " + json_string(o.api == "c10" && conf ? conf : "") +
      ", \"events\": " + std::to_string(t.events.size()) +
      ", \"streams\": " + std::to_string(t.streams) + ", \"ok\": " + (base.ok ? "true" : "false") +
      ", \"events_done\": " + std::to_string(base.events);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", base.ns_per_event);
  out += ", \"ns_per_event\": " + std::string(buf);
  out += ", \"device_total\": " + std::to_string(total);
  if (async) {
    out += ", \"peak_reserved\": " + std::to_string(async->reserved_high()) +
           ", \"peak_requested\": " + std::to_string(base.peak_live) +
           ", \"peak_allocated\": null, \"num_device_alloc\": null, \"num_device_free\": null";
  }
#if RESERVOIR_BENCH_WITH_C10
  if (!async) {
    const auto s = reservoir_bench::c10_api::stats();
    const std::uint64_t peak_requested = s.peak_requested;
    out += ", \"peak_reserved\": " + std::to_string(s.peak_reserved) +
           ", \"peak_requested\": " + std::to_string(s.peak_requested) +
           ", \"peak_allocated\": " + std::to_string(s.peak_allocated) +
           ", \"num_device_alloc\": " + std::to_string(s.num_device_alloc) +
           ", \"num_device_free\": " + std::to_string(s.num_device_free) +
           ", \"num_alloc_retries\": " + std::to_string(s.num_alloc_retries);
    if (o.fit) {
      // Bisection on the fraction; each probe starts from an empty cache.
      const auto t0 = std::chrono::steady_clock::now();
      int probes = 0;
      auto works = [&](double fraction) {
        ++probes;
        api->cold();
        reservoir_bench::c10_api::set_memory_fraction(fraction);
        return replay(t, streams, *api).ok;
      };
      const double dtotal = static_cast<double>(total);
      double lo = static_cast<double>(t.peak_live_bytes) / dtotal;
      double hi = std::min(1.0, static_cast<double>(s.peak_reserved) * 1.01 / dtotal);
      bool fits = true;
      while (!works(hi)) {
        if (hi >= 1.0) {
          fits = false;
          break;
        }
        lo = hi;
        hi = std::min(1.0, hi * 2);
      }
      if (fits && works(lo)) hi = lo;
      while (fits && (hi - lo) / hi > kFitPrecision) {
        const double mid = 0.5 * (lo + hi);
        (works(mid) ? hi : lo) = mid;
      }
      reservoir_bench::c10_api::set_memory_fraction(1.0);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (fits) {
        std::snprintf(buf, sizeof buf, "%.0f", hi * dtotal);
        out += ", \"fit_bytes\": " + std::string(buf);
        std::snprintf(buf, sizeof buf, "%.6f", hi * dtotal / static_cast<double>(peak_requested));
        out += ", \"fit_ratio\": " + std::string(buf);
        std::snprintf(buf, sizeof buf, "%.8f", hi);
        out += ", \"fit_fraction\": " + std::string(buf);
      } else {
        out += ", \"fit_bytes\": null, \"fit_ratio\": null, \"fit_fraction\": null";
      }
      std::snprintf(buf, sizeof buf, "%.2f", seconds);
      out += ", \"fit_probes\": " + std::to_string(probes) + ", \"fit_seconds\": " + buf;
    }
  }
#endif
  std::printf("%s}\n", out.c_str());
  std::fflush(stdout);
  for (auto s : streams) cudaStreamDestroy(s);
  return base.ok ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--fit") {
      o.fit = true;
    } else if (a == "--no-warmup") {
      o.warmup = false;
    } else if (a == "--api" && i + 1 < argc) {
      o.api = argv[++i];
    } else if (a[0] != '-' && o.trace.empty()) {
      o.trace = a;
    } else {
      std::fprintf(stderr, "reservoir_c10_replay: bad argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (o.trace.empty() || (o.api != "c10" && o.api != "async") || (o.fit && o.api != "c10")) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reservoir_c10_replay: %s\n", e.what());
    return 1;
  }
}
