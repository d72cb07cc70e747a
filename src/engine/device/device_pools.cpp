// DeviceEngine: private pools — routing requests to them, their caches (one
// StreamPool per pool and stream, recycled once a released pool has given all its
// memory back), use counts, capture bookkeeping, and checkpoints.
#include <algorithm>
#include <string>

#include "engine/device/device_engine.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"

namespace reservoir::detail {

std::uintptr_t DeviceEngine::allocate_private(PrivatePool& pool, std::size_t requested,
                                              StreamHandle stream, const Context& context) {
  StreamPool& p = private_stream_pool(pool, stream);
  if (std::uintptr_t address = p.allocate_cached(requested, context)) return address;
  return allocate_slow(p, requested, context, true);
}

std::uintptr_t DeviceEngine::allocate_from_use_on_oom(std::size_t requested, StreamHandle stream,
                                                      const Context& context) {
  for (const PoolRegistry::Pool& pool : private_registry_.use_on_oom_pools())
    if (StreamPool* p = pool->find(stream))
      if (std::uintptr_t address = p->allocate_cached(requested, context)) return address;
  return 0;
}

StreamPool& DeviceEngine::private_stream_pool(PrivatePool& pool, StreamHandle stream) {
  if (StreamPool* p = pool.find(stream)) return *p;
  std::lock_guard<std::mutex> guard(create_mutex_);
  if (StreamPool* p = pool.find(stream)) return *p;  // made meanwhile
  StreamPool* made = take_pool_locked(spare_, private_pools_, stream);
  // A tag's memory is pages that sleep can unmap; a device that cannot map memory
  // serves it as any pool's (sleep then refuses, saying why).
  const bool vmm = pool.tag() != kNoTag && (backend_.capabilities() & kVirtualMemory) != 0;
  made->set_private(pool.id(), pool.options().no_split, pool.source(), vmm);
  pool.add(made);
  return *made;
}

void DeviceEngine::collect_dead_pools() {
  std::vector<PoolRegistry::Pool> dead = private_registry_.take_dead();
  if (dead.empty()) return;
  std::lock_guard<std::mutex> guard(create_mutex_);
  for (const PoolRegistry::Pool& pool : dead)
    for (StreamPool* p : pool->streams()) {
      p->set_private(PoolId{}, false, nullptr);
      spare_.push_back(p);
    }
}

PoolRegistry::Pool DeviceEngine::live_pool(PoolId id, const char* action) {
  PoolRegistry::Pool pool = private_registry_.find(id);
  if (!pool)
    throw InvalidArgumentError(std::string("reservoir: cannot ") + action + " private pool " +
                               pool_name(id) + ": no such pool on device " +
                               std::to_string(device_));
  if (pool->use_count == 0)
    throw InvalidArgumentError(std::string("reservoir: cannot ") + action + " private pool " +
                               pool_name(id) + ": it was released");
  return pool;
}

// ---------------------------------------------------------------- use counts

void DeviceEngine::retain_pool(PoolId id, const PoolOptions& options,
                               std::shared_ptr<SegmentSource> source) {
  private_registry_.retain(id, options, std::move(source), thread_tag_for(&hooks_));
}

void DeviceEngine::release_pool(PoolId id, bool empty_cache) {
  PoolRegistry::Pool pool = empty_cache ? private_registry_.find(id) : nullptr;
  private_registry_.release(id);
  // The last use gone (a route may still hold one): the pool's cached segments go back
  // now, its frees waiting for other streams waited for first (PyTorch's MemPool
  // destructor: emptyCache with the pool active). Nothing goes back during a capture.
  if (pool && private_registry_.use_count(id) == 0 && !capture_.underway()) {
    History::Delivery delivery(history_);
    std::lock_guard<std::mutex> guard(ladder_mutex_);
    release_caches_locked(pool->streams());
  }
  collect_dead_pools();  // a pool that holds no memory is forgotten at once
}

int DeviceEngine::pool_use_count(PoolId id) {
  return private_registry_.use_count(id);
}

PrivatePoolUsage DeviceEngine::pool_usage(PoolId id) {
  const PoolRegistry::Pool pool = private_registry_.find(id);
  if (!pool)
    throw InvalidArgumentError("reservoir: cannot measure private pool " + pool_name(id) +
                               ": no such pool on device " + std::to_string(device_));
  PrivatePoolUsage usage;
  for (StreamPool* p : pool->streams()) {
    const StreamPool::SleepCounts c = p->sleep_counts();
    usage.reserved_bytes += c.reserved;
    usage.allocated_bytes += c.allocated;
  }
  return usage;
}

PoolId DeviceEngine::routed_pool(StreamHandle stream) {
  if (!private_registry_.routing()) return PoolId{0, 0};
  const PoolRegistry::Pool routed = private_registry_.route(stream);
  return routed ? routed->id() : PoolId{0, 0};
}

// ---------------------------------------------------------------- routing

void DeviceEngine::begin_allocate_to_pool(PoolId id, StreamFilter filter, bool capture) {
  if (capture) {
    // The capture is counted first: a free racing with begin must not record events.
    capture_.begin();
    // Every pool reads the count under its lock before it queries or records an event,
    // frees or unmaps: an operation under way on another thread finishes before the
    // capture begins on the device (the caller begins it after this call returns).
    for (StreamPool* p : all_pools_snapshot()) std::lock_guard<Lock> wait(p->lock());
    if (CompactPool* c = compact_if_made()) c->wait_for_operations();
  }
  try {
    private_registry_.begin(id, std::move(filter), capture, thread_tag_for(&hooks_));
  } catch (...) {
    if (capture) capture_.end();
    throw;
  }
}

void DeviceEngine::end_allocate_to_pool(PoolId id) {
  History::Delivery delivery(history_);
  if (!private_registry_.end(id) || !capture_.end()) return;
  // The last capture ended: the frees deferred meanwhile record their events now.
  std::string failure;
  // Under policy:compact the default pools serve only requests made during captures,
  // when their pending frees may not be checked: they are checked now, or they would
  // wait for the next capture's requests, which may not check them either.
  const bool check_pending = compact_on_.load(std::memory_order_relaxed);
  for (StreamPool* p : all_pools_snapshot()) {
    try {
      p->flush_capture_deferred();
      if (check_pending) p->process_events_now();
    } catch (const DeviceError& e) {
      if (failure.empty()) failure = e.what();
    }
  }
  if (!failure.empty()) throw DeviceError(failure);
}

// ---------------------------------------------------------------- checkpoints

PoolCheckpoint DeviceEngine::checkpoint_pool(PoolId id) {
  History::Delivery delivery(history_);
  const std::vector<StreamPool*> caches = live_pool(id, "checkpoint")->streams();
  if (!capture_.underway())
    for (StreamPool* p : caches) {
      p->flush_capture_deferred();
      p->synchronize_pending();  // a checkpoint records no pending free
    }
  PoolCheckpoint out;
  out.device = device_;
  out.pool = id;
  for (StreamPool* p : caches) p->checkpoint(&out.segments);
  return out;
}

PoolRestore DeviceEngine::restore_pool(const PoolCheckpoint& checkpoint) {
  History::Delivery delivery(history_);
  if (checkpoint.device != device_)
    throw InvalidArgumentError("reservoir: the checkpoint is of device " +
                               std::to_string(checkpoint.device) + ", not " +
                               std::to_string(device_));
  if (capture_.underway())
    throw InvalidArgumentError("reservoir: cannot restore private pool " +
                               pool_name(checkpoint.pool) +
                               " while a capture is under way (it frees and waits)");
  PoolRegistry::Pool pool = live_pool(checkpoint.pool, "restore");
  // Every check before any change: a bad checkpoint changes nothing.
  std::vector<std::pair<StreamPool*, std::vector<const CheckpointSegment*>>> work;
  for (StreamPool* p : pool->streams()) work.push_back({p, {}});
  for (const CheckpointSegment& segment : checkpoint.segments) {
    auto it = std::find_if(work.begin(), work.end(),
                           [&](const auto& w) { return w.first->stream() == segment.stream; });
    if (it == work.end())
      throw InvalidArgumentError("reservoir: cannot restore the checkpoint: private pool " +
                                 pool_name(checkpoint.pool) + " has no memory on stream " +
                                 std::to_string(segment.stream));
    it->second.push_back(&segment);
  }
  for (auto& [p, segments] : work) p->check_restorable(segments);
  // A device error while freeing (waiting for a pending free's event) leaves every
  // block of the pool freed, nothing of the checkpoint allocated, and is rethrown.
  PoolRestore out;
  std::string failure;
  for (auto& [p, segments] : work) {
    try {
      p->flush_capture_deferred();
      p->free_all_allocated(&out.freed);
    } catch (const DeviceError& e) {
      if (failure.empty()) failure = e.what();
    }
  }
  if (!failure.empty()) throw DeviceError(failure);
  std::vector<void*> allocated;
  for (auto& [p, segments] : work) p->restore(segments, &allocated);
  out.allocated = std::move(allocated);
  return out;
}

bool DeviceEngine::pool_live_allocations_are(PoolId id, const std::vector<void*>& expected) {
  PoolRegistry::Pool pool = private_registry_.find(id);
  if (!pool)
    throw InvalidArgumentError("reservoir: no private pool " + pool_name(id) + " on device " +
                               std::to_string(device_));
  std::vector<std::uintptr_t> live;
  for (StreamPool* p : pool->streams()) p->allocated_addresses(&live);
  std::vector<std::uintptr_t> want;
  want.reserve(expected.size());
  for (void* e : expected) want.push_back(reinterpret_cast<std::uintptr_t>(e));
  std::sort(live.begin(), live.end());
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  return live == want;
}

}  // namespace reservoir::detail
