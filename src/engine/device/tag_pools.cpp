// DeviceEngine: tagged memory — each tag's own pool (a private pool of expandable
// segments, made on the tag's first request), requests under a tag, and sleep and wake
// of every pool carrying a tag (docs/sleep.md). Private pools made while their
// creating thread has a tag (a CUDA graph's, a MemPool's) carry it too.
#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "engine/device/device_engine.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
std::string quoted(TagId tag) {
  return "'" + TagNames::name(tag) + "'";
}
}  // namespace

void DeviceEngine::sleep_pool(StreamPool& pool, bool offload) {
  // Only a tag's own pool gives its free pages back: a private pool's free blocks are
  // its graphs' (their replays use the memory of blocks freed during the capture).
  pool.sleep(offload, pool.pool_id().first != kTagPoolMark);
}

void DeviceEngine::drop_wake_copies(WakeCopies& copies) noexcept {
  if (copies.host.empty()) return;
  (void)backend_.synchronize_stream(device_, copies.stream);
  for (void* h : copies.host) host_stash_.give(h);
  copies = WakeCopies{};
}

void DeviceEngine::set_tagging(bool on) {
  if (on)
    detours_.fetch_or(kDetourTags, std::memory_order_relaxed);
  else
    detours_.fetch_and(static_cast<std::uint8_t>(~kDetourTags), std::memory_order_relaxed);
}

DeviceEngine::TagEntry& DeviceEngine::tag_entry(TagId tag) {
  std::lock_guard<std::mutex> guard(tags_mutex_);
  for (const auto& e : tags_)
    if (e->tag == tag) return *e;
  auto e = std::make_unique<TagEntry>();
  e->tag = tag;
  e->pool = std::make_shared<PrivatePool>(PoolId{kTagPoolMark, tag}, PoolOptions{}, nullptr, tag);
  tags_.push_back(std::move(e));
  return *tags_.back();
}

std::uintptr_t DeviceEngine::allocate_tagged(TagId tag, PrivatePool* routed, std::size_t requested,
                                             StreamHandle stream, const Context& context) {
  TagEntry& e = tag_entry(tag);
  std::shared_lock<std::shared_mutex> use(e.use);
  if (e.asleep)
    throw InvalidArgumentError("reservoir: cannot allocate " + format_size(requested) +
                               " under tag " + quoted(tag) + " on device " +
                               std::to_string(device_) + ": the tag is asleep (wake it first)");
  return allocate_private(routed ? *routed : *e.pool, requested, stream, context);
}

std::vector<StreamPool*> DeviceEngine::tag_stream_pools(const TagEntry& entry) {
  std::vector<StreamPool*> out = entry.pool->streams();
  for (const PoolRegistry::Pool& p : private_registry_.pools())
    if (p->tag() == entry.tag)
      for (StreamPool* s : p->streams()) out.push_back(s);
  return out;
}

std::vector<StreamPool*> DeviceEngine::tag_own_pools() {
  std::lock_guard<std::mutex> guard(tags_mutex_);
  std::vector<StreamPool*> out;
  for (const auto& e : tags_)
    for (StreamPool* p : e->pool->streams()) out.push_back(p);
  return out;
}

TagId DeviceEngine::tag_of(const StreamPool& pool) {
  const PoolId id = pool.pool_id();
  if (id.first == kTagPoolMark) return static_cast<TagId>(id.second);
  if (id == PoolId{}) return kNoTag;
  for (const PoolRegistry::Pool& p : private_registry_.pools())
    if (p->id() == id) return p->tag();
  for (const PoolRegistry::Pool& p : private_registry_.released())
    if (p->id() == id) return p->tag();
  return kNoTag;
}

void DeviceEngine::sleep(TagId tag, SleepMode mode) {
  std::lock_guard<std::mutex> one(sleep_mutex_);
  if (!(backend_.capabilities() & kVirtualMemory))
    throw InvalidArgumentError("reservoir: cannot put tag " + quoted(tag) + " to sleep on device " +
                               std::to_string(device_) + ": " + backend_.name() +
                               " cannot map memory (sleep needs virtual memory management)");
  TagEntry& e = tag_entry(tag);
  std::unique_lock<std::shared_mutex> alone(e.use);
  if (e.asleep)
    throw InvalidArgumentError("reservoir: tag " + quoted(tag) + " is asleep already on device " +
                               std::to_string(device_));
  if (capture_.underway())
    throw InvalidArgumentError("reservoir: cannot put tag " + quoted(tag) +
                               " to sleep during a CUDA graph capture (its pages cannot be "
                               "unmapped then): end the capture first");
  // The copies of a wake on a stream land before the pages are copied or unmapped.
  (void)finish_restoring(e, true);
  History::Delivery delivery(history_);
  const std::vector<StreamPool*> pools = tag_stream_pools(e);
  std::size_t done = 0;
  try {
    for (; done < pools.size(); ++done) sleep_pool(*pools[done], mode == SleepMode::offload);
  } catch (...) {
    // What went to sleep wakes again (the pool that failed too: part of it may sleep).
    const std::size_t failed = done < pools.size() ? done + 1 : done;
    for (std::size_t i = 0; i < failed; ++i)
      if (pools[i]->asleep()) (void)pools[i]->wake();
    throw;
  }
  e.asleep = true;
  e.mode = mode;
}

