// reservoir::Allocator — the C++ front of the caching allocator.
//
//   reservoir::Allocator& a = reservoir::Allocator::instance();  // CUDA, or the sim
//   void* p = a.allocate(64 << 20, stream);   // throws OutOfMemoryError
//   a.deallocate(p);                          // throws InvalidPointerError if foreign
//
// One engine per device, created on first use. Blocks belong to the stream they
// were allocated on and are reused only on that stream (as in PyTorch); use
// record_stream() when a block is used on another stream. All members are
// thread-safe; threads on different streams do not contend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "reservoir/backend.hpp"
#include "reservoir/config.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/export.hpp"
#include "reservoir/history.hpp"
#include "reservoir/hooks.hpp"
#include "reservoir/ipc.hpp"
#include "reservoir/pools.hpp"
#include "reservoir/segment_source.hpp"
#include "reservoir/sleep.hpp"
#include "reservoir/stats.hpp"

namespace reservoir {

namespace detail {
class CachingAllocator;
}

class RESERVOIR_API Allocator {
 public:
  // Uses backend (must outlive nothing: it is shared) and config.
  Allocator(std::shared_ptr<Backend> backend, const Config& config);
  // Picks the backend from config.device ("auto": CUDA when a device is present,
  // else SimBackend) and reads the configuration from the environment.
  Allocator();
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // The process-wide allocator used by the C API and the integrations, created on
  // first use and never destroyed (device work may outlive static destructors).
  static Allocator& instance();
  // A backend chosen as Allocator() chooses it.
  static std::shared_ptr<Backend> make_default_backend(const Config& config);

  // ---- Allocation ----
  // Size 0 returns nullptr. device -1 = the backend's current device.
  // Throws OutOfMemoryError (also for sizes >= 1 EiB, before any device call),
  // InvalidArgumentError for an unknown device, DeviceError for device failures.
  void* allocate(std::size_t size, StreamHandle stream = 0, int device = -1);
  // nullptr is ignored. Throws InvalidPointerError (naming the pointer, changing
  // nothing) for a pointer not handed out, already freed, or inside a block.
  void deallocate(void* ptr);
  // The block at ptr is also used on stream: its memory is not reused until the
  // work submitted to stream by the time of deallocate() completes.
  void record_stream(void* ptr, StreamHandle stream);
  // Tells the allocator (and the trace recorder) that the host waited for stream.
  void notify_host_wait(StreamHandle stream, int device = -1);
  // Call before destroying a stream that memory was allocated or freed on: under
  // policy:compact, Reservoir records on a stream, lazily, the event that later
  // reuse of its memory waits for, and recording on a destroyed stream is undefined
  // in CUDA: this records what it owes there now. With expandable segments, giving
  // free pages back (empty_cache, out of memory) synchronizes the stream that used
  // them, as PyTorch does: from now on it waits for the whole device instead. The
  // stream may be used again afterwards; a stream Reservoir never saw is no error.
  // Its cache is then forgotten once empty. When no block of it is allocated or waiting
  // for another stream, an event is recorded on the stream now, and the cached
  // segments serve the next new stream once it has passed (no cudaFree, which waits
  // for the whole device, and no new cudaMalloc); while more than 8 released caches
  // wait so, the oldest goes back to the device. Else the cache goes back to the device
  // once its blocks are all free and their waits done, noticed by the next new stream,
  // release_stream or empty_cache. So streams may come and go without bound, each at
  // a constant cost and no lasting memory.
  // Throws DeviceError when the event cannot be recorded.
  void release_stream(StreamHandle stream, int device = -1);

  // ---- Cache control ----
  // Returns every unused cached segment to the device (all devices).
  void empty_cache();
  void empty_cache(int device);
  // Caps reserved memory at fraction * device total. fraction in [0, 1].
  void set_memory_fraction(double fraction, int device = -1);
  double memory_fraction(int device = -1);
  // Size of the largest cached (free) block, private pools included.
  std::size_t largest_cached_block(int device = -1);
  // The segment holding ptr (an allocated pointer, or inside one).
  BaseAllocation base_allocation(void* ptr);
  // Size of the block (rounded) for an allocated pointer, and what was asked for.
  std::size_t block_size(void* ptr);
  std::size_t requested_size(void* ptr);

