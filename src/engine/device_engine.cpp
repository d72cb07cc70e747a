// DeviceEngine: pool routing, the memory-fraction budget, and the device-wide
// rungs of the out-of-memory ladder (garbage collection, releasing every cache,
// the out-of-memory report).
#include "engine/device_engine.hpp"

#include <algorithm>
#include <cstdio>

#include "engine/block.hpp"
#include "engine/segment_map.hpp"
#include "engine/stream_pool.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

DeviceEngine::DeviceEngine(Backend& backend, int device, const Config& config, SegmentMap& segments,
                           EngineHooks& hooks)
    : backend_(backend),
      device_(device),
      segments_(segments),
      hooks_(hooks),
      config_(config),
      policy_(config),
      events_(backend, device) {
  tables_.push_back(std::make_unique<StreamTable>(64));
  table_.store(tables_.back().get(), std::memory_order_release);
  if (config.per_process_memory_fraction_set)
    set_memory_fraction(config.per_process_memory_fraction);
}

DeviceEngine::~DeviceEngine() {
  pools_.clear();
}

StreamPool& DeviceEngine::create_pool(StreamHandle stream) {
  std::lock_guard<std::mutex> guard(create_mutex_);
  StreamTable* t = table_.load(std::memory_order_relaxed);
  std::size_t mask = t->capacity - 1;
  for (std::size_t i = hash(stream) & mask;; i = (i + 1) & mask) {
    std::uintptr_t key = t->entries[i].key.load(std::memory_order_relaxed);
    if (key == stream + 1) return *t->entries[i].pool;  // created meanwhile
    if (key == 0) break;
  }
  pools_.push_back(std::make_unique<StreamPool>(*this, stream));
  StreamPool* pool = pools_.back().get();
  ledger_.attach(&pool->counters());
  if ((pools_.size() + 1) * 2 > t->capacity) {
    // Grow: readers may still walk the old table, so it stays alive (retired).
    tables_.push_back(std::make_unique<StreamTable>(t->capacity * 2));
    StreamTable* bigger = tables_.back().get();
    for (const auto& p : pools_) {
      std::size_t m = bigger->capacity - 1;
      std::size_t i = hash(p->stream()) & m;
      while (bigger->entries[i].key.load(std::memory_order_relaxed) != 0) i = (i + 1) & m;
      bigger->entries[i].pool = p.get();
      bigger->entries[i].key.store(p->stream() + 1, std::memory_order_relaxed);
    }
    table_.store(bigger, std::memory_order_release);
    return *pool;
  }
  std::size_t i = hash(stream) & mask;
  while (t->entries[i].key.load(std::memory_order_relaxed) != 0) i = (i + 1) & mask;
  t->entries[i].pool = pool;
  t->entries[i].key.store(stream + 1, std::memory_order_release);
  return *pool;
}

std::vector<StreamPool*> DeviceEngine::pools_snapshot() {
  std::lock_guard<std::mutex> guard(create_mutex_);
  std::vector<StreamPool*> out;
  out.reserve(pools_.size());
  for (const auto& p : pools_) out.push_back(p.get());
  return out;
}

Segment* DeviceEngine::new_segment() {
  std::lock_guard<std::mutex> guard(create_mutex_);
  Segment* seg;
  if (!spare_segments_.empty()) {
    seg = spare_segments_.back();
    spare_segments_.pop_back();
    // Field by field: base and size may be read concurrently (Segment::set_range).
    seg->set_range(0, 0);
    seg->mapped_bytes = 0;
    seg->set_owner(nullptr);
    seg->head = nullptr;
    seg->small = seg->expandable = seg->oversize = false;
    seg->vm = nullptr;
    seg->prev_in_pool = seg->next_in_pool = nullptr;
    seg->context.reset();
  } else {
    segment_objects_.push_back(std::make_unique<Segment>());
    seg = segment_objects_.back().get();
  }
  seg->serial = ++next_serial_;
  return seg;
}

void DeviceEngine::recycle_segment(Segment* segment) {
  // Segment objects are reused, never freed before the engine: a racing lookup of a
  // stale pointer then finds a live object and reports a clean error.
  std::lock_guard<std::mutex> guard(create_mutex_);
  spare_segments_.push_back(segment);
}

std::size_t DeviceEngine::expandable_reserve() {
  if (config_.expandable_segments_reserve) return config_.expandable_segments_reserve;
  MemoryInfo info;
  if (backend_.memory_info(device_, &info) != DeviceStatus::ok)
    throw DeviceError("reservoir: reading memory info of device " + std::to_string(device_) +
                      " failed: " + backend_.last_error());
  if (config_.expandable_segments_reserve_fraction > 0)
    return static_cast<std::size_t>(config_.expandable_segments_reserve_fraction *
                                    static_cast<double>(info.total));
  return info.total + info.total / 8;
}

