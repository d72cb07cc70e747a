// Replaying a trace through Reservoir's engine on a simulated device.
//
//   Trace t = read_trace(path);
//   ReplayResult r = replay_trace(t, "max_split_size_mb:256", {.capacity = 80ull << 30});
//   FitResult f = fit_memory_fraction(t, "", r);
//
// Every run uses a fresh SimBackend and Allocator, so runs are independent and
// deterministic. Semantics (docs/replay.md):
//   - trace stream k is StreamHandle k + 1 on device 0;
//   - the device keeps up (ReplayOptions::device_keeps_up, the default): the work a
//     trace stands for has completed whenever the allocator asks (events complete as
//     they are recorded), as on a GPU replaying the trace, which launches no kernels
//     — the GPU truth (traces/gpu_truth.json) is measured so. Without it, "s,STREAM"
//     completes that stream's work (SimBackend::advance, then
//     Allocator::notify_host_wait) and a free completes the allocating stream's work;
//     other streams' events (record_stream) wait for their host waits;
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

#include "call_profile.hpp"
#include "replay_pools.hpp"
#include "reservoir/backend.hpp"
#include "reservoir/sim_backend.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {

// Called now and then during a run with (events done, events in the trace).
using ProgressFn = std::function<void(std::size_t done, std::size_t total)>;

struct ReplayOptions {
  std::size_t capacity = kDefaultSimCapacity;  // simulated device memory, bytes
  // Set on the fresh allocator before the first request (as
  // torch.cuda.set_per_process_memory_fraction): reserved memory is capped at
  // fraction * capacity, and the out-of-memory ladder runs at the cap.
  std::optional<double> memory_fraction;
  // Stop at the first OOM (fit search: only success matters there).
  bool stop_at_first_oom = false;
  // Points per series of the timeline (0 = no timeline). Sampling reads the
  // allocator's statistics after every event, so timed figures of such a run are
  // not representative; reservoir-replay plots from a separate run.
  std::size_t timeline_points = 0;
  // A free completes the allocating stream's work (see above). Off: frees rely on
  // "s" lines and the engine's own events only.
  bool free_completes_stream = true;
  // Events complete as they are recorded (SimCompletion::eager): what a GPU replay sees.
  bool device_keeps_up = true;
  // Replay on this device instead of a fresh simulated one (e.g. CudaBackend): each
  // trace stream gets a stream of its own (Backend::create_stream); capacity and the
  // device-time cost model do not apply.
  std::shared_ptr<Backend> backend;
  // Count and time every device call the allocator makes (CallProfile); the replay's
  // host time then includes the profiler's clock reads.
  bool profile_calls = false;
  // Allocations the program did not make, never freed (a KV cache of kv_cache_fit):
  // requested on trace stream 0 just before event extra_at; one that fails is an OOM.
  std::vector<std::uint64_t> extra_sizes;
  std::size_t extra_at = 0;
  ProgressFn progress;
};

// Requested and reserved bytes over the trace, downsampled: point i covers events
// [i * bucket, (i + 1) * bucket) and holds the highest value seen there.
struct Timeline {
  std::size_t bucket = 1;
  std::vector<std::uint64_t> requested;
  std::vector<std::uint64_t> reserved;
};

// The first allocation that failed, in the trace's terms, and the allocator's state
// then (after its out-of-memory ladder released what it could).
struct OomFacts {
  std::uint64_t event = 0;           // index of the alloc (or wake) event in the trace, from 0
  std::uint16_t stream = 0;          // trace stream number
  std::uint64_t requested = 0;       // bytes the trace asked for (a wake: the tag's asleep bytes)
  std::string wake_tag;              // the tag whose wake failed; "" for an allocation
  std::uint64_t device_request = 0;  // bytes the allocator asked of the device
  bool simulated = true;             // the device was the simulated one
  std::uint64_t device_total = 0;    // device memory
  std::uint64_t device_free = 0;     // free on the device at the failure
  std::uint64_t allowed = 0;         // the memory fraction's cap; 0 = no fraction set
  double fraction = 1.0;             // that fraction
  std::uint64_t reserved = 0;        // held by the allocator at the failure
  std::uint64_t allocated = 0;       // of which allocated to live blocks
  bool expandable_segments = false;  // the setting in force
};

// What the cache held, to explain a high reserved/requested ratio (explain_ratio).
// Invariant: at_peak => oversize_segment_bytes and oversize_segment_count describe
// the segments held at the peak of reserved memory.
struct CacheFacts {
  std::uint64_t max_split_size = 0;          // blocks this large are never split; 0 = none
  std::uint64_t max_non_split_rounding = 0;  // an oversize block serves requests this much smaller
  std::uint64_t oversize_segments_peak = 0;  // most segments of >= max_split_size at once
  std::uint64_t oversize_allocations_peak = 0;  // most live allocations of >= max_split_size
  std::uint64_t inactive_split_bytes_peak = 0;  // most free bytes inside split segments
  // Segments of >= max_split_size held at the end of the run: those of the peak
  // when nothing was given back after it (at_peak: reserved at the end == peak).
  bool at_peak = false;
  std::uint64_t oversize_segment_bytes = 0;
  std::uint64_t oversize_segment_count = 0;
};