  // Lets device read and write memory allocated on peer (cudaDeviceEnablePeerAccess),
  // including pages of peer's expandable segments mapped now and later, memory of
  // peer's pool (backend:cudaMallocAsync) and shared memory opened on peer.
  void enable_peer_access(int device, int peer);

  // ---- Private pools (reservoir/pools.hpp; docs/pools.md) ----
  // Each throws InvalidArgumentError for an unknown or released pool, a bad id, or
  // in uncached mode (RESERVOIR_NO_CACHING=1), which keeps no pools.
  // A new pool with an id no other call made (use count 1).
  PoolId create_pool(const PoolOptions& options = {}, int device = -1);
  // A new pool whose segments come from source, not from the device (PyTorch's
  // MemPool(allocator=...); reservoir/segment_source.hpp). Its blocks are split and
  // cached as any pool's; its segments are never expandable. Throws
  // InvalidArgumentError for a null source.
  PoolId create_pool(std::shared_ptr<SegmentSource> source, const PoolOptions& options = {},
                     int device = -1);
  // Creates the pool named pool (use count 1), or adds a use of it (PyTorch's
  // createOrIncrefPool; options apply when it is created).
  void retain_pool(PoolId pool, const PoolOptions& options = {}, int device = -1);
  // Drops a use. At 0 the pool is released: its blocks are freed as usual, and its
  // cached memory goes back to the device at the next empty_cache (or out-of-memory
  // release) once the pool holds no allocated block; then the pool is forgotten.
  // empty_cache: when that was the last use, the cached memory goes back now, after
  // the pool's frees that wait for other streams are waited for (torch.cuda.MemPool's
  // destructor); blocks still allocated give theirs back once freed, at the next
  // empty_cache. Not during a capture (nothing may go back then): as without it.
  void release_pool(PoolId pool, int device = -1, bool empty_cache = false);
  int pool_use_count(PoolId pool, int device = -1);
  // Routes every request whose stream filter accepts to the pool (retaining it)
  // until end_allocate_to_pool; a CUDA graph capture is taken to be under way
  // meanwhile (PyTorch's beginAllocateToPool): frees of blocks used on other streams
  // record their events only after it, and no memory goes back to the device.
  void begin_allocate_to_pool(PoolId pool, StreamFilter filter, int device = -1);
  // The same for the requests on one capturing stream.
  void begin_capture_to_pool(PoolId pool, StreamHandle stream, int device = -1);
  // Routes every request that filter accepts to the pool, as begin_allocate_to_pool,
  // taking a capture to be under way only when capture (a replay of a recorded
  // MemPool route, which is not a capture, routes so).
  void begin_route_to_pool(PoolId pool, StreamFilter filter, bool capture, int device = -1);
  // Routes the calling thread's requests to the pool (MemPool's use_mem_pool); not a
  // capture.
  void begin_allocate_current_thread_to_pool(PoolId pool, int device = -1);
  void end_allocate_to_pool(PoolId pool, int device = -1);
  // The pool's segments and blocks now (pending frees are waited for first).
  PoolCheckpoint checkpoint_pool(PoolId pool, int device = -1);
  // Rolls the pool back to checkpoint: frees every allocated block of the pool, then
  // allocates the blocks the checkpoint records as allocated (statistics follow).
  // Throws InvalidArgumentError, changing nothing, when the pool's segments no longer
  // match the checkpoint.
  PoolRestore restore_pool(const PoolCheckpoint& checkpoint);
  // The bytes the pool's segments hold now and those allocated in them (a released
  // pool's too, until its memory is gone and it is forgotten).
  PrivatePoolUsage pool_usage(PoolId pool, int device = -1);
  // Whether the pool's allocated blocks are exactly the pointers in expected.
  bool pool_live_allocations_are(PoolId pool, const std::vector<void*>& expected, int device = -1);
  // ---- Tags: sleep and wake (reservoir/sleep.hpp, docs/sleep.md) ----
  // Opens a tag scope on the calling thread (TagScope does it for a C++ block): its
  // requests to this allocator carry tag until the matching pop_tag, and private pools
  // made meanwhile carry it too. Scopes nest. Throws InvalidArgumentError for a name
  // that cannot be a tag (1-63 letters, digits, '_', '-', '.', ':'), or where the
  // engine in force keeps no pools (backend:cudaMallocAsync, the uncached mode).
  void push_tag(std::string_view tag);
  // Closes the calling thread's innermost scope of this allocator; throws
  // InvalidArgumentError when it has none.
  void pop_tag();
  // The calling thread's tag for this allocator ("" outside every scope).
  std::string current_tag() const;
  // Gives the device memory under tag's blocks back to the device (offload: their
  // contents kept in pinned host memory first), after the work that used it is done;
  // every address stays reserved. Throws InvalidArgumentError (no such tag, asleep
  // already, a capture under way) or DeviceError; nothing sleeps then.
  void sleep(std::string_view tag, SleepMode mode = SleepMode::offload, int device = -1);
  // Maps fresh memory at the tag's addresses and copies offloaded contents back.
  // Throws InvalidArgumentError (not asleep, no such tag, a capture under way),
  // OutOfMemoryError or DeviceError; the tag stays asleep then.
  void wake(std::string_view tag, int device = -1);
  // As wake, but the copies back (offload) are enqueued on stream and not waited for:
  // the tag's memory is usable by work on stream (or work that waits for it) at once;
  // the host copies are freed once the copies are done (tag_state's offloaded_bytes
  // counts them until then). The mapping is done when it returns.
  void wake_async(std::string_view tag, StreamHandle stream, int device = -1);
  // A wake keeps the pinned host buffers of an offload for the tags' next offload
  // (pinning is the slow part of one); this frees them on every device (those a tag
  // asleep still uses stay). DeviceStats::host_kept_bytes counts them.
  void empty_host_cache();
  TagState tag_state(std::string_view tag, int device = -1);
  // Every tag with memory on device (-1: the current one); none where the engine in
  // force keeps no pools. memory_stats, the summary and the metrics list them.
  std::vector<TagState> tag_states(int device = -1);

