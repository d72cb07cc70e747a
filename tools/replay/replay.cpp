// One replay of a parsed trace on a fresh simulated device, and the fit search
// on the memory fraction.
#include "replay.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>

#include "replay_pools.hpp"
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

// The facts of the first OOM. The engine's own message speaks of device stream
// handles and of the environment; the report speaks of the trace (report.hpp).
struct OomRecorder {
  bool seen = false;
  std::size_t device_request = 0, allowed = 0, device_free = 0;
  void attach(Allocator& alloc) {
    alloc.attach_oom_observer([this](int, std::size_t size, std::size_t cap, std::size_t free) {
      seen = true;
      device_request = size;
      allowed = cap;
      device_free = free;
    });
  }
  OomFacts facts(Allocator& alloc, bool simulated, std::size_t event, const Event& ev) const {
    OomFacts f;
    f.event = event;
    f.stream = ev.stream;
    f.requested = ev.size;
    f.simulated = simulated;
    f.device_request = device_request;
    f.device_free = device_free;
    MemoryInfo info;
    if (alloc.backend().memory_info(kDevice, &info) == DeviceStatus::ok)
      f.device_total = info.total;
    f.fraction = alloc.memory_fraction(kDevice);
    if (f.fraction < 1.0) f.allowed = allowed;
    const DeviceStats s = alloc.stats(kDevice);
    f.reserved = as_u64(s.reserved_bytes.all().current);
    f.allocated = as_u64(s.allocated_bytes.all().current);
    f.expandable_segments = alloc.config().expandable_segments;
    return f;
  }
};

// The replay's thread tag: each allocation's, switched only when it differs from the
// last one's (one scope open at a time). Tags whose wake failed stay asleep: the
// allocations under them are refused, and their sleeps have nothing to do.
class TraceTags {
 public:
  TraceTags(Allocator& alloc, const Trace& trace)
      : alloc_(alloc), trace_(trace), left_asleep_(trace.tag_names.size(), false) {
    // Every tag made, so that a sleep of one whose blocks predate the trace finds it.
    for (const std::string& name : trace.tag_names) {
      if (name.empty()) continue;
      alloc_.push_tag(name);
      alloc_.pop_tag();
    }
  }
  ~TraceTags() {
    if (open_ != 0) alloc_.pop_tag();
  }
  TraceTags(const TraceTags&) = delete;
  TraceTags& operator=(const TraceTags&) = delete;

  // Opens the tag of allocation slot; false when that tag could not wake.
  bool open_for(std::uint32_t slot) {
    if (trace_.alloc_tags.empty()) return true;
    const std::uint16_t tag = trace_.alloc_tags[slot];
    if (tag != open_) {
      if (open_ != 0) alloc_.pop_tag();
      open_ = 0;
      if (tag != 0) alloc_.push_tag(trace_.tag_names[tag]);
      open_ = tag;
    }
    return tag == 0 || !left_asleep_[tag];
  }
  void sleep(const Event& ev) {
    if (left_asleep_[ev.slot]) return;
    alloc_.sleep(trace_.tag_names[ev.slot],
                 ev.size == kSleepDiscard ? SleepMode::discard : SleepMode::offload, kDevice);
  }
  // Wakes the tag of ev (its copies on stream when the trace says so); false when out
  // of memory, the tag then left asleep until a later wake succeeds.
  bool wake(const Event& ev, StreamHandle stream) {
    if (ev.size == kWakeNotAsleep) return true;  // it slept before the trace began
    const std::string& name = trace_.tag_names[ev.slot];
    try {
      if (ev.size == kWakeOnStream)
        alloc_.wake_async(name, stream, kDevice);
      else
        alloc_.wake(name, kDevice);
    } catch (const OutOfMemoryError&) {
      left_asleep_[ev.slot] = true;
      return false;
    }
    left_asleep_[ev.slot] = false;
    return true;
  }
  std::uint64_t asleep_bytes(const Event& ev) {
    return alloc_.tag_state(trace_.tag_names[ev.slot], kDevice).asleep_bytes;
  }