// The largest KV cache a program leaves room for (kv_cache_fit).
struct KvCacheFit {
  std::uint64_t bytes_per_token = 0;
  std::uint64_t budget = 0;  // the simulated device's memory
  std::uint32_t layers = 1;  // the cache is this many equal allocations
  std::size_t at_event = 0;  // made just before this event
  bool fits = false;         // the program runs on the budget without any cache
  std::uint64_t tokens = 0;  // the most that fit
  int runs = 0;
};

struct ReplayResult {
  std::string config;                 // as given ("" = defaults)
  std::uint64_t events = 0;           // events replayed (all, unless stopped at an OOM)
  std::uint64_t peak_requested = 0;   // requested_bytes.all.peak
  std::uint64_t peak_allocated = 0;   // allocated_bytes.all.peak
  std::uint64_t peak_reserved = 0;    // reserved_bytes.all.peak
  double ratio = 0;                   // peak_reserved / peak_requested (0 if nothing requested)
  std::uint64_t device_allocs = 0;    // num_device_alloc
  std::uint64_t device_frees = 0;     // num_device_free
  double device_time_us = 0;          // SimBackend cost model
  std::uint64_t ooms = 0;             // allocations and wakes that threw OutOfMemoryError
                                      // (and allocations under a tag that could not wake)
  std::uint64_t alloc_retries = 0;    // num_alloc_retries (cache flushed to satisfy a request)
  double ns_per_event = 0;            // host time of the replay loop / events
  std::vector<CallCount> calls;       // with ReplayOptions::profile_calls: device calls made
  std::optional<OomFacts> first_oom;  // the first allocation that threw OutOfMemoryError
  CacheFacts cache;
  Timeline timeline;                     // empty unless ReplayOptions::timeline_points
  std::vector<PoolFigures> pools;        // each trace pool's figures (traces with pools)
  std::vector<CaptureFigures> captures;  // each capture's (g to e), in trace order
  std::optional<KvCacheFit> kv_cache;    // set from kv_cache_fit
  // Set from fit_memory_fraction.
  std::optional<std::uint64_t> fit_capacity;  // fit_fraction * device total, bytes
  double fit_fraction = 0;
  double fit_ratio = 0;  // fit_capacity / peak_requested
};

// Why config cannot replay trace's tags (sleep and wake need pools: docs/sleep.md) or
// its private pools (backend:cudaMallocAsync and the uncached mode keep none), or ""
// when it can or the trace has neither.
std::string trace_refusal(const Trace& trace, const std::string& config);

// Replays trace under config ("key:value,..."). Throws ConfigError for a bad config;
// other engine errors (a bug) propagate as their exceptions.
ReplayResult replay_trace(const Trace& trace, const std::string& config,
                          const ReplayOptions& options = {});

struct FitOptions {
  // The simulated device whose memory fraction is searched (--capacity).
  std::size_t device_total = kDefaultSimCapacity;
  // Stop when hi - lo <= precision * hi, fractions known to fail (lo) and to work (hi).
  double precision = 1e-4;
  int max_steps = 60;
  bool device_keeps_up = true;  // as ReplayOptions::device_keeps_up
  // Called before each run with its number (1, 2, ...).
  std::function<void(int run)> on_step;
  ProgressFn progress;
};

struct FitResult {
  // The search ran on the device's memory, not the memory fraction
  // (backend:cudaMallocAsync); fraction is then capacity's share of device_total.
  bool by_capacity = false;
  std::optional<double> fraction;         // smallest memory fraction found to work
  std::optional<std::uint64_t> capacity;  // the bytes it allows: fraction * device_total
  std::uint64_t device_total = 0;
  int runs = 0;
};

// PyTorch's meaning of "fits": the smallest per-process memory fraction of the
// device under which the whole trace runs with no OOM, the allocator's own
// out-of-memory ladder working at the cap (torch.cuda.set_per_process_memory_fraction).
// Bisection on the fraction, each probe a fresh allocator with the fraction set
// before its first request. Bounds: lo = trace.peak_live_bytes / device_total
// (nothing below can work), hi = min(1, 1.01 * unconstrained.peak_reserved /
// device_total), widened to 1 if it fails; no fraction when even 1 fails.
// unconstrained: a run of the same trace and config with ample memory.
// Under backend:cudaMallocAsync, whose memory fraction caps only allocated bytes, the
// same search runs on the simulated device's capacity (FitResult::by_capacity): the
// smallest device on which the trace runs without OOM.
FitResult fit_memory_fraction(const Trace& trace, const std::string& config,
                              const ReplayResult& unconstrained, const FitOptions& options = {});

// The vLLM question: the largest KV cache of bytes_per_token per token, made of layers
// equal allocations just before the trace's first capture (where an engine allocates
// its cache: after profiling, before capturing its graphs) or at the start of a trace
// that captures nothing, with which the whole trace still runs on a simulated device
// of budget bytes (no OOM, the out-of-memory ladder working). Bisection on the number
// of tokens, each probe a fresh replay.
KvCacheFit kv_cache_fit(const Trace& trace, const std::string& config,
                        std::uint64_t bytes_per_token, std::uint64_t budget, std::uint32_t layers,
                        const ProgressFn& progress = {});

}  // namespace reservoir::replay
