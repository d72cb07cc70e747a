// reservoir::Allocator: routes requests to the engine of their device, turns the
// engine's results into the C++ API's errors, and hosts the uncached mode and the
// trace recorder.
#include "reservoir/allocator.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "engine/block.hpp"
#include "engine/device_engine.hpp"
#include "engine/segment_map.hpp"
#include "engine/stream_pool.hpp"
#include "front/trace_recorder.hpp"
#include "reservoir/sim_backend.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"
#if RESERVOIR_HAVE_CUDA
#include "reservoir/cuda_backend.hpp"
#endif

namespace reservoir {

using detail::DeviceEngine;
using detail::format_pointer;
using detail::format_size;

namespace {
constexpr std::size_t kOneEiB = std::size_t{1} << 60;

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}
}  // namespace

struct Allocator::Impl {
  std::shared_ptr<Backend> backend;
  Config config;
  std::mutex config_mutex;
  detail::SegmentMap segments;
  detail::EngineHooks hooks;
  int device_count = 0;
  std::unique_ptr<std::atomic<DeviceEngine*>[]> engines;
  std::vector<std::unique_ptr<DeviceEngine>> owned_engines;
  std::mutex engines_mutex;
  bool caching = true;

  // Uncached mode: every request goes to the device; the map validates frees.
  struct Uncached {
    std::size_t size;
    int device;
  };
  std::mutex uncached_mutex;
  std::unordered_map<std::uintptr_t, Uncached> uncached;
  std::unordered_map<int, DeviceStats> uncached_stats;

  // Trace capture: while a recorder is installed, requests and their records are
  // serialized so that a reused address cannot be recorded out of order.
  std::mutex recorder_mutex;
  std::atomic<bool> recording{false};
  std::unique_ptr<detail::TraceRecorder> recorder;

  // History settings, applied to engines made later too.
  std::mutex history_mutex;
  bool history_enabled = false;
  std::size_t history_entries = 1;
  ContextLevel history_level = ContextLevel::none;
  ContextRecorder history_recorder;
  std::vector<TraceTracker> trackers;
  std::deque<Annotation> annotations;  // oldest first, at most history_entries

  int resolve(int device) {
    if (device < -1)
      throw InvalidArgumentError("reservoir: device " + std::to_string(device) +
                                 " does not exist (use -1 for the current device)");
    if (device == -1) {
      int current = 0;
      if (backend->current_device(&current) != DeviceStatus::ok)
        throw DeviceError("reservoir: reading the current device failed: " + backend->last_error());
      device = current;
    }
    if (device >= device_count)
      throw InvalidArgumentError("reservoir: device " + std::to_string(device) +
                                 " does not exist (" + backend->name() + " backend has " +
                                 std::to_string(device_count) + " device(s))");
    return device;
  }

  DeviceEngine& engine(int device) {
    DeviceEngine* e = engines[device].load(std::memory_order_acquire);
    if (e) return *e;
    std::lock_guard<std::mutex> guard(engines_mutex);
    e = engines[device].load(std::memory_order_relaxed);
    if (e) return *e;
    Config snapshot;
    {
      std::lock_guard<std::mutex> cg(config_mutex);
      snapshot = config;
    }
    owned_engines.push_back(
        std::make_unique<DeviceEngine>(*backend, device, snapshot, segments, hooks));
    e = owned_engines.back().get();
    {
      std::lock_guard<std::mutex> hg(history_mutex);
      e->history().configure(history_enabled, history_entries, history_level, history_recorder);
      for (auto& t : trackers) e->history().add_tracker(t);
    }
    engines[device].store(e, std::memory_order_release);
    return *e;
  }

  // Runs op on the pool that owns ptr's segment; op returns false when ptr is not an
  // allocated block there. The lock-free lookup can return a segment that another
  // thread released (and reused) meanwhile, so a refusal is checked against a fresh
  // lookup: only when that names the same pool is the pointer really invalid.
  template <typename Op>
  void with_owner(void* ptr, const char* action, Op&& op) {
    auto address = reinterpret_cast<std::uintptr_t>(ptr);
    detail::StreamPool* pool = &owner_of(ptr, action);
    for (int attempt = 0;; ++attempt) {
      if (op(*pool)) return;
      detail::StreamPool* again = &owner_of(ptr, action);
      if (again == pool || attempt == 3)
        throw InvalidPointerError(std::string("reservoir: cannot ") + action + " " +
                                  format_pointer(ptr) + ": " +
                                  again->explain_not_allocated(address));
      pool = again;
    }
  }