 private:
  Allocator& alloc_;
  const Trace& trace_;
  std::vector<bool> left_asleep_;  // by tag number
  std::uint16_t open_ = 0;
};

// Statistics behind explain_ratio, read at the end of a run (before the blocks the
// trace never freed are returned).
CacheFacts cache_facts(Allocator& alloc, const DeviceStats& s) {
  CacheFacts c;
  const std::size_t mss = alloc.config().max_split_size;
  c.max_split_size = mss == std::numeric_limits<std::size_t>::max() ? 0 : mss;
  c.max_non_split_rounding = alloc.config().max_non_split_rounding_size;
  c.oversize_segments_peak = as_u64(s.oversize_segments.peak);
  c.oversize_allocations_peak = as_u64(s.oversize_allocations.peak);
  c.inactive_split_bytes_peak = as_u64(s.inactive_split_bytes.all().peak);
  c.at_peak = s.reserved_bytes.all().current == s.reserved_bytes.all().peak;
  if (c.max_split_size > 0 && c.oversize_segments_peak > 0) {
    for (const SegmentInfo& seg : alloc.snapshot().segments) {
      if (seg.total_size < c.max_split_size) continue;
      c.oversize_segment_bytes += seg.total_size;
      ++c.oversize_segment_count;
    }
  }
  return c;
}

}  // namespace

