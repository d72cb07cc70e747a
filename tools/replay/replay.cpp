// One replay of a parsed trace on a fresh simulated device, and the fit search.
#include "replay.hpp"

#include <algorithm>
#include <chrono>
#include <memory>

#include "reservoir/allocator.hpp"
#include "reservoir/config.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir::replay {

namespace {

constexpr int kDevice = 0;
// Progress is reported every this many events: rare enough to cost nothing.
constexpr std::size_t kProgressEvery = 8192;

// Trace stream k -> a device stream handle. 0 is avoided: it is the legacy default
// stream on CUDA, which the engine may treat specially.
StreamHandle handle_of(std::uint16_t stream) {
  return static_cast<StreamHandle>(stream) + 1;
}

std::uint64_t as_u64(std::int64_t v) {
  return v < 0 ? 0 : static_cast<std::uint64_t>(v);
}

// Keeps the highest value per bucket of events.
class TimelineSampler {
 public:
  TimelineSampler(std::size_t events, std::size_t points, Timeline* out) : out_(out) {
    if (points == 0 || events == 0) return;
    out_->bucket = (events + points - 1) / points;
    const std::size_t n = (events + out_->bucket - 1) / out_->bucket;
    out_->requested.assign(n, 0);
    out_->reserved.assign(n, 0);
    enabled_ = true;
  }
  bool enabled() const { return enabled_; }
  void sample(std::size_t event, Allocator& alloc) {
    const DeviceStats s = alloc.stats(kDevice);
    const std::size_t i = event / out_->bucket;
    out_->requested[i] = std::max(out_->requested[i], as_u64(s.requested_bytes.all().current));
    out_->reserved[i] = std::max(out_->reserved[i], as_u64(s.reserved_bytes.all().current));
  }

 private:
  Timeline* out_;
  bool enabled_ = false;
};

}  // namespace