  detail::StreamPool& owner_of(void* ptr, const char* action) {
    auto address = reinterpret_cast<std::uintptr_t>(ptr);
    detail::Segment* seg = segments.find(address);
    if (!seg)
      throw InvalidPointerError(std::string("reservoir: cannot ") + action + " " +
                                format_pointer(ptr) +
                                ": no Reservoir segment contains it (it was not allocated by "
                                "this allocator, or its memory was already returned)");
    detail::StreamPool* pool = seg->owner_now();
    if (!pool)  // released and being reused right now
      throw InvalidPointerError(std::string("reservoir: cannot ") + action + " " +
                                format_pointer(ptr) + ": its segment was just released");
    return *pool;
  }

  void start_recording(const std::string& path) {
    auto next = std::make_unique<detail::TraceRecorder>(path);
    std::lock_guard<std::mutex> guard(recorder_mutex);
    recorder = std::move(next);
    recording.store(true);
  }
  void stop_recording() {
    std::lock_guard<std::mutex> guard(recorder_mutex);
    recording.store(false);
    recorder.reset();
  }
};

Allocator::Allocator(std::shared_ptr<Backend> backend, Config config)
    : impl_(std::make_unique<Impl>()) {
  if (!backend) throw InvalidArgumentError("reservoir: Allocator needs a backend");
  impl_->backend = std::move(backend);
  impl_->config = std::move(config);
  impl_->caching = !env_flag("RESERVOIR_NO_CACHING");
  int count = 0;
  if (impl_->backend->device_count(&count) != DeviceStatus::ok)
    throw DeviceError("reservoir: counting devices failed: " + impl_->backend->last_error());
  impl_->device_count = count;
  impl_->engines = std::make_unique<std::atomic<DeviceEngine*>[]>(count > 0 ? count : 1);
  for (int i = 0; i < (count > 0 ? count : 1); ++i) impl_->engines[i].store(nullptr);
  if (!impl_->config.record_trace.empty()) impl_->start_recording(impl_->config.record_trace);
}

Allocator::Allocator()
    : Allocator(make_default_backend(Config::from_environment()), Config::from_environment()) {}

Allocator::~Allocator() {
  if (impl_) impl_->stop_recording();
}

std::shared_ptr<Backend> Allocator::make_default_backend(const Config& config) {
  auto sim = [&] {
    SimOptions options;
    if (config.sim_capacity) options.capacity = config.sim_capacity;
    return std::make_shared<SimBackend>(options);
  };
  if (config.device == "sim") return sim();
#if RESERVOIR_HAVE_CUDA
  if (config.device == "cuda") return std::make_shared<CudaBackend>();
  if (CudaBackend::available()) return std::make_shared<CudaBackend>();
  return sim();
#else
  if (config.device == "cuda")
    throw DeviceError(
        "reservoir: device:cuda was asked for, but this build has no CUDA backend (no CUDA "
        "toolkit was found at configure time)");
  return sim();
#endif
}

Allocator& Allocator::instance() {
  // Never destroyed: device work and other static destructors may still free.
  static Allocator* global = [] {
    Config config = Config::from_environment();
    std::shared_ptr<Backend> backend = make_default_backend(config);
    try {
      return new Allocator(backend, config);
    } catch (const IoError& e) {
      // record_trace names a file that cannot be written: the allocator must still
      // work (else every later call fails), so it runs without the trace.
      std::fprintf(stderr, "%s; running without recording a trace\n", e.what());
      config.record_trace.clear();
      return new Allocator(backend, config);
    }
  }();
  return *global;
}

detail::DeviceEngine& Allocator::engine(int device) {
  return impl_->engine(impl_->resolve(device));
}