  // ---- Sharing memory with other processes (include/reservoir/ipc.hpp, docs/ipc.md) ----
  // A handle for the allocated block at ptr, which another process opens: for a
  // cudaMalloc'd segment its IPC handle and the block's offset; for an expandable
  // segment the pages holding the block, exported as file descriptors (and fabric
  // handles where the driver offers them): send it with send_shared. The sender keeps
  // the block allocated while receivers use it; with keep, the allocator enforces
  // that: a free of the block is held back until unshare(ptr). Throws
  // InvalidPointerError, InvalidArgumentError (policy:compact, backend:cudaMallocAsync,
  // uncached mode, or a device that cannot export), DeviceError.
  SharedHandle share(void* ptr, bool keep = false);
  // Ends keep for the block at ptr; frees it now when the program freed it meanwhile.
  void unshare(void* ptr);
  // The block another process shared, mapped in this one on device (-1: the current
  // one). Mappings are cached: opening blocks of the same segment or pages again
  // maps nothing new and returns the same addresses. In the process that shared it,
  // the original pointer. Throws InvalidArgumentError (not a handle, or one of a newer
  // format version), DeviceError.
  void* open(const SharedHandle& handle, int device = -1);
  // Lets go of one open() of the memory at ptr; the mapping goes with the last one.
  // Throws InvalidPointerError when open() returned no such pointer.
  void close(void* ptr);

  // ---- Statistics ----
  DeviceStats stats(int device = -1);
  void reset_peak_stats(int device = -1);
  void reset_accumulated_stats(int device = -1);
  // A readable table of the statistics (like torch.cuda.memory_summary()).
  std::string summary(int device = -1);
  // The same table with options (SummaryOptions{} gives summary(device)'s).
  std::string summary(int device, const SummaryOptions& options);