void DeviceEngine::wake(TagId tag, const StreamHandle* stream) {
  std::lock_guard<std::mutex> one(sleep_mutex_);
  TagEntry& e = tag_entry(tag);
  std::unique_lock<std::shared_mutex> alone(e.use);
  if (!e.asleep)
    throw InvalidArgumentError("reservoir: cannot wake tag " + quoted(tag) + " on device " +
                               std::to_string(device_) + ": it is not asleep");
  if (capture_.underway())
    throw InvalidArgumentError("reservoir: cannot wake tag " + quoted(tag) +
                               " during a CUDA graph capture (its contents are copied back on "
                               "the device): end the capture first");
  History::Delivery delivery(history_);
  const std::vector<StreamPool*> pools = tag_stream_pools(e);
  const bool offload = e.mode == SleepMode::offload;
  WakeCopies restoring;
  WakeCopies* async = nullptr;
  if (stream && offload) async = &restoring;
  // All or nothing: on a failure the pools woken so far sleep again, once the copies
  // back have landed (their host copies then freed: sleep makes new ones).
  auto undo = [&](std::size_t woken) {
    drop_wake_copies(restoring);
    for (std::size_t i = 0; i < woken; ++i) sleep_pool(*pools[i], offload);
  };
  // Whether every pool woke; false (all asleep again) when the device or the memory
  // fraction has no room.
  auto wake_all = [&] {
    if (async) restoring.stream = *stream;
    std::size_t done = 0;
    bool room = true;
    try {
      for (; done < pools.size() && room; ++done)
        room = !pools[done]->asleep() || pools[done]->wake(async);
    } catch (...) {
      undo(done);
      throw;
    }
    if (!room) undo(done - 1);
    return room;
  };
  // The allocator's own cache must not stand in the way: without room, what it caches
  // goes back to the device (as the out-of-memory ladder's release) and the wake is
  // tried once more.
  if (!wake_all()) {
    release_cached_everywhere();
    if (!wake_all())
      throw OutOfMemoryError("reservoir: out of memory waking tag " + quoted(tag) + " on device " +
                             std::to_string(device_) + ": " +
                             format_size(tag_state_locked(e).asleep_bytes) +
                             " must be mapped again and the device (or the memory fraction) has "
                             "no room for it, with Reservoir's cache given back; free memory "
                             "(free tensors, or put another tag to sleep) and wake it again");
  }
  e.asleep = false;
  if (restoring.host.empty()) return;
  // The host copies are freed once an event after the copies has completed; without an
  // event, now, after waiting for the stream.
  EventHandle event = 0;
  try {
    event = events_.acquire();
    if (backend_.record_event(device_, event, restoring.stream) != DeviceStatus::ok) {
      events_.release(event);
      event = 0;
    }
  } catch (const DeviceError&) {
    event = 0;
  }
  if (event == 0) {
    drop_wake_copies(restoring);
    return;
  }
  std::lock_guard<std::mutex> guard(e.restore_mutex);
  e.restoring = std::move(restoring);
  e.restore_event = event;
}

std::size_t DeviceEngine::finish_restoring(TagEntry& e, bool wait) noexcept {
  std::lock_guard<std::mutex> guard(e.restore_mutex);
  if (e.restore_event == 0) return 0;
  const DeviceStatus done = wait ? backend_.synchronize_event(device_, e.restore_event)
                                 : backend_.query_event(device_, e.restore_event);
  if (done != DeviceStatus::ok) {
    if (!wait) return e.restoring.bytes;  // not ready (or failing: asked again later)
    // Cannot wait for the event: wait for the whole device before freeing what the
    // copies read.
    (void)backend_.synchronize_device(device_);
  }
  for (void* h : e.restoring.host) host_stash_.give(h);
  e.restoring = WakeCopies{};
  events_.release(e.restore_event);
  e.restore_event = 0;
  return 0;
}

TagState DeviceEngine::tag_state(TagId tag) {
  TagEntry& e = tag_entry(tag);
  std::shared_lock<std::shared_mutex> use(e.use);
  return tag_state_locked(e);
}

std::vector<TagState> DeviceEngine::tag_states() {
  std::vector<TagEntry*> entries;
  {
    std::lock_guard<std::mutex> guard(tags_mutex_);
    for (const auto& e : tags_) entries.push_back(e.get());  // entries live as long as the engine
  }
  std::vector<TagState> out;
  for (TagEntry* e : entries) {
    std::shared_lock<std::shared_mutex> use(e->use);
    out.push_back(tag_state_locked(*e));
  }
  return out;
}

TagState DeviceEngine::tag_state_locked(TagEntry& e) {
  TagState s;
  s.name = TagNames::name(e.tag);
  s.asleep = e.asleep;
  s.mode = e.asleep ? e.mode : SleepMode::offload;
  s.pools = 1;
  for (const PoolRegistry::Pool& p : private_registry_.pools())
    if (p->tag() == e.tag) ++s.pools;
  for (StreamPool* p : tag_stream_pools(e)) {
    const StreamPool::SleepCounts c = p->sleep_counts();
    s.allocated_bytes += c.allocated;
    s.reserved_bytes += c.reserved;
    s.asleep_bytes += c.asleep;
    s.offloaded_bytes += c.offloaded;
  }
  s.offloaded_bytes += finish_restoring(e, false);  // host copies a wake's copies still read
  return s;
}

}  // namespace reservoir::detail