void* Allocator::allocate(std::size_t size, StreamHandle stream, int device) {
  if (size == 0) return nullptr;
  Impl& im = *impl_;
  // Fast path: an explicit, valid device and an existing engine.
  const int d = static_cast<unsigned>(device) < static_cast<unsigned>(im.device_count)
                    ? device
                    : im.resolve(device);
  if (size >= kOneEiB)
    throw OutOfMemoryError("Reservoir: out of memory on device " + std::to_string(d) +
                           ": tried to allocate " + format_size(size) +
                           ", which is more than 1 EiB; no device has that much memory (a "
                           "negative size converted to unsigned?)");
  if (!im.caching) {
    void* ptr = nullptr;
    DeviceStatus st = im.backend->allocate(d, size, &ptr);
    if (st == DeviceStatus::out_of_memory)
      throw OutOfMemoryError("Reservoir (uncached mode): out of memory on device " +
                             std::to_string(d) + ": tried to allocate " + format_size(size));
    if (st != DeviceStatus::ok)
      throw DeviceError("reservoir: allocating " + format_size(size) +
                        " failed: " + im.backend->last_error());
    std::lock_guard<std::mutex> guard(im.uncached_mutex);
    im.uncached[reinterpret_cast<std::uintptr_t>(ptr)] = {size, d};
    DeviceStats& s = im.uncached_stats[d];
    for (StatArray* a :
         {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) {
      Stat& all = a->pool[0];
      all.current += static_cast<std::int64_t>(size);
      all.allocated += static_cast<std::int64_t>(size);
      all.peak = std::max(all.peak, all.current);
    }
    s.num_device_alloc += 1;
    return ptr;
  }
  DeviceEngine* engine = im.engines[d].load(std::memory_order_acquire);
  DeviceEngine& e = engine ? *engine : im.engine(d);
  try {
    if (!im.recording.load(std::memory_order_relaxed))
      return reinterpret_cast<void*>(e.pool(stream).allocate(size));
    std::lock_guard<std::mutex> guard(im.recorder_mutex);
    void* ptr = reinterpret_cast<void*>(e.pool(stream).allocate(size));
    if (im.recorder) im.recorder->on_allocate(ptr, size, stream);
    return ptr;
  } catch (const OutOfMemoryError& oom) {
    // OOM report (oom_snapshot:PATH): the state at the failure, for PyTorch's viewer.
    // A failed write is reported in the message; it never replaces the OOM.
    std::string path;
    {
      std::lock_guard<std::mutex> cg(im.config_mutex);
      path = im.config.oom_snapshot;
    }
    if (path.empty()) throw;
    std::string message = oom.what();
    try {
      dump_snapshot(path);
      message += " A snapshot was written to " + path + ".";
    } catch (const std::exception& error) {
      message += " (writing the OOM snapshot to " + path + " failed: " + error.what() + ")";
    }
    throw OutOfMemoryError(message);
  }
}

void Allocator::deallocate(void* ptr) {
  if (!ptr) return;
  Impl& im = *impl_;
  if (!im.caching) {
    std::lock_guard<std::mutex> guard(im.uncached_mutex);
    auto it = im.uncached.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == im.uncached.end())
      throw InvalidPointerError("reservoir: cannot free " + format_pointer(ptr) +
                                ": it is not a live allocation (uncached mode)");
    if (im.backend->deallocate(it->second.device, ptr, it->second.size) != DeviceStatus::ok)
      throw DeviceError("reservoir: freeing " + format_pointer(ptr) +
                        " failed: " + im.backend->last_error());
    DeviceStats& s = im.uncached_stats[it->second.device];
    for (StatArray* a :
         {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) {
      a->pool[0].current -= static_cast<std::int64_t>(it->second.size);
      a->pool[0].freed += static_cast<std::int64_t>(it->second.size);
    }
    s.num_device_free += 1;
    im.uncached.erase(it);
    return;
  }
  auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto free_one = [&] {
    im.with_owner(ptr, "free", [&](detail::StreamPool& pool) { return pool.free(address); });
  };
  if (!im.recording.load(std::memory_order_relaxed)) return free_one();
  std::lock_guard<std::mutex> guard(im.recorder_mutex);
  free_one();
  if (im.recorder) im.recorder->on_free(ptr);
}

void Allocator::record_stream(void* ptr, StreamHandle stream) {
  if (!ptr) return;
  Impl& im = *impl_;
  if (!im.caching) return;  // uncached frees go straight to the device, which syncs
  auto address = reinterpret_cast<std::uintptr_t>(ptr);
  im.with_owner(ptr, "record a stream use of",
                [&](detail::StreamPool& pool) { return pool.record_use(address, stream); });
  if (im.recording.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> guard(im.recorder_mutex);
    if (im.recorder) im.recorder->on_record_stream(ptr, stream);
  }
}

void Allocator::notify_host_wait(StreamHandle stream, int device) {
  Impl& im = *impl_;
  int d = im.resolve(device);
  if (im.caching) im.engine(d).pool(stream).process_events_now();
  if (im.recording.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> guard(im.recorder_mutex);
    if (im.recorder) im.recorder->on_host_wait(stream);
  }
}

void Allocator::empty_cache() {
  for (int d = 0; d < impl_->device_count; ++d)
    if (impl_->engines[d].load(std::memory_order_acquire)) impl_->engine(d).empty_cache();
}

void Allocator::empty_cache(int device) {
  if (impl_->caching) impl_->engine(impl_->resolve(device)).empty_cache();
}

void Allocator::set_memory_fraction(double fraction, int device) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw InvalidArgumentError("reservoir: memory fraction must be within [0, 1], got " +
                               std::to_string(fraction));
  impl_->engine(impl_->resolve(device)).set_memory_fraction(fraction);
}

