// reservoir::Allocator: validates arguments, routes each request to the engine's
// request path (the caching engine or the uncached mode, with the layers that are
// on around it), and lets the engine's errors through as the C++ API's exceptions.
#include "reservoir/allocator.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "engine/allocators/async_pool_allocator.hpp"
#include "engine/allocators/caching_allocator.hpp"
#include "engine/allocators/uncached_allocator.hpp"
#include "front/allocator_impl.hpp"
#include "reservoir/sim_backend.hpp"
#include "util/compiler.hpp"
#include "util/format.hpp"
#if RESERVOIR_HAVE_CUDA
#include "reservoir/cuda_backend.hpp"
#endif

namespace reservoir {

namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// sim_capacity as a refusal names it (0: the simulated device's default).
std::string capacity_text(std::size_t bytes) {
  return bytes == 0 ? std::string("default") : std::to_string(bytes);
}

}  // namespace

Allocator::Allocator(std::shared_ptr<Backend> backend, const Config& config)
    : impl_(std::make_unique<Impl>()) {
  if (!backend) throw InvalidArgumentError("reservoir: Allocator needs a backend");
  Impl& im = *impl_;
  im.backend = std::move(backend);
  int count = 0;
  if (im.backend->device_count(&count) != DeviceStatus::ok)
    throw DeviceError("reservoir: counting devices failed: " + im.backend->last_error());
  im.device_count = count;
  im.implicit_device = count == 1 ? 0 : -1;
  config.check();  // a Config built field by field, not parsed (ConfigError)
  im.config = config;
  im.core = std::make_unique<detail::CachingAllocator>(*im.backend, config, count);
  core_ = im.core.get();
  if (env_flag("RESERVOIR_NO_CACHING"))
    im.other = std::make_unique<detail::UncachedAllocator>(*im.backend, *im.core);
  else if (config.backend == "cudaMallocAsync")
    im.other = std::make_unique<detail::AsyncPoolAllocator>(*im.backend, *im.core);  // ConfigError
  im.base = im.other ? im.other.get() : im.core.get();
  im.top.store(im.base);
  im.ipc = std::make_unique<detail::IpcService>(*im.backend, *im.core);
  im.oom_snapshot_path = config.oom_snapshot;
  if (!config.record_trace.empty()) im.set_recording(*this, config.record_trace);  // IoError
  std::lock_guard<std::mutex> guard(im.layers_mutex);
  im.relink(*this);
}

Allocator::Allocator()
    : Allocator(make_default_backend(Config::from_environment()), Config::from_environment()) {}

Allocator::~Allocator() {
  if (impl_ && impl_->recording) impl_->recording->close();
}

