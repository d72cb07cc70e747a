// Replaying a trace through Reservoir's engine on a simulated device.
//
//   Trace t = read_trace(path);
//   ReplayResult r = replay_trace(t, "max_split_size_mb:256", {.capacity = 80ull << 30});
//   FitResult f = fit_capacity(t, "", r);
//
// Every run uses a fresh SimBackend and Allocator, so runs are independent and
// deterministic. Semantics (docs/replay.md):
//   - trace stream k is StreamHandle k + 1 on device 0;
//   - stream work is not eager: "s,STREAM" completes that stream's work
//     (SimBackend::advance, then Allocator::notify_host_wait);
//   - a free also completes the allocating stream's work, as the shared traces
//     assume (they carry no record_stream events; PyTorch's figures were measured so);
//   - an allocation that throws OutOfMemoryError counts as an OOM; the replay skips
//     that allocation's later frees and uses and goes on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "reservoir/backend.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {

inline constexpr std::size_t kGiB = std::size_t{1} << 30;
// An H200's memory: the default simulated device.
inline constexpr std::size_t kDefaultCapacity = std::size_t{141} * kGiB;

// Called now and then during a run with (events done, events in the trace).
using ProgressFn = std::function<void(std::size_t done, std::size_t total)>;

struct ReplayOptions {
  std::size_t capacity = kDefaultCapacity;  // simulated device memory, bytes
  // Stop at the first OOM (fit search: only success matters there).
  bool stop_at_first_oom = false;
  // Points per series of the timeline (0 = no timeline). Sampling reads the
  // allocator's statistics after every event, so timed figures of such a run are
  // not representative; reservoir-replay plots from a separate run.
  std::size_t timeline_points = 0;
  // A free completes the allocating stream's work (see above). Off: frees rely on
  // "s" lines and the engine's own events only.
  bool free_completes_stream = true;
  // Replay on this device instead of a fresh simulated one (e.g. CudaBackend): each
  // trace stream gets a stream of its own (Backend::create_stream); capacity and the
  // device-time cost model do not apply.
  std::shared_ptr<Backend> backend;
  ProgressFn progress;
};

// Requested and reserved bytes over the trace, downsampled: point i covers events
// [i * bucket, (i + 1) * bucket) and holds the highest value seen there.
struct Timeline {
  std::size_t bucket = 1;
  std::vector<std::uint64_t> requested;
  std::vector<std::uint64_t> reserved;
};

struct ReplayResult {
  std::string config;                // as given ("" = defaults)
  std::uint64_t events = 0;          // events replayed (all, unless stopped at an OOM)
  std::uint64_t peak_requested = 0;  // requested_bytes.all.peak
  std::uint64_t peak_allocated = 0;  // allocated_bytes.all.peak
  std::uint64_t peak_reserved = 0;   // reserved_bytes.all.peak
  double ratio = 0;                  // peak_reserved / peak_requested (0 if nothing requested)
  std::uint64_t device_allocs = 0;   // num_device_alloc
  std::uint64_t device_frees = 0;    // num_device_free
  double device_time_us = 0;         // SimBackend cost model
  std::uint64_t ooms = 0;            // allocations that threw OutOfMemoryError
  std::uint64_t alloc_retries = 0;   // num_alloc_retries (cache flushed to satisfy a request)
  double ns_per_event = 0;           // host time of the replay loop / events
  std::string first_oom;             // message of the first OutOfMemoryError
  Timeline timeline;                 // empty unless ReplayOptions::timeline_points
  // Set by fit_capacity.
  std::optional<std::uint64_t> fit_capacity;
  double fit_ratio = 0;  // fit_capacity / peak_requested
};

// Replays trace under config ("key:value,..."). Throws ConfigError for a bad config;
// other engine errors (a bug) propagate as their exceptions.
ReplayResult replay_trace(const Trace& trace, const std::string& config,
                          const ReplayOptions& options = {});

struct FitOptions {
  std::size_t tolerance = std::size_t{2} << 20;  // stop when hi - lo <= this
  int max_steps = 30;
  // Called before each run with its number (1, 2, ...).
  std::function<void(int run)> on_step;
  ProgressFn progress;
};

struct FitResult {
  std::optional<std::uint64_t> capacity;  // smallest capacity that ran with no OOM
  int runs = 0;
};

// Bisection on the simulated capacity for the smallest one under which the whole
// trace runs with no OOM. Bounds: lo = trace.peak_live_bytes (nothing below can
// work; equal to the peak requested unless freed blocks wait on other streams),
// hi = unconstrained.peak_reserved + 1% (doubled until it works). unconstrained is
// a run of the same trace and config with ample capacity.
FitResult fit_capacity(const Trace& trace, const std::string& config,
                       const ReplayResult& unconstrained, const FitOptions& options = {});

}  // namespace reservoir::replay