double Allocator::memory_fraction(int device) {
  return impl_->engine(impl_->resolve(device)).memory_fraction();
}

std::size_t Allocator::largest_cached_block(int device) {
  if (!impl_->caching) return 0;
  return impl_->engine(impl_->resolve(device)).largest_cached_block();
}

BaseAllocation Allocator::base_allocation(void* ptr) {
  Impl& im = *impl_;
  if (!im.caching) {
    std::lock_guard<std::mutex> guard(im.uncached_mutex);
    auto it = im.uncached.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == im.uncached.end())
      throw InvalidPointerError("reservoir: " + format_pointer(ptr) + " is not a live allocation");
    return BaseAllocation{ptr, it->second.size};
  }
  BaseAllocation out;
  im.with_owner(ptr, "find the segment of", [&](detail::StreamPool& pool) {
    return pool.segment_of(reinterpret_cast<std::uintptr_t>(ptr), &out);
  });
  return out;
}

std::size_t Allocator::block_size(void* ptr) {
  std::size_t size = 0;
  auto address = reinterpret_cast<std::uintptr_t>(ptr);
  impl_->with_owner(ptr, "size", [&](detail::StreamPool& pool) {
    return pool.block_sizes(address, &size, nullptr);
  });
  return size;
}

std::size_t Allocator::requested_size(void* ptr) {
  std::size_t requested = 0;
  auto address = reinterpret_cast<std::uintptr_t>(ptr);
  impl_->with_owner(ptr, "size", [&](detail::StreamPool& pool) {
    return pool.block_sizes(address, nullptr, &requested);
  });
  return requested;
}

void Allocator::enable_peer_access(int device, int peer) {
  Impl& im = *impl_;
  int d = im.resolve(device);
  int p = im.resolve(peer);
  if (d == p) return;
  if (im.backend->enable_peer_access(d, p) != DeviceStatus::ok)
    throw DeviceError("reservoir: enabling access from device " + std::to_string(d) +
                      " to device " + std::to_string(p) + " failed: " + im.backend->last_error());
  if (im.caching) im.engine(p).add_peer(d);
}

DeviceStats Allocator::stats(int device) {
  int d = impl_->resolve(device);
  if (!impl_->caching) {
    std::lock_guard<std::mutex> guard(impl_->uncached_mutex);
    return impl_->uncached_stats[d];
  }
  return impl_->engine(d).stats();
}

void Allocator::reset_peak_stats(int device) {
  if (impl_->caching) impl_->engine(impl_->resolve(device)).reset_peak_stats();
}

void Allocator::reset_accumulated_stats(int device) {
  if (impl_->caching) impl_->engine(impl_->resolve(device)).reset_accumulated_stats();
}

void Allocator::attach_oom_observer(OomObserver observer) {
  std::lock_guard<std::mutex> guard(impl_->hooks.mutex);
  impl_->hooks.oom_observers.push_back(std::move(observer));
}

void Allocator::add_free_memory_callback(FreeMemoryCallback callback) {
  std::lock_guard<std::mutex> guard(impl_->hooks.mutex);
  impl_->hooks.free_memory_callbacks.push_back(std::move(callback));
}

const Config& Allocator::config() const {
  return impl_->config;
}