  // ---- Hooks ----
  void attach_oom_observer(OomObserver observer);
  void add_free_memory_callback(FreeMemoryCallback callback);

  // ---- Configuration ----
  const Config& config() const;
  // Applies "key:value,..." at run time (throws ConfigError, leaving it unchanged).
  // backend, device and sim_capacity are fixed when the allocator is made: a change
  // of them is refused, as are settings that cannot apply together (Config::check).
  void update_config(std::string_view text);
  // As PyTorch's torch.cuda.memory._set_allocator_settings (what reservoir.torch
  // answers it with): max_split_size_mb, roundup_power2_divisions and
  // garbage_collection_threshold go back to their defaults unless text names them;
  // the rest is as update_config.
  void set_allocator_settings(std::string_view text);

  // ---- Trace capture (docs/trace_format.md) ----
  // Starts writing every request to path (replaces a running recording); an empty
  // path throws InvalidArgumentError (stop_trace_recording stops).
  void start_trace_recording(const std::string& path);
  void stop_trace_recording();

  // ---- History, snapshots, metrics (docs/observability.md) ----
  // Keeps the last max_entries trace entries per device (enabled=false clears them).
  // recorder supplies context (e.g. a stack) at the points level asks for.
  void record_history(bool enabled, std::size_t max_entries = 100000,
                      ContextLevel level = ContextLevel::none, ContextRecorder recorder = {});
  // Called with every trace entry, under the allocator's locks: must not call back.
  void attach_trace_tracker(TraceTracker tracker);
  // A timestamped user annotation (kept while history is on).
  void record_annotation(std::string name, std::string value, int device = -1);
  std::vector<TraceEntry> history(int device = -1);
  // Every segment and block of every device, the history and the settings.
  Snapshot snapshot();
  // The segments of one device (-1: the current one), in address order, with their
  // blocks: snapshot()'s, without the history (what a communication library
  // registers, e.g. NCCL at a communicator's creation).
  std::vector<SegmentInfo> segments(int device = -1);
  // Writes snapshot() as a pickle in PyTorch's format (torch.cuda.memory._snapshot()),
  // which PyTorch's memory viewer opens. Throws std::runtime_error on I/O errors.
  void dump_snapshot(const std::string& path);
  // The statistics as Prometheus text exposition, and as JSON.
  std::string metrics_prometheus();
  std::string metrics_json();

  // ---- Introspection ----
  Backend& backend();
  int device_count();
  // Devices this allocator has served (their engines exist).
  std::vector<int> devices_in_use();
  // False in uncached mode (RESERVOIR_NO_CACHING=1): every call goes to the device.
  bool caching() const;
  // The engine serving requests: "native", "cudaMallocAsync" (backend:cudaMallocAsync)
  // or "uncached".
  const std::string& engine_name() const;
  // Walks every segment, block, pool and statistic; throws InvariantError. Safe while
  // other threads use the allocator: each device is checked at one consistent moment
  // (with its pools locked, so their requests wait for the walk), so no operation in
  // flight elsewhere makes a false report.
  void validate();

 private:
  // update_config (torch_settings false) and set_allocator_settings (true).
  void update_config_as(std::string_view text, bool torch_settings);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  // impl_'s caching engine, for the request path: one dependent load fewer per request.
  detail::CachingAllocator* core_ = nullptr;
};

// A tag for the requests of the calling thread while it lives (Allocator::push_tag).
//   { reservoir::TagScope weights(a, "weights"); model = load(); }
class RESERVOIR_API TagScope {
 public:
  TagScope(Allocator& allocator, std::string_view tag) : allocator_(allocator) {
    allocator_.push_tag(tag);
  }
  ~TagScope() {
    try {
      allocator_.pop_tag();
    } catch (...) {  // unreachable: the scope's push is the innermost
    }
  }
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;

 private:
  Allocator& allocator_;
};

}  // namespace reservoir