std::shared_ptr<Backend> Allocator::make_default_backend(const Config& config) {
  auto sim = [&] {
    SimOptions options;
    if (config.sim_capacity) options.capacity = config.sim_capacity;
    for (SimCompletion c : {SimCompletion::manual, SimCompletion::host_waits, SimCompletion::paced,
                            SimCompletion::eager})
      if (config.sim_completion == to_string(c)) options.completion = c;
    options.pace = config.sim_pace;
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
  // Never destroyed: device work and other static destructors may still free. A trace
  // being recorded is written out at exit by the recorder itself (trace_file.cpp).
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

// ---------------------------------------------------------------- requests

void* Allocator::allocate(std::size_t size, StreamHandle stream, int device) {
  Impl& im = *impl_;
  // The default argument (-1, the current device) needs no backend call with one device.
  if (device == -1) device = im.implicit_device;
  // The common call in one test: a size in (0, 1 EiB) (one compare for both ends), a
  // device index that needs no resolving, and no layer around the engine.
  if (RESERVOIR_LIKELY(size - 1 < front_detail::kOneEiB - 1 &&
                       static_cast<unsigned>(device) < static_cast<unsigned>(im.device_count))) {
    detail::MemoryResource* top = im.top.load(std::memory_order_acquire);
    if (RESERVOIR_LIKELY(top == core_)) return core_->allocate(size, stream, device);
  }
  return im.allocate_checked(size, stream, device);
}

void Allocator::deallocate(void* ptr) {
  if (!ptr) return;
  Impl& im = *impl_;
  // A block shared with keep waits for unshare (one load when nothing is kept).
  if (__builtin_expect(im.ipc->holding(), 0) && im.ipc->hold_free(ptr)) return;
  detail::MemoryResource* top = im.top.load(std::memory_order_acquire);
  if (top == core_) return core_->deallocate(ptr);
  top->deallocate(ptr);
}

void Allocator::record_stream(void* ptr, StreamHandle stream) {
  if (!ptr) return;
  impl_->top.load(std::memory_order_acquire)->record_stream(ptr, stream);
}

void Allocator::notify_host_wait(StreamHandle stream, int device) {
  const int resolved = impl_->resolve(device);
  // The device learns of the wait first (the simulated one completes the stream's work
  // there), so the events the engine then queries answer as after a real wait.
  if (impl_->backend->host_waited(resolved, stream) != DeviceStatus::ok)
    throw DeviceError("reservoir: reporting a host wait for stream " + std::to_string(stream) +
                      " to device " + std::to_string(resolved) +
                      " failed: " + impl_->backend->last_error());
  impl_->top.load(std::memory_order_acquire)->notify_host_wait(stream, resolved);
}

void Allocator::release_stream(StreamHandle stream, int device) {
  impl_->base->release_stream(stream, impl_->resolve(device));
}

// ---------------------------------------------------------------- cache control

void Allocator::empty_cache() {
  impl_->recorded([&] { impl_->base->empty_cache(-1); },
                  [](detail::TraceRecorder& r) { r.on_empty_cache(); });
}

void Allocator::empty_cache(int device) {
  const int d = impl_->resolve(device);
  impl_->recorded([&] { impl_->base->empty_cache(d); },
                  [](detail::TraceRecorder& r) { r.on_empty_cache(); });
}

void Allocator::set_memory_fraction(double fraction, int device) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw InvalidArgumentError("reservoir: memory fraction must be within [0, 1], got " +
                               std::to_string(fraction));
  impl_->engine(device).set_memory_fraction(fraction);
}

double Allocator::memory_fraction(int device) {
  return impl_->engine(device).memory_fraction();
}

std::size_t Allocator::largest_cached_block(int device) {
  return impl_->base->largest_cached_block(impl_->resolve(device));
}

BaseAllocation Allocator::base_allocation(void* ptr) {
  return impl_->base->base_allocation(ptr);
}

std::size_t Allocator::block_size(void* ptr) {
  return impl_->base->block_size(ptr);
}

std::size_t Allocator::requested_size(void* ptr) {
  return impl_->base->requested_size(ptr);
}

void Allocator::enable_peer_access(int device, int peer) {
  Impl& im = *impl_;
  int d = im.resolve(device);
  int p = im.resolve(peer);
  if (d == p) return;
  if (im.backend->enable_peer_access(d, p) != DeviceStatus::ok)
    throw DeviceError("reservoir: enabling access from device " + std::to_string(d) +
                      " to device " + std::to_string(p) + " failed: " + im.backend->last_error());
  im.core->engine(p).add_peer(d);
  im.base->add_peer(p, d);
  im.ipc->add_peer(p, d);
}

// ---------------------------------------------------------------- sharing (IPC)

SharedHandle Allocator::share(void* ptr, bool keep) {
  Impl& im = *impl_;
  const std::string_view refusal = im.base->traits().share_refusal;
  if (!refusal.empty())
    throw InvalidArgumentError(std::string("reservoir: cannot share ") +
                               detail::format_pointer(ptr) + ": " + std::string(refusal) +
                               "; use backend:native");
  return im.ipc->share(ptr, keep);
}

void Allocator::unshare(void* ptr) {
  if (impl_->ipc->unshare(ptr)) deallocate(ptr);
}

void* Allocator::open(const SharedHandle& handle, int device) {
  return impl_->ipc->open(handle, impl_->resolve(device));
}

void Allocator::close(void* ptr) {
  impl_->ipc->close(ptr);
}

// ---------------------------------------------------------------- private pools

namespace {
// Ids create_pool hands out: above any PyTorch makes (its counters start at 1).
std::atomic<std::uint64_t> g_next_pool{std::uint64_t{1} << 62};
}  // namespace

detail::DeviceEngine& Allocator::Impl::pool_engine(int device) {
  const std::string_view refusal = base->traits().pool_refusal;
  if (!refusal.empty()) throw InvalidArgumentError(std::string(refusal));
  return engine(device);
}

PoolId Allocator::create_pool(const PoolOptions& options, int device) {
  detail::DeviceEngine& e = impl_->pool_engine(device);
  const PoolId id{0, g_next_pool.fetch_add(1, std::memory_order_relaxed)};
  impl_->recorded([&] { e.retain_pool(id, options); },
                  [&](detail::TraceRecorder& r) { r.on_pool_retain(id, options, std::nullopt); });
  return id;
}

PoolId Allocator::create_pool(std::shared_ptr<SegmentSource> source, const PoolOptions& options,
                              int device) {
  if (!source)
    throw InvalidArgumentError(
        "reservoir: create_pool with a null segment source (use create_pool(options) for a "
        "pool of device memory)");
  detail::DeviceEngine& e = impl_->pool_engine(device);
  const PoolId id{0, g_next_pool.fetch_add(1, std::memory_order_relaxed)};
  impl_->recorded([&] { e.retain_pool(id, options, std::move(source)); },
                  [&](detail::TraceRecorder& r) { r.on_pool_retain(id, options, std::nullopt); });
  return id;
}

void Allocator::retain_pool(PoolId pool, const PoolOptions& options, int device) {
  impl_->recorded_pool(
      device, pool, [&](detail::DeviceEngine& e) { e.retain_pool(pool, options); },
      [&](detail::TraceRecorder& r, const detail::PoolBefore& before) {
        r.on_pool_retain(pool, options, before);
      });
}

void Allocator::release_pool(PoolId pool, int device, bool empty_cache) {
  impl_->recorded_pool(
      device, pool, [&](detail::DeviceEngine& e) { e.release_pool(pool, empty_cache); },
      [&](detail::TraceRecorder& r, const detail::PoolBefore& before) {
        r.on_pool_release(pool, empty_cache, before);
      });
}

int Allocator::pool_use_count(PoolId pool, int device) {
  return impl_->pool_engine(device).pool_use_count(pool);
}

void Allocator::begin_allocate_to_pool(PoolId pool, StreamFilter filter, int device) {
  begin_route_to_pool(pool, std::move(filter), true, device);
}

void Allocator::begin_route_to_pool(PoolId pool, StreamFilter filter, bool capture, int device) {
  impl_->recorded_pool(
      device, pool,
      [&](detail::DeviceEngine& e) { e.begin_allocate_to_pool(pool, std::move(filter), capture); },
      [&](detail::TraceRecorder& r, const detail::PoolBefore& before) {
        r.on_route_begin(pool, capture, nullptr, before);
      });
}

void Allocator::begin_capture_to_pool(PoolId pool, StreamHandle stream, int device) {
  impl_->recorded_pool(
      device, pool,
      [&](detail::DeviceEngine& e) {
        e.begin_allocate_to_pool(
            pool, [stream](StreamHandle s) { return s == stream; }, true);
      },
      [&](detail::TraceRecorder& r, const detail::PoolBefore& before) {
        r.on_route_begin(pool, true, &stream, before);
      });
}

void Allocator::begin_allocate_current_thread_to_pool(PoolId pool, int device) {
  impl_->recorded_pool(
      device, pool,
      [&](detail::DeviceEngine& e) {
        e.begin_allocate_to_pool(
            pool,
            [thread = std::this_thread::get_id()](StreamHandle) {
              return std::this_thread::get_id() == thread;
            },
            false);
      },
      [&](detail::TraceRecorder& r, const detail::PoolBefore& before) {
        r.on_route_begin(pool, false, nullptr, before);
      });
}

void Allocator::end_allocate_to_pool(PoolId pool, int device) {
  impl_->recorded_pool(
      device, pool, [&](detail::DeviceEngine& e) { e.end_allocate_to_pool(pool); },
      [&](detail::TraceRecorder& r, const detail::PoolBefore& before) {
        r.on_route_end(pool, before);
      });
}

namespace {
// PoolCheckpoint::number: which checkpoint_pool call made a checkpoint.
std::atomic<std::uint64_t> g_next_checkpoint{1};
}  // namespace

PoolCheckpoint Allocator::checkpoint_pool(PoolId pool, int device) {
  PoolCheckpoint out;
  impl_->recorded_pool(
      device, pool,
      [&](detail::DeviceEngine& e) {
        out = e.checkpoint_pool(pool);
        out.number = g_next_checkpoint.fetch_add(1, std::memory_order_relaxed);
      },
      [&](detail::TraceRecorder& r, const detail::PoolBefore& before) {
        r.on_checkpoint(out, before);
      });
  return out;
}

PoolRestore Allocator::restore_pool(const PoolCheckpoint& checkpoint) {
  detail::DeviceEngine& e = impl_->pool_engine(checkpoint.device);
  PoolRestore out;
  impl_->recorded([&] { out = e.restore_pool(checkpoint); },
                  [&](detail::TraceRecorder& r) { r.on_restore(checkpoint, out); });
  return out;
}

PrivatePoolUsage Allocator::pool_usage(PoolId pool, int device) {
  return impl_->pool_engine(device).pool_usage(pool);
}

bool Allocator::pool_live_allocations_are(PoolId pool, const std::vector<void*>& expected,
                                          int device) {
  return impl_->pool_engine(device).pool_live_allocations_are(pool, expected);
}

// ---------------------------------------------------------------- statistics and hooks

DeviceStats Allocator::stats(int device) {
  Impl& im = *impl_;
  const int d = im.resolve(device);
  DeviceStats s = im.core->engine(d).stats();
  im.base->adjust_stats(d, &s);
  return s;
}

void Allocator::reset_peak_stats(int device) {
  Impl& im = *impl_;
  const int d = im.resolve(device);
  im.core->engine(d).reset_peak_stats();
  im.base->reset_peaks(d);
}

void Allocator::reset_accumulated_stats(int device) {
  Impl& im = *impl_;
  const int d = im.resolve(device);
  im.core->engine(d).reset_accumulated_stats();
  im.base->reset_accumulated(d);
}

void Allocator::attach_oom_observer(OomObserver observer) {
  impl_->core->attach_oom_observer(std::move(observer));
}

void Allocator::add_free_memory_callback(FreeMemoryCallback callback) {
  impl_->core->add_free_memory_callback(std::move(callback));
}

// ---------------------------------------------------------------- configuration

const Config& Allocator::config() const {
  return impl_->config;
}

void Allocator::update_config(std::string_view text) {
  update_config_as(text, false);
}

void Allocator::set_allocator_settings(std::string_view text) {
  update_config_as(text, true);
}

void Allocator::update_config_as(std::string_view text, bool torch_settings) {
  using Update = detail::CachingAllocator::ConfigUpdate;
  const Update how = torch_settings ? Update::torch_settings : Update::merge;
  Impl& im = *impl_;
  const Config before = im.core->config();
  Config next = before;
  // Both throw ConfigError, changing nothing.
  if (torch_settings)
    next.apply_settings(text);
  else
    next.apply(text);
  // Settings read once, when the allocator and its device are made.
  const struct {
    const char* key;
    std::string now, asked;
    const char* why;
  } fixed[] = {
      {"backend", before.backend, next.backend, "the engine is chosen when the allocator is made"},
      {"device", before.device, next.device, "the device is chosen when the allocator is made"},
      {"sim_capacity", capacity_text(before.sim_capacity), capacity_text(next.sim_capacity),
       "the simulated device is made with its capacity"},
      {"sim_completion", before.sim_completion, next.sim_completion,
       "the simulated device is made with its completion model"},
      {"sim_pace", std::to_string(before.sim_pace), std::to_string(next.sim_pace),
       "the simulated device is made with its pace"},
  };
  for (const auto& f : fixed)
    if (f.asked != f.now)
      throw ConfigError(std::string("reservoir: ") + f.key + " cannot be set at run time: " +
                        f.why + " (set RESERVOIR_ALLOC_CONF=" + f.key + ":" + f.asked +
                        " before the first allocation); it is " + f.key + ":" + f.now);
  // A new trace file is opened before anything changes, so a path that cannot be
  // written (IoError) leaves the configuration as it was.
  if (next.record_trace != before.record_trace) im.set_recording(*this, next.record_trace);
  im.config = im.core->update_config(text, how);
  im.set_oom_snapshot(*this, im.config.oom_snapshot);
}

void Allocator::start_trace_recording(const std::string& path) {
  if (path.empty())
    throw InvalidArgumentError(
        "reservoir: start_trace_recording needs a file path (it was empty); "
        "stop_trace_recording stops a recording");
  impl_->set_recording(*this, path);
}

void Allocator::stop_trace_recording() {
  impl_->set_recording(*this, "");
}

// ---------------------------------------------------------------- history and snapshots

void Allocator::record_history(bool enabled, std::size_t max_entries, ContextLevel level,
                               ContextRecorder recorder) {
  impl_->core->record_history(enabled, max_entries, level, std::move(recorder));
}

void Allocator::attach_trace_tracker(TraceTracker tracker) {
  impl_->core->attach_trace_tracker(std::move(tracker));
}

void Allocator::record_annotation(std::string name, std::string value, int device) {
  impl_->core->record_annotation(Annotation{impl_->resolve(device), impl_->backend->now_us(),
                                            std::move(name), std::move(value)});
}

std::vector<TraceEntry> Allocator::history(int device) {
  return impl_->engine(device).history().entries();
}

std::vector<SegmentInfo> Allocator::segments(int device) {
  Impl& im = *impl_;
  const int d = im.resolve(device);
  std::vector<SegmentInfo> all;
  if (detail::DeviceEngine* e = im.core->engine_if_made(d)) e->snapshot(&all);
  im.base->snapshot(&all);
  std::vector<SegmentInfo> out;
  for (SegmentInfo& s : all)
    if (s.device == d) out.push_back(std::move(s));
  std::sort(out.begin(), out.end(),
            [](const SegmentInfo& x, const SegmentInfo& y) { return x.address < y.address; });
  return out;
}

Snapshot Allocator::snapshot() {
  Impl& im = *impl_;
  Snapshot out;
  out.device_traces.resize(static_cast<std::size_t>(im.device_count));
  for (int d = 0; d < im.device_count; ++d) {
    detail::DeviceEngine* e = im.core->engine_if_made(d);
    if (!e) continue;
    e->snapshot(&out.segments);
    out.device_traces[static_cast<std::size_t>(d)] = e->history().entries();
  }
  im.base->snapshot(&out.segments);
  std::sort(out.segments.begin(), out.segments.end(),
            [](const SegmentInfo& x, const SegmentInfo& y) { return x.address < y.address; });
  out.annotations = im.core->annotations();
  const Config c = im.core->config();
  out.settings = c.to_string();
  out.expandable_segments = c.expandable_segments;
  out.max_split_size = c.max_split_size;
  out.garbage_collection_threshold = c.garbage_collection_threshold;
  out.release_lock_on_cudamalloc = c.release_lock_on_cudamalloc;
  out.graph_capture_record_stream_reuse = c.graph_capture_record_stream_reuse;
  out.roundup_power2_divisions.assign(c.roundup_power2_divisions.begin(),
                                      c.roundup_power2_divisions.end());
  return out;
}

// ---------------------------------------------------------------- introspection

Backend& Allocator::backend() {
  return *impl_->backend;
}

int Allocator::device_count() {
  return impl_->device_count;
}

std::vector<int> Allocator::devices_in_use() {
  std::vector<int> out;
  for (int d = 0; d < impl_->device_count; ++d)
    if (impl_->core->engine_if_made(d)) out.push_back(d);
  return out;
}

bool Allocator::caching() const {
  return impl_->base->traits().caches;
}

const std::string& Allocator::engine_name() const {
  return impl_->base->traits().name;
}

void Allocator::validate() {
  impl_->core->validate();
}

}  // namespace reservoir
