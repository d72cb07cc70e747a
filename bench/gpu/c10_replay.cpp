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
// is cudaMemPoolAttrReservedMemHigh, peak requested the peak of live bytes. c10 also
// replays trace v2's c lines (emptyCache) and private pools (createOrIncrefPool,
// beginAllocateToPool with a filter that accepts exactly the requests the trace routed,
// endAllocateToPool, releasePool, getCheckpointState / setCheckpointPoolState).
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
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
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
  // Private pools (trace v2's pool lines); only c10 has them (a trace with pools is
  // refused for the others at load). id: a pool of this replay.
  virtual void retain_pool(std::uint64_t) {}
  virtual void release_pool(std::uint64_t) {}
  virtual void begin_route(std::uint64_t, std::function<bool(cudaStream_t)>) {}
  virtual void end_route(std::uint64_t) {}
  virtual std::shared_ptr<void> checkpoint(std::uint64_t) { return nullptr; }
  virtual void restore(const std::shared_ptr<void>&, std::vector<void*>*, std::vector<void*>*) {}
  virtual void empty_cache() {}  // c lines (c10 only)
};

// The trace's pools in one replay, as reservoir-replay's TracePools: each trace pool is
// a pool of the allocator (ids fresh per replay, so a probe never meets the last one's),
// each route one whose filter accepts exactly the requests the trace routed to it.
class ReplayPools {
 public:
  ReplayPools(const Trace& t, Api& api)
      : t_(t),
        api_(api),
        base_(next_base_ += 1u << 16),
        uses_(t.pools + 1u, 0),
        routed_(t.pools + 1u, false) {}
  // Ends the routes and drops the uses left, so that the pools' memory goes back at the
  // next empty cache (the next probe starts cold).
  ~ReplayPools() {
    for (std::uint32_t k = 1; k < routed_.size(); ++k) {
      if (routed_[k]) api_.end_route(id(k));
      for (; uses_[k] > 0; --uses_[k]) api_.release_pool(id(k));
    }
  }
  void before_alloc(std::uint32_t slot) {
    target_ = t_.alloc_pools.empty() ? 0 : t_.alloc_pools[slot];
  }
  void after_alloc(std::uint32_t slot, void* p) {
    if (target_ != 0 && p != nullptr) pooled_[p] = slot;
    target_ = 0;
  }
  void on_free(void* p) { pooled_.erase(p); }
  void apply(const reservoir::replay::Event& ev) {
    const std::uint32_t k = ev.slot;
    switch (ev.kind) {
      case EventKind::pool_retain:
        api_.retain_pool(id(k));
        ++uses_[k];
        break;
      case EventKind::pool_release:
        api_.release_pool(id(k));
        --uses_[k];
        break;
      case EventKind::route_begin:
        api_.begin_route(id(k), [this, k](cudaStream_t) { return target_ == k; });
        routed_[k] = true;
        ++uses_[k];
        break;
      case EventKind::route_end:
        api_.end_route(id(k));
        routed_[k] = false;
        break;
      case EventKind::checkpoint: {
        Checkpoint c;
        c.state = api_.checkpoint(id(static_cast<std::uint32_t>(ev.size)));
        for (const auto& [p, slot] : pooled_)
          if (t_.alloc_pools[slot] == ev.size) c.address_of[slot] = p;
        checkpoints_[ev.slot] = std::move(c);
        break;
      }
      default:
        break;
    }
  }
  // events[index] is a restore: restores and applies its y and o events; returns them.
  std::size_t restore(std::size_t index, std::vector<void*>& ptrs) {
    const reservoir::replay::Event& ev = t_.events[index];
    const Checkpoint& c = checkpoints_.at(ev.slot);
    std::vector<void*> freed, allocated;
    api_.restore(c.state, &freed, &allocated);
    for (void* p : freed) pooled_.erase(p);
    std::unordered_map<void*, bool> made;
    for (void* p : allocated) made[p] = false;
    for (std::size_t k = 1; k <= ev.size; ++k) {
      const reservoir::replay::Event& e = t_.events[index + k];
      if (e.kind == EventKind::restore_free) {
        ptrs[e.slot] = nullptr;
      } else if (e.kind == EventKind::restore_alloc) {
        const auto old = c.address_of.find(static_cast<std::uint32_t>(e.size));
        if (old == c.address_of.end()) continue;
        auto it = made.find(old->second);
        if (it == made.end() || it->second) continue;
        it->second = true;
        ptrs[e.slot] = old->second;
        pooled_[old->second] = e.slot;
      }
    }
    for (const auto& [p, named] : made)
      if (!named) orphans.push_back(p);
    return ev.size;
  }
  std::vector<void*> orphans;  // blocks a restore made that no trace ID names