void Allocator::update_config(std::string_view text) {
  Impl& im = *impl_;
  Config next;
  {
    std::lock_guard<std::mutex> guard(im.config_mutex);
    next = im.config;
  }
  next.apply(text);  // throws ConfigError, leaving everything unchanged
  // Only an update that names the key changes a memory fraction set at run time.
  const bool sets_fraction = Config::parse(text).per_process_memory_fraction_set;
  {
    std::lock_guard<std::mutex> guard(im.engines_mutex);
    for (auto& e : im.owned_engines) e->update_config(next, sets_fraction);
  }
  std::string previous_trace;
  {
    std::lock_guard<std::mutex> guard(im.config_mutex);
    previous_trace = im.config.record_trace;
    im.config = next;
  }
  if (next.record_trace != previous_trace) {
    if (next.record_trace.empty())
      im.stop_recording();
    else
      im.start_recording(next.record_trace);
  }
}

void Allocator::record_history(bool enabled, std::size_t max_entries, ContextLevel level,
                               ContextRecorder recorder) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> guard(im.engines_mutex);
  std::lock_guard<std::mutex> hg(im.history_mutex);
  im.history_enabled = enabled;
  im.history_entries = max_entries;
  im.history_level = level;
  im.history_recorder = recorder;
  if (!enabled) im.annotations.clear();
  for (auto& e : im.owned_engines) e->history().configure(enabled, max_entries, level, recorder);
}

void Allocator::attach_trace_tracker(TraceTracker tracker) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> guard(im.engines_mutex);
  std::lock_guard<std::mutex> hg(im.history_mutex);
  im.trackers.push_back(tracker);
  for (auto& e : im.owned_engines) e->history().add_tracker(tracker);
}

void Allocator::record_annotation(std::string name, std::string value, int device) {
  Impl& im = *impl_;
  int d = im.resolve(device);
  std::lock_guard<std::mutex> hg(im.history_mutex);
  if (!im.history_enabled) return;
  if (im.annotations.size() >= im.history_entries) im.annotations.pop_front();
  im.annotations.push_back(Annotation{d, im.backend->now_us(), std::move(name), std::move(value)});
}

std::vector<TraceEntry> Allocator::history(int device) {
  return impl_->engine(impl_->resolve(device)).history().entries();
}

Snapshot Allocator::snapshot() {
  Impl& im = *impl_;
  Snapshot out;
  std::vector<DeviceEngine*> engines;
  {
    std::lock_guard<std::mutex> guard(im.engines_mutex);
    for (int d = 0; d < im.device_count; ++d) engines.push_back(im.engines[d].load());
  }
  out.device_traces.resize(engines.size());
  for (std::size_t d = 0; d < engines.size(); ++d) {
    if (!engines[d]) continue;
    engines[d]->snapshot(&out.segments);
    out.device_traces[d] = engines[d]->history().entries();
  }
  std::sort(out.segments.begin(), out.segments.end(),
            [](const SegmentInfo& x, const SegmentInfo& y) { return x.address < y.address; });
  {
    std::lock_guard<std::mutex> hg(im.history_mutex);
    out.annotations.assign(im.annotations.begin(), im.annotations.end());
  }
  Config c;
  {
    std::lock_guard<std::mutex> cg(im.config_mutex);
    c = im.config;
  }
  out.settings = c.to_string();
  out.expandable_segments = c.expandable_segments;
  out.max_split_size = c.max_split_size;
  out.garbage_collection_threshold = c.garbage_collection_threshold;
  out.release_lock_on_cudamalloc = c.release_lock_on_cudamalloc;
  out.roundup_power2_divisions.assign(c.roundup_power2_divisions.begin(),
                                      c.roundup_power2_divisions.end());
  return out;
}

void Allocator::start_trace_recording(const std::string& path) {
  impl_->start_recording(path);
}
void Allocator::stop_trace_recording() {
  impl_->stop_recording();
}

Backend& Allocator::backend() {
  return *impl_->backend;
}
int Allocator::device_count() {
  return impl_->device_count;
}

std::vector<int> Allocator::devices_in_use() {
  std::vector<int> out;
  for (int d = 0; d < impl_->device_count; ++d)
    if (impl_->engines[d].load(std::memory_order_acquire)) out.push_back(d);
  return out;
}
bool Allocator::caching() const {
  return impl_->caching;
}

void Allocator::validate() {
  std::lock_guard<std::mutex> guard(impl_->engines_mutex);
  for (auto& e : impl_->owned_engines) e->validate(true);
}

}  // namespace reservoir