std::string trace_refusal(const Trace& trace, const std::string& config) {
  const auto named = std::find_if(trace.tag_names.begin(), trace.tag_names.end(),
                                  [](const std::string& n) { return !n.empty(); });
  if (named == trace.tag_names.end() && trace.pools == 0) return "";
  Allocator probe(std::make_shared<SimBackend>(), Config::parse(config));
  if (named != trace.tag_names.end()) {
    try {
      probe.push_tag(*named);
    } catch (const InvalidArgumentError& e) {
      return "--config '" + config + "': the trace tags its memory (" +
             std::to_string(trace.sleeps) + " sleeps), which this setting cannot: " + e.what();
    }
    probe.pop_tag();
  }
  if (trace.pools > 0) {
    try {
      probe.release_pool(probe.create_pool());
    } catch (const InvalidArgumentError& e) {
      return "--config '" + config + "': the trace routes requests to private pools (" +
             std::to_string(trace.pools) + " pools, " + std::to_string(trace.captures) +
             " captures), which this setting keeps none of: " + e.what();
    }
  }
  return "";
}

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
    // Host waits advance the trace's stream here (advance stops at device-side waits).
    sim_options.completion = options.device_keeps_up ? SimCompletion::eager : SimCompletion::manual;
    sim = std::make_shared<SimBackend>(sim_options);
    backend = sim;
  }
  // Trace stream k: handle k + 1 on the simulated device, a real stream otherwise
  // (created only for the numbers the trace uses).
  std::vector<StreamHandle> streams(
      trace.stream_ids.empty() ? 0 : std::size_t{trace.stream_ids.back()} + 1);
  for (std::size_t k = 0; k < streams.size(); ++k)
    streams[k] = handle_of(static_cast<std::uint16_t>(k));
  std::vector<StreamHandle> created;
  struct StreamCleanup {
    Backend& b;
    std::vector<StreamHandle>& s;
    ~StreamCleanup() {
      for (StreamHandle h : s) (void)b.destroy_stream(kDevice, h);
    }
  } cleanup{*backend, created};
  if (!sim) {
    for (const std::uint16_t k : trace.stream_ids) {
      if (backend->create_stream(kDevice, &streams[k]) != DeviceStatus::ok)
        throw DeviceError("reservoir-replay: creating a stream failed: " + backend->last_error());
      created.push_back(streams[k]);
    }
  }
  OomRecorder oom;  // before the allocator: it must outlive the observer
  std::shared_ptr<CallProfile> profile;
  if (options.profile_calls) profile = std::make_shared<CallProfile>(backend);
  Allocator alloc(profile ? std::shared_ptr<Backend>(profile) : backend, std::move(cfg));
  if (options.memory_fraction) alloc.set_memory_fraction(*options.memory_fraction, kDevice);
  oom.attach(alloc);

  // Dense slot -> pointer; nullptr for a slot not allocated yet, freed, of size 0,
  // or whose allocation failed (its later frees and uses are then skipped).
  std::vector<void*> ptrs(trace.allocations, nullptr);
  TraceTags tags(alloc, trace);
  TracePools pools(alloc, trace, kDevice);
  TimelineSampler sampler(trace.events.size(), options.timeline_points, &result.timeline);
  const std::size_t total = trace.events.size();
  std::size_t done = 0;

  std::vector<void*> extra;  // ReplayOptions::extra_sizes, once made
  auto make_extra = [&] {
    const StreamHandle stream = streams.empty() ? handle_of(0) : streams[trace.stream_ids.front()];
    for (const std::uint64_t size : options.extra_sizes) {
      try {
        extra.push_back(alloc.allocate(size, stream, kDevice));
      } catch (const OutOfMemoryError&) {
        ++result.ooms;
        return;
      }
    }
  };
  const auto start = std::chrono::steady_clock::now();
  for (; done < total; ++done) {
    const Event& ev = trace.events[done];
    if (done == options.extra_at && !options.extra_sizes.empty()) {
      make_extra();
      if (result.ooms > 0 && options.stop_at_first_oom) break;
    }
    if (options.progress && done % kProgressEvery == 0) options.progress(done, total);
    switch (ev.kind) {
      case EventKind::alloc:
        if (!tags.open_for(ev.slot)) {
          ++result.ooms;  // its tag could not wake: the first OOM was that wake's
          break;
        }
        pools.before_alloc(ev.slot);
        try {
          ptrs[ev.slot] = alloc.allocate(ev.size, streams[ev.stream], kDevice);
        } catch (const OutOfMemoryError&) {
          if (result.ooms++ == 0) result.first_oom = oom.facts(alloc, sim != nullptr, done, ev);
        }
        pools.after_alloc(ev.slot, ev.size, ptrs[ev.slot]);
        break;
      case EventKind::pool_retain:
      case EventKind::pool_release:
      case EventKind::route_begin:
      case EventKind::route_end:
      case EventKind::checkpoint:
        pools.apply(ev);
        break;
      case EventKind::restore:
        done += pools.restore(done, ptrs);  // and its y and o events
        break;
      case EventKind::restore_free:
      case EventKind::restore_alloc:
        break;  // taken by their restore
      case EventKind::sleep:
        tags.sleep(ev);
        break;
      case EventKind::empty_cache:
        alloc.empty_cache(kDevice);
        break;
      case EventKind::wake:
        if (!tags.wake(ev, streams[ev.stream]) && result.ooms++ == 0) {
          result.first_oom = oom.facts(alloc, sim != nullptr, done, ev);
          result.first_oom->requested = tags.asleep_bytes(ev);
          result.first_oom->wake_tag = trace.tag_names[ev.slot];
        }
        break;
      case EventKind::free:
        if (void* p = ptrs[ev.slot]) {
          pools.on_free(ev.slot, p);
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
  if (profile) result.calls = profile->counts();  // the replay's calls, not teardown's
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
  if (!options.stop_at_first_oom) result.cache = cache_facts(alloc, s);
  if (pools.any()) {
    result.pools = pools.finish();
    result.captures = pools.captures();
  }

  // Allocations the trace never frees (weights) go back before the allocator is
  // destroyed, so teardown sees a clean engine.
  for (void* p : ptrs)
    if (p != nullptr) alloc.deallocate(p);
  for (void* p : pools.orphans()) alloc.deallocate(p);
  for (void* p : extra) alloc.deallocate(p);
  return result;
}

FitResult fit_memory_fraction(const Trace& trace, const std::string& config,
                              const ReplayResult& unconstrained, const FitOptions& options) {
  FitResult fit;
  fit.device_total = options.device_total;
  const auto total = static_cast<double>(options.device_total);
  // Under backend:cudaMallocAsync the fraction caps allocated bytes only (as in
  // PyTorch), never what the driver's pool reserves, so a fraction would fit at the
  // peak request while a device that small runs out: the search is on the device's
  // memory instead, the same bisection over the same share of it.
  fit.by_capacity = Config::parse(config).backend == "cudaMallocAsync";
  auto works = [&](double fraction) {
    if (options.on_step) options.on_step(fit.runs + 1);
    ReplayOptions ro;
    ro.device_keeps_up = options.device_keeps_up;
    ro.capacity = options.device_total;
    if (fit.by_capacity)
      ro.capacity = static_cast<std::size_t>(fraction * total);
    else
      ro.memory_fraction = fraction;
    ro.stop_at_first_oom = true;
    ro.progress = options.progress;
    ++fit.runs;
    return replay_trace(trace, config, ro).ooms == 0;
  };
  auto found = [&](double fraction) {
    fit.fraction = fraction;
    // What the engine allows under that fraction (DeviceEngine::set_memory_fraction),
    // or the device's memory (by_capacity): the same product.
    fit.capacity = static_cast<std::uint64_t>(fraction * total);
    return fit;
  };

  // Nothing below the peak of live requested bytes can work, whatever the allocator.
  // (The statistics' peak requested can be higher: it also counts freed blocks
  // waiting for other streams, which an allocator under pressure may wait out.)
  if (trace.peak_live_bytes == 0) return found(0.0);  // nothing is ever live
  if (trace.peak_live_bytes > options.device_total) return fit;
  const double floor = static_cast<double>(trace.peak_live_bytes) / total;
  double lo = floor;
  double hi = std::min(1.0, 1.01 * static_cast<double>(unconstrained.peak_reserved) / total);
  hi = std::max(hi, lo);
  // hi normally works at once; if the engine behaves differently under pressure,
  // the whole device is the last bound to try.
  if (!works(hi)) {
    if (hi >= 1.0 || !works(1.0)) return fit;  // does not fit on this device
    lo = hi;
    hi = 1.0;
  }
  if (lo == floor && works(lo)) return found(lo);
  for (int i = 0; i < options.max_steps && hi - lo > options.precision * hi; ++i) {
    const double mid = lo + (hi - lo) / 2;
    (works(mid) ? hi : lo) = mid;
  }
  return found(hi);
}

}  // namespace reservoir::replay

namespace reservoir::replay {

KvCacheFit kv_cache_fit(const Trace& trace, const std::string& config,
                        std::uint64_t bytes_per_token, std::uint64_t budget, std::uint32_t layers,
                        const ProgressFn& progress) {
  KvCacheFit fit;
  fit.bytes_per_token = bytes_per_token;
  fit.budget = budget;
  fit.layers = std::max<std::uint32_t>(layers, 1);
  const auto capture = std::find_if(trace.events.begin(), trace.events.end(), [](const Event& e) {
    return e.kind == EventKind::route_begin && e.size != kRouteThread;
  });
  fit.at_event =
      capture == trace.events.end() ? 0 : static_cast<std::size_t>(capture - trace.events.begin());
  auto runs_with = [&](std::uint64_t tokens) {
    ReplayOptions ro;
    ro.capacity = budget;
    ro.stop_at_first_oom = true;
    ro.progress = progress;
    ro.extra_at = fit.at_event;
    if (tokens > 0) {
      // Each layer's share rounded up: the cache holds at least tokens tokens.
      const std::uint64_t bytes = tokens * bytes_per_token;
      ro.extra_sizes.assign(fit.layers, (bytes + fit.layers - 1) / fit.layers);
    }
    ++fit.runs;
    return replay_trace(trace, config, ro).ooms == 0;
  };
  if (bytes_per_token == 0 || !runs_with(0)) return fit;
  fit.fits = true;
  std::uint64_t lo = 0, hi = budget / bytes_per_token + 1;  // lo runs, hi does not
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (runs_with(mid) ? lo : hi) = mid;
  }
  fit.tokens = lo;
  return fit;
}

}  // namespace reservoir::replay