 private:
  std::uint64_t id(std::uint32_t k) const { return base_ + k; }
  struct Checkpoint {
    std::shared_ptr<void> state;
    std::unordered_map<std::uint32_t, void*> address_of;  // pooled slot -> its block then
  };
  const Trace& t_;
  Api& api_;
  static inline std::uint64_t next_base_ = 0;
  const std::uint64_t base_;
  std::uint32_t target_ = 0;
  std::vector<std::int64_t> uses_;
  std::vector<bool> routed_;
  std::unordered_map<void*, std::uint32_t> pooled_;
  std::unordered_map<std::uint32_t, Checkpoint> checkpoints_;
};

Run replay(const Trace& t, const std::vector<cudaStream_t>& streams, Api& api) {
  std::vector<void*> ptrs(t.allocations, nullptr);
  std::vector<std::uint64_t> sizes(t.allocations, 0);
  std::vector<std::uint16_t> stream_of(t.allocations, 0);  // the allocating trace stream
  std::vector<std::vector<cudaStream_t>> uses(t.allocations);
  std::uint64_t live = 0;
  Run r;
  ReplayPools pools(t, api);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& ev = t.events[i];
    const cudaStream_t s = streams[ev.stream];
    switch (ev.kind) {
      case EventKind::alloc:
        pools.before_alloc(ev.slot);
        if (!api.alloc(ev.size, s, &ptrs[ev.slot])) {
          r.ok = false;
          break;
        }
        pools.after_alloc(ev.slot, ptrs[ev.slot]);
        sizes[ev.slot] = ev.size;
        stream_of[ev.slot] = ev.stream;
        live += ev.size;
        r.peak_live = std::max(r.peak_live, live);
        break;
      case EventKind::free:
        if (ptrs[ev.slot] != nullptr) {
          pools.on_free(ptrs[ev.slot]);
          api.free(ptrs[ev.slot], s, uses[ev.slot]);
        }
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
      case EventKind::empty_cache:
        api.empty_cache();
        break;
      case EventKind::pool_retain:
      case EventKind::pool_release:
      case EventKind::route_begin:
      case EventKind::route_end:
      case EventKind::checkpoint:
        pools.apply(ev);
        break;
      case EventKind::restore: {
        const std::size_t n = pools.restore(i, ptrs);
        for (std::size_t k = 1; k <= n; ++k) {  // the books of its y and o events
          const auto& e = t.events[i + k];
          if (e.kind == EventKind::restore_free) {
            live -= sizes[e.slot];
            uses[e.slot].clear();
          } else {
            sizes[e.slot] = sizes[e.size];
            stream_of[e.slot] = stream_of[e.size];
            live += sizes[e.slot];
          }
        }
        r.peak_live = std::max(r.peak_live, live);
        r.events += n;
        i += n;
        break;
      }
      default:
        break;  // sleeps and wakes: refused at load
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
  for (void* p : pools.orphans) api.free(p, streams[0], {});
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
  void retain_pool(std::uint64_t id) override { reservoir_bench::c10_api::retain_pool(id); }
  void release_pool(std::uint64_t id) override { reservoir_bench::c10_api::release_pool(id); }
  void begin_route(std::uint64_t id, std::function<bool(cudaStream_t)> filter) override {
    reservoir_bench::c10_api::begin_route(id, std::move(filter));
  }
  void end_route(std::uint64_t id) override { reservoir_bench::c10_api::end_route(id); }
  std::shared_ptr<void> checkpoint(std::uint64_t id) override {
    return reservoir_bench::c10_api::checkpoint(id);
  }
  void restore(const std::shared_ptr<void>& state, std::vector<void*>* freed,
               std::vector<void*>* allocated) override {
    reservoir_bench::c10_api::restore(state, freed, allocated);
  }
  void empty_cache() override { reservoir_bench::c10_api::empty_cache(); }
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
  if (t.sleeps + t.wakes > 0 || (o.api != "c10" && t.empty_caches + t.pools > 0)) {
    std::fprintf(
        stderr,
        "reservoir_c10_replay: %s sleeps and wakes tags%s, which this tool does not "
        "replay (reservoir-replay does)\n",
        o.trace.c_str(),
        o.api == "c10"
            ? ""
            : ", or empties the cache or routes to private pools (--api c10 replays those)");
    return 2;
  }
  for (const auto& ev : t.events)
    if (ev.kind == EventKind::pool_retain && ev.size != 0) {
      std::fprintf(stderr,
                   "reservoir_c10_replay: %s makes a pool with options (use_on_oom, no_split), "
                   "which this tool does not replay (reservoir-replay does)\n",
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