ReplayResult replay_trace(const Trace& trace, const std::string& config,
                          const ReplayOptions& options) {
  ReplayResult result;
  result.config = config;
  Config cfg = Config::parse(config);  // ConfigError goes to the caller

  std::shared_ptr<SimBackend> sim;
  std::shared_ptr<Backend> backend = options.backend;
  if (!backend) {
    SimOptions sim_options;
    sim_options.capacity = options.capacity;
    sim_options.eager = false;
    sim = std::make_shared<SimBackend>(sim_options);
    backend = sim;
  }
  // Trace stream k: handle k + 1 on the simulated device, a real stream otherwise.
  std::vector<StreamHandle> streams(trace.streams);
  for (std::uint32_t k = 0; k < trace.streams; ++k) {
    streams[k] = handle_of(static_cast<std::uint16_t>(k));
    if (!sim && backend->create_stream(kDevice, &streams[k]) != DeviceStatus::ok)
      throw DeviceError("reservoir-replay: creating a stream failed: " + backend->last_error());
  }
  struct StreamCleanup {
    Backend& b;
    std::vector<StreamHandle>& s;
    bool real;
    ~StreamCleanup() {
      if (real)
        for (StreamHandle h : s) (void)b.destroy_stream(kDevice, h);
    }
  } cleanup{*backend, streams, !sim};
  Allocator alloc(backend, std::move(cfg));

  // Dense slot -> pointer; nullptr for a slot not allocated yet, freed, of size 0,
  // or whose allocation failed (its later frees and uses are then skipped).
  std::vector<void*> ptrs(trace.allocations, nullptr);
  TimelineSampler sampler(trace.events.size(), options.timeline_points, &result.timeline);
  const std::size_t total = trace.events.size();
  std::size_t done = 0;

  const auto start = std::chrono::steady_clock::now();
  for (; done < total; ++done) {
    const Event& ev = trace.events[done];
    if (options.progress && done % kProgressEvery == 0) options.progress(done, total);
    switch (ev.kind) {
      case EventKind::alloc:
        try {
          ptrs[ev.slot] = alloc.allocate(ev.size, streams[ev.stream], kDevice);
        } catch (const OutOfMemoryError& e) {
          if (result.ooms++ == 0) result.first_oom = e.what();
        }
        break;
      case EventKind::free:
        if (void* p = ptrs[ev.slot]) {
          alloc.deallocate(p);
          ptrs[ev.slot] = nullptr;
          if (options.free_completes_stream && sim) sim->advance(streams[ev.stream]);
        }
        break;
      case EventKind::use:
        if (void* p = ptrs[ev.slot]) alloc.record_stream(p, streams[ev.stream]);
        break;
      case EventKind::host_wait:
        if (sim)
          sim->advance(streams[ev.stream]);
        else
          (void)backend->synchronize_stream(kDevice, streams[ev.stream]);
        alloc.notify_host_wait(streams[ev.stream], kDevice);
        break;
    }
    if (sampler.enabled()) sampler.sample(done, alloc);
    if (result.ooms > 0 && options.stop_at_first_oom) {
      ++done;
      break;
    }
  }
  const auto stop = std::chrono::steady_clock::now();
  if (options.progress) options.progress(total, total);

  result.events = done;
  const double ns = std::chrono::duration<double, std::nano>(stop - start).count();
  result.ns_per_event = done > 0 ? ns / static_cast<double>(done) : 0.0;

  const DeviceStats s = alloc.stats(kDevice);
  result.peak_requested = as_u64(s.requested_bytes.all().peak);
  result.peak_allocated = as_u64(s.allocated_bytes.all().peak);
  result.peak_reserved = as_u64(s.reserved_bytes.all().peak);
  result.ratio = result.peak_requested > 0 ? static_cast<double>(result.peak_reserved) /
                                                 static_cast<double>(result.peak_requested)
                                           : 0.0;
  result.device_allocs = as_u64(s.num_device_alloc);
  result.device_frees = as_u64(s.num_device_free);
  result.alloc_retries = as_u64(s.num_alloc_retries);
  result.device_time_us = sim ? sim->counters().device_time_us : 0.0;

  // Allocations the trace never frees (weights) go back before the allocator is
  // destroyed, so teardown sees a clean engine.
  for (void* p : ptrs)
    if (p != nullptr) alloc.deallocate(p);
  return result;
}

FitResult fit_capacity(const Trace& trace, const std::string& config,
                       const ReplayResult& unconstrained, const FitOptions& options) {
  FitResult fit;
  auto works = [&](std::uint64_t capacity) {
    if (options.on_step) options.on_step(fit.runs + 1);
    ReplayOptions ro;
    ro.capacity = capacity;
    ro.stop_at_first_oom = true;
    ro.progress = options.progress;
    ++fit.runs;
    return replay_trace(trace, config, ro).ooms == 0;
  };

  // Nothing below the peak of live requested bytes can work, whatever the allocator.
  // (The statistics' peak requested can be higher: it also counts freed blocks
  // waiting for other streams, which an allocator under pressure may wait out.)
  const std::uint64_t floor = trace.peak_live_bytes;
  std::uint64_t lo = floor;
  if (lo == 0) {  // nothing is ever live
    fit.capacity = 0;
    return fit;
  }
  std::uint64_t hi = std::max(unconstrained.peak_reserved + unconstrained.peak_reserved / 100,
                              lo + options.tolerance);
  // Known good upper bound: hi normally works at once; if the engine behaves
  // differently under pressure, widen it (a few doublings at most).
  constexpr std::uint64_t kLimit = std::uint64_t{1} << 60;
  while (!works(hi)) {
    if (hi >= kLimit) return fit;  // never fits: leave capacity empty
    lo = hi;
    hi *= 2;
  }
  if (lo == floor && works(lo)) {
    fit.capacity = lo;
    return fit;
  }
  for (int i = 0; i < options.max_steps && hi - lo > options.tolerance; ++i) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (works(mid) ? hi : lo) = mid;
  }
  fit.capacity = hi;
  return fit;
}

}  // namespace reservoir::replay