std::vector<int> DeviceEngine::peers() {
  std::lock_guard<std::mutex> guard(create_mutex_);
  return peers_;
}

void DeviceEngine::add_peer(int device) {
  {
    std::lock_guard<std::mutex> guard(create_mutex_);
    if (std::find(peers_.begin(), peers_.end(), device) != peers_.end()) return;
    peers_.push_back(device);
  }
  try {
    for (StreamPool* p : pools_snapshot()) p->add_peer(device);
  } catch (...) {
    // Not a peer until every segment granted access: a retry grants the rest.
    std::lock_guard<std::mutex> guard(create_mutex_);
    std::erase(peers_, device);
    throw;
  }
}

// ---------------------------------------------------------------- budget

bool DeviceEngine::reserve(std::size_t bytes) noexcept {
  std::size_t before = reserved_.fetch_add(bytes, std::memory_order_relaxed);
  if (fraction_set_.load(std::memory_order_relaxed) &&
      before + bytes > allowed_.load(std::memory_order_relaxed)) {
    reserved_.fetch_sub(bytes, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void DeviceEngine::unreserve(std::size_t bytes) noexcept {
  reserved_.fetch_sub(bytes, std::memory_order_relaxed);
}

void DeviceEngine::set_memory_fraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw InvalidArgumentError("reservoir: memory fraction must be within [0, 1], got " +
                               std::to_string(fraction));
  MemoryInfo info;
  if (backend_.memory_info(device_, &info) != DeviceStatus::ok)
    throw DeviceError("reservoir: reading memory info of device " + std::to_string(device_) +
                      " failed: " + backend_.last_error());
  allowed_.store(static_cast<std::size_t>(fraction * static_cast<double>(info.total)),
                 std::memory_order_relaxed);
  fraction_set_.store(true, std::memory_order_relaxed);
  gc_enabled_.store(config_.garbage_collection_threshold > 0.0, std::memory_order_relaxed);
}

double DeviceEngine::memory_fraction() const {
  if (!fraction_set_.load(std::memory_order_relaxed)) return 1.0;
  MemoryInfo info;
  if (backend_.memory_info(device_, &info) != DeviceStatus::ok || info.total == 0) return 1.0;
  return static_cast<double>(allowed_.load(std::memory_order_relaxed)) /
         static_cast<double>(info.total);
}

// ---------------------------------------------------------------- ladder

bool DeviceEngine::has_free_memory_callbacks() {
  std::lock_guard<std::mutex> guard(hooks_.mutex);
  return !hooks_.free_memory_callbacks.empty();
}

bool DeviceEngine::run_free_memory_callbacks() {
  std::vector<FreeMemoryCallback> callbacks;
  {
    std::lock_guard<std::mutex> guard(hooks_.mutex);
    callbacks = hooks_.free_memory_callbacks;
  }
  bool freed = false;
  for (auto& cb : callbacks) freed |= cb();
  return freed;
}

void DeviceEngine::garbage_collect() {
  std::lock_guard<std::mutex> guard(ladder_mutex_);
  const auto threshold =
      static_cast<std::size_t>(config_.garbage_collection_threshold *
                               static_cast<double>(allowed_.load(std::memory_order_relaxed)));
  const std::size_t reserved_now = reserved();
  if (reserved_now <= threshold) return;
  const std::size_t target = reserved_now - threshold;
  const std::uint64_t now = gc_now();
  auto pools = pools_snapshot();
  GcTally tally;
  for (StreamPool* p : pools) p->gc_scan(now, &tally);
  while (tally.count > 0 && tally.reclaimed < target) {
    double threshold_age = static_cast<double>(tally.total_age) / static_cast<double>(tally.count);
    tally.freed_any = false;
    for (StreamPool* p : pools) p->gc_release(now, threshold_age, &tally);
    if (!tally.freed_any) break;
  }
}

void DeviceEngine::release_cached_everywhere() {
  std::lock_guard<std::mutex> guard(ladder_mutex_);
  num_sync_all_streams_.fetch_add(1, std::memory_order_relaxed);
  auto pools = pools_snapshot();
  for (StreamPool* p : pools) p->synchronize_pending();
  for (StreamPool* p : pools) p->release_cached();
}

void DeviceEngine::empty_cache() {
  release_cached_everywhere();
}

void DeviceEngine::raise_out_of_memory(StreamPool& pool, std::size_t requested,
                                       std::size_t alloc_size) {
  num_ooms_.fetch_add(1, std::memory_order_relaxed);
  MemoryInfo info;
  bool have_info = backend_.memory_info(device_, &info) == DeviceStatus::ok;
  DeviceStats s = stats();
  std::size_t largest_small = pool.largest_free_block(true);
  std::size_t largest_large = pool.largest_free_block(false);
  std::size_t other_streams = 0;
  for (StreamPool* p : pools_snapshot())
    if (p != &pool) other_streams += p->cached_bytes();
  const bool fraction = fraction_set_.load(std::memory_order_relaxed);
  const std::size_t allowed = allowed_.load(std::memory_order_relaxed);
  const auto allocated = static_cast<std::uint64_t>(s.allocated_bytes.all().current);
  const auto reserved_bytes = static_cast<std::uint64_t>(s.reserved_bytes.all().current);

  // Plain strings, not iostreams: the process may have changed the C++ locale.
  std::string m = "Reservoir: out of memory on device " + std::to_string(device_) + " (" +
                  backend_.name() + "): tried to allocate " + format_size(alloc_size) +
                  " for a request of " + format_size(requested) + " on stream " +
                  format_pointer(reinterpret_cast<void*>(pool.stream())) + ". ";
  if (have_info)
    m += "The device has " + format_size(info.total) + " in total, " + format_size(info.free) +
         " free. ";
  if (fraction) {
    char share[32];
    std::snprintf(share, sizeof share, "%.4g", memory_fraction());
    m += "The memory fraction allows this process " + format_size(allowed) + " (" + share +
         " of the device). ";
  }
  m += "Reservoir holds " + format_size(reserved_bytes) + ": " + format_size(allocated) +
       " allocated and " + format_size(reserved_bytes - std::min(reserved_bytes, allocated)) +
       " reserved but unallocated (largest free block on this stream: small pool " +
       format_size(largest_small) + ", large pool " + format_size(largest_large) + "; " +
       format_size(other_streams) +
       " cached on other streams). What to try: free tensors or buffers you no longer need; if "
       "reserved-but-unallocated memory is large, set "
       "RESERVOIR_ALLOC_CONF=expandable_segments:True (or max_split_size_mb:N) to reduce "
       "fragmentation";
  if (fraction) m += "; raise the memory fraction";
  m += "; replay a trace of this workload with reservoir-replay --fit to see how much memory "
       "it needs.";

  trace(TraceAction::oom, info.free, alloc_size, pool.stream(), nullptr);
  std::vector<OomObserver> observers;
  {
    std::lock_guard<std::mutex> guard(hooks_.mutex);
    observers = hooks_.oom_observers;
  }
  for (auto& obs : observers) obs(device_, alloc_size, fraction ? allowed : info.total, info.free);
  throw OutOfMemoryError(m);
}

// ---------------------------------------------------------------- queries

void DeviceEngine::snapshot(std::vector<SegmentInfo>* out) {
  std::size_t active = 0;
  for (StreamPool* p : pools_snapshot()) active += p->snapshot(out);
  trace(TraceAction::snapshot, 0, active, 0, nullptr);
}

std::size_t DeviceEngine::largest_cached_block() {
  std::size_t largest = 0;
  for (StreamPool* p : pools_snapshot())
    largest = std::max({largest, p->largest_free_block(true), p->largest_free_block(false)});
  return largest;
}

DeviceStats DeviceEngine::stats() {
  DeviceStats s;
  ledger_.read(&s);
  s.num_alloc_retries = num_alloc_retries_.load(std::memory_order_relaxed);
  s.num_ooms = num_ooms_.load(std::memory_order_relaxed);
  s.num_sync_all_streams = num_sync_all_streams_.load(std::memory_order_relaxed);
  s.num_device_alloc = num_device_alloc_.load(std::memory_order_relaxed);
  s.num_device_free = num_device_free_.load(std::memory_order_relaxed);
  s.max_split_size = static_cast<std::int64_t>(policy_.max_split_size());
  return s;
}

void DeviceEngine::reset_peak_stats() {
  ledger_.reset_peaks();
}

void DeviceEngine::reset_accumulated_stats() {
  for (StreamPool* p : pools_snapshot()) p->reset_accumulated();
  num_alloc_retries_ = 0;
  num_ooms_ = 0;
  num_sync_all_streams_ = 0;
  num_device_alloc_ = 0;
  num_device_free_ = 0;
}

void DeviceEngine::update_config(const Config& config, bool apply_fraction) {
  std::lock_guard<std::mutex> guard(config_mutex_);
  auto pools = pools_snapshot();
  for (StreamPool* p : pools) p->lock().lock();
  config_ = config;
  policy_ = SizePolicy(config);
  gc_enabled_.store(fraction_set_.load() && config.garbage_collection_threshold > 0.0);
  for (auto it = pools.rbegin(); it != pools.rend(); ++it) (*it)->lock().unlock();
  if (apply_fraction && config.per_process_memory_fraction_set)
    set_memory_fraction(config.per_process_memory_fraction);
}

}  // namespace reservoir::detail
