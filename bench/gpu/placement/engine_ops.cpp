#include "engine_ops.hpp"

#include <algorithm>
#include <stdexcept>

#include "reservoir/allocator.hpp"
#include "reservoir/config.hpp"
#include "reservoir/errors.hpp"

namespace reservoir_bench::placement {

namespace {

using reservoir::replay::EventKind;
constexpr int kDevice = 0;

std::uint64_t as_u64(std::int64_t v) {
  return v < 0 ? 0 : static_cast<std::uint64_t>(v);
}

// Owns the streams made on a real device for the replay.
struct Streams {
  Backend& backend;
  std::vector<reservoir::StreamHandle> handles;
  bool owned = false;
  ~Streams() {
    if (owned)
      for (reservoir::StreamHandle h : handles) (void)backend.destroy_stream(kDevice, h);
  }
};

}  // namespace

EngineRun replay_logged(const reservoir::replay::Trace& trace, const std::string& config,
                        std::shared_ptr<Backend> device, reservoir::SimBackend* sim) {
  if (trace.sleeps + trace.wakes > 0 || trace.pools > 0)
    throw std::invalid_argument(trace.path +
                                ": sleeps and wakes tags or routes to private pools; the "
                                "placement tools replay "
                                "allocations, frees, uses and host waits (reservoir-replay "
                                "replays them)");
  reservoir::Config cfg = reservoir::Config::parse(config);
  auto logging = std::make_shared<LoggingBackend>(device);
  Streams streams{*device, std::vector<reservoir::StreamHandle>(trace.streams), sim == nullptr};
  for (std::uint32_t k = 0; k < trace.streams; ++k) {
    // As tools/replay: trace stream k is handle k + 1 on the simulated device.
    streams.handles[k] = k + 1;
    if (!sim && device->create_stream(kDevice, &streams.handles[k]) != DeviceStatus::ok)
      throw reservoir::DeviceError("creating a stream failed: " + device->last_error());
  }
  EngineRun run;
  {
    reservoir::Allocator alloc(logging, std::move(cfg));
    std::vector<void*> ptrs(trace.allocations, nullptr);
    for (const reservoir::replay::Event& ev : trace.events) {
      const reservoir::StreamHandle stream = streams.handles[ev.stream];
      switch (ev.kind) {
        case EventKind::alloc:
          try {
            ptrs[ev.slot] = alloc.allocate(ev.size, stream, kDevice);
          } catch (const reservoir::OutOfMemoryError&) {
            ++run.ooms;
          }
          break;
        case EventKind::free:
          if (void* p = ptrs[ev.slot]) {
            alloc.deallocate(p);
            ptrs[ev.slot] = nullptr;
            if (sim) sim->advance(stream);
          }
          break;
        case EventKind::use:
          if (void* p = ptrs[ev.slot]) alloc.record_stream(p, stream);
          break;
        case EventKind::host_wait:
          if (sim)
            sim->advance(stream);
          else
            (void)device->synchronize_stream(kDevice, stream);
          alloc.notify_host_wait(stream, kDevice);
          break;
        case EventKind::empty_cache:
          alloc.empty_cache(kDevice);
          break;
        default:
          break;  // sleeps, wakes and pools: refused above
      }
      ++run.events;
    }
    const reservoir::DeviceStats s = alloc.stats(kDevice);
    run.peak_requested = as_u64(s.requested_bytes.all().peak);
    run.peak_reserved = as_u64(s.reserved_bytes.all().peak);
    run.device_allocs = as_u64(s.num_device_alloc);
    run.device_frees = as_u64(s.num_device_free);
    for (void* p : ptrs)
      if (p != nullptr) alloc.deallocate(p);
  }  // the allocator's teardown gives its segments back: logged too
  run.calls = logging->calls();
  return run;
}

EngineRun replay_logged_sim(const reservoir::replay::Trace& trace, const std::string& config,
                            std::uint64_t capacity) {
  reservoir::SimOptions o;
  o.capacity = capacity;
  o.completion = reservoir::SimCompletion::manual;  // the replay advances the streams
  auto sim = std::make_shared<reservoir::SimBackend>(o);
  return replay_logged(trace, config, sim, sim.get());
}

std::uint64_t fit_capacity_sim(const reservoir::replay::Trace& trace, const std::string& config,
                               std::uint64_t unconstrained_peak_reserved, std::uint64_t tolerance) {
  auto works = [&](std::uint64_t capacity) {
    return replay_logged_sim(trace, config, capacity).ooms == 0;
  };
  std::uint64_t lo = trace.peak_live_bytes;
  if (lo == 0) return 0;
  std::uint64_t hi =
      std::max(unconstrained_peak_reserved + unconstrained_peak_reserved / 100, lo + tolerance);
  while (!works(hi)) {
    if (hi >= (std::uint64_t{1} << 50)) return 0;  // never fits
    lo = hi;
    hi *= 2;
  }
  if (works(lo)) return lo;
  while (hi - lo > tolerance) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (works(mid) ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace reservoir_bench::placement
