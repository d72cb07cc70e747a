// DeviceEngine: pool routing, the memory-fraction budget, and the device-wide
// operations (garbage collection, releasing every cache, statistics, snapshots,
// configuration). The out-of-memory ladder is in oom_ladder.cpp.
#include "engine/device/device_engine.hpp"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "reservoir/errors.hpp"
#include "util/checks.hpp"

namespace reservoir::detail {

bool EngineHooks::run_free_memory_callbacks() {
  std::vector<FreeMemoryCallback> callbacks;
  {
    std::lock_guard<std::mutex> guard(mutex);
    callbacks = free_memory_callbacks;
  }
  bool freed = false;
  for (auto& cb : callbacks) freed |= cb();
  return freed;
}

std::vector<OomObserver> EngineHooks::observers() {
  std::lock_guard<std::mutex> guard(mutex);
  return oom_observers;
}

DeviceEngine::DeviceEngine(Backend& backend, int device, const Config& config, SegmentMap& segments,
                           EngineHooks& hooks)
    : backend_(backend),
      device_(device),
      hooks_(hooks),
      config_(config),
      settings_(config),
      events_(backend, device),
      registry_(segments),
      host_stash_(backend, device),
      services_{backend_, device_, events_,  ledger_,   registry_, budget_,  counters_,
                gc_,      peers_,  history_, settings_, capture_,  waiting_, host_stash_} {
  const bool compact = config.policy == Config::Policy::compact;
  compact_on_.store(compact, std::memory_order_relaxed);
  if (compact) detours_.fetch_or(kDetourCompact, std::memory_order_relaxed);
  if (config.per_process_memory_fraction_set)
    set_memory_fraction(config.per_process_memory_fraction);
}

DeviceEngine::~DeviceEngine() {
  for (const auto& e : tags_) (void)finish_restoring(*e, true);
  pools_.clear();
  private_pools_.clear();
  compact_.reset();
}

CompactPool& DeviceEngine::make_compact() {
  std::lock_guard<std::mutex> guard(create_mutex_);
  if (!compact_) {
    compact_ = std::make_unique<CompactPool>(services_);
    compact_ptr_.store(compact_.get(), std::memory_order_release);
  }
  return *compact_;
}

void DeviceEngine::empty_cache() {
  History::Delivery delivery(history_);
  // During a capture nothing may go back to the device (nor may events be waited for).
  if (capture_.underway()) return;
  release_cached_everywhere();
  std::lock_guard<std::mutex> guard(create_mutex_);
  sweep_draining_locked(draining_.size());
}

void DeviceEngine::release_stream(StreamHandle stream) {
  History::Delivery delivery(history_);
  // policy:compact defers work to a stream's later calls (its markers); the
  // PyTorch-exact pools record what they need at the free, but unmapping expandable
  // pages synchronizes the pool's stream: from now on they wait for the device.
  {
    std::lock_guard<std::mutex> guard(create_mutex_);
    // A private pool keeps its caches while it lives (its graphs' replays need the
    // addresses); they become spares, for any stream, once it is released and empty.
    for (const auto& p : private_pools_)
      if (p->stream() == stream) p->release_stream(false);
    if (StreamPool* p = table_.find(stream)) {
      p->release_stream(true);  // its cache may serve the next stream
      // Released before and drained since: recycled now, it leaves the draining list
      // (the sweep would recycle it a second time, perhaps serving another stream).
      const auto listed = std::find(draining_.begin(), draining_.end(), p);
      if (retire_locked(p, false)) {
        if (listed != draining_.end()) draining_.erase(listed);
      } else if (listed == draining_.end()) {
        draining_.push_back(p);
      }
    }
    sweep_draining_locked(2);
  }
  if (CompactPool* c = compact_if_made()) c->release_stream(stream);
}

bool DeviceEngine::retire_locked(StreamPool* p, bool give_back) {
  const StreamHandle stream = p->stream();
  if (!p->recycle(StreamPool::kNoStream, give_back)) return false;
  table_.erase(stream);
  if (first_pool_.load(std::memory_order_relaxed) == p)
    first_pool_.store(nullptr, std::memory_order_release);
  recycled_.push_back(p);
  return true;
}

// A few at a time: each new stream pays for at most `most` checks. Beyond
// kDrainingKept pools, the oldest stops waiting for its release fence: its cache goes
// back to the device (so a device that never finishes a released stream's work, or
// streams released faster than their work completes, hold a bounded cache).
void DeviceEngine::sweep_draining_locked(std::size_t most) {
  for (std::size_t n = std::min(most, draining_.size()); n > 0; --n) {
    StreamPool* p = draining_.front();
    draining_.pop_front();
    if (!retire_locked(p, draining_.size() >= kDrainingKept)) draining_.push_back(p);
  }
}

StreamPool* DeviceEngine::existing_pool(StreamHandle stream) {
  if (StreamPool* first = first_pool_.load(std::memory_order_acquire);
      first && first_stream_ == stream)
    return first;
  if (StreamPool* p = table_.find(stream)) return p;
  std::lock_guard<std::mutex> guard(create_mutex_);  // the lock-free find may miss
  return table_.find(stream);
}

void DeviceEngine::host_waited(StreamHandle stream) {
  History::Delivery delivery(history_);
  // The frees pending on stream wait in the pools of the streams that allocated the
  // blocks: those pools check their events, whatever the number of other streams.
  for (StreamPool* p : waiting_.of(stream)) p->process_events_now();
  if (CompactPool* c = compact_if_made()) c->host_waited(stream);
}

std::size_t DeviceEngine::stream_pool_count() {
  std::lock_guard<std::mutex> guard(create_mutex_);
  return pools_.size();
}

std::size_t DeviceEngine::stream_table_size() {
  std::lock_guard<std::mutex> guard(create_mutex_);
  return table_.size();
}

std::size_t DeviceEngine::stream_table_capacity() {
  std::lock_guard<std::mutex> guard(create_mutex_);
  return table_.capacity();
}

std::uintptr_t DeviceEngine::allocate_with_context(std::size_t requested, StreamHandle stream) {
  History::Delivery delivery(history_);  // trackers after the pools' locks (history.hpp)
  const Context context = history_.active() ? history_.gather(ContextLevel::state) : Context{};
  if (private_registry_.routing())
    if (PoolRegistry::Pool routed = private_registry_.route(stream))
      return routed->tag() == kNoTag
                 ? allocate_private(*routed, requested, stream, context)
                 : allocate_tagged(routed->tag(), routed.get(), requested, stream, context);
  if (detours_.load(std::memory_order_relaxed) & kDetourTags)
    if (const TagId tag = thread_tag_for(&hooks_); tag != kNoTag)
      return allocate_tagged(tag, nullptr, requested, stream, context);
  if (compact_on_.load(std::memory_order_relaxed))
    return allocate_compact(requested, stream, context);
  return allocate_default(requested, stream, context);
}

std::uintptr_t DeviceEngine::allocate_missed(StreamPool& pool, std::size_t requested,
                                             StreamHandle stream, const Context& context) {
  StreamPool* p = &pool;
  for (;;) {
    // Recycled meanwhile: the table again, under its mutex (exact there).
    while (p->stream() != stream) {
      p = &create_pool(stream);
      if (std::uintptr_t address =
              p->allocate_cached(requested, stream, context, history_.active()))
        return address;
    }
    // The ladder's steps lock the pool one by one: pinned, it is not recycled (to
    // serve another stream) between them, as another thread's sweep otherwise may.
    StreamPool::Pin pin(*p);
    if (pin.serves(stream)) return allocate_slow(*p, requested, context);
  }
}

StreamPool& DeviceEngine::create_pool(StreamHandle stream) {
  std::lock_guard<std::mutex> guard(create_mutex_);
  if (StreamPool* p = table_.find(stream)) return *p;  // created meanwhile
  sweep_draining_locked(2);
  StreamPool* pool = take_pool_locked(recycled_, pools_, stream);
  table_.insert(stream, pool);
  if (!first_made_) {
    first_made_ = true;
    first_stream_ = stream;
    first_pool_.store(pool, std::memory_order_release);
  }
  return *pool;
}

// An empty pool holds nothing of its last stream: any stream may take it.
StreamPool* DeviceEngine::take_pool_locked(std::vector<StreamPool*>& empty,
                                           std::vector<std::unique_ptr<StreamPool>>& owned,
                                           StreamHandle stream) {
  if (!empty.empty()) {
    StreamPool* p = empty.back();
    empty.pop_back();
    p->assign(stream);
    return p;
  }
  owned.push_back(std::make_unique<StreamPool>(services_, stream));
  return owned.back().get();
}

std::vector<StreamPool*> DeviceEngine::pools_snapshot() {
  std::lock_guard<std::mutex> guard(create_mutex_);
  std::vector<StreamPool*> out;
  out.reserve(pools_.size());
  for (const auto& p : pools_) out.push_back(p.get());
  return out;
}

std::vector<StreamPool*> DeviceEngine::all_pools_snapshot() {
  std::lock_guard<std::mutex> guard(create_mutex_);
  std::vector<StreamPool*> out;
  out.reserve(pools_.size() + private_pools_.size());
  for (const auto& p : pools_) out.push_back(p.get());
  for (const auto& p : private_pools_) out.push_back(p.get());
  return out;
}

void DeviceEngine::add_peer(int device) {
  if (!peers_.add(device)) return;
  try {
    for (StreamPool* p : all_pools_snapshot()) p->add_peer(device);
  } catch (...) {
    // Not a peer until every segment granted access: a retry grants the rest.
    peers_.remove(device);
    throw;
  }
}

// ---------------------------------------------------------------- budget

void DeviceEngine::set_memory_fraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw InvalidArgumentError("reservoir: memory fraction must be within [0, 1], got " +
                               std::to_string(fraction));
  MemoryInfo info;
  if (backend_.memory_info(device_, &info) != DeviceStatus::ok)
    throw DeviceError("reservoir: reading memory info of device " + std::to_string(device_) +
                      " failed: " + backend_.last_error());
  budget_.set_limit(static_cast<std::size_t>(fraction * static_cast<double>(info.total)));
  std::lock_guard<std::mutex> guard(config_mutex_);
  gc_.set_enabled(config_.garbage_collection_threshold > 0.0);
}

double DeviceEngine::memory_fraction() const {
  if (!budget_.limited()) return 1.0;
  MemoryInfo info;
  if (backend_.memory_info(device_, &info) != DeviceStatus::ok || info.total == 0) return 1.0;
  return static_cast<double>(budget_.limit()) / static_cast<double>(info.total);
}

// ---------------------------------------------------------------- device-wide release

void DeviceEngine::garbage_collect() {
  std::lock_guard<std::mutex> guard(ladder_mutex_);
  double threshold_fraction;
  {
    std::lock_guard<std::mutex> cg(config_mutex_);
    threshold_fraction = config_.garbage_collection_threshold;
  }
  const auto threshold =
      static_cast<std::size_t>(threshold_fraction * static_cast<double>(budget_.limit()));
  const std::size_t reserved_now = budget_.reserved();
  if (reserved_now <= threshold) return;
  const std::size_t target = reserved_now - threshold;
  const std::uint64_t now = gc_.now();
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

// The default pools and the released private pools (a pool still in use keeps its
// cache: replays of its graphs need the addresses).
void DeviceEngine::release_cached_everywhere(bool compact_pages_back) {
  if (capture_.underway()) return;
  {
    std::lock_guard<std::mutex> guard(ladder_mutex_);
    DeviceCounters::bump(counters_.sync_all_streams);
    auto pools = pools_snapshot();
    for (const PoolRegistry::Pool& released : private_registry_.released())
      for (StreamPool* p : released->streams()) pools.push_back(p);
    // Tags' own pools too (no graph holds their addresses; a sleeping one gives nothing).
    for (StreamPool* p : tag_own_pools()) pools.push_back(p);
    release_caches_locked(pools);
  }
  // The pools share the device: a private pool's request under policy:compact (and a
  // default pool's after a policy switch) may need the compact pool's free pages.
  if (CompactPool* c = compact_if_made()) c->release_free_pages(compact_pages_back);
  collect_dead_pools();
}

void DeviceEngine::release_caches_locked(const std::vector<StreamPool*>& pools) {
  // Every pending free waited for first: a segment goes back only once all its blocks
  // are free.
  for (StreamPool* p : pools) p->synchronize_pending();
  for (StreamPool* p : pools) p->release_cached();
}

std::size_t DeviceEngine::cached_elsewhere(const StreamPool* except) {
  std::size_t total = 0;
  for (StreamPool* p : pools_snapshot())
    if (p != except) total += p->cached_bytes();
  if (CompactPool* c = compact_if_made()) total += c->cached_bytes();
  return total;
}

// ---------------------------------------------------------------- queries

void DeviceEngine::snapshot(std::vector<SegmentInfo>* out) {
  std::size_t active = 0;
  for (StreamPool* p : all_pools_snapshot()) {
    const std::size_t first = out->size();
    active += p->snapshot(out);
    const TagId tag = tag_of(*p);
    if (tag == kNoTag) continue;
    const std::string name = TagNames::name(tag);
    for (std::size_t i = first; i < out->size(); ++i) {
      (*out)[i].tag = name;
      (*out)[i].asleep = p->asleep();
    }
  }
  if (CompactPool* c = compact_if_made()) active += c->snapshot(out);
  if (history_.active()) services_.trace(TraceAction::snapshot, 0, active, 0, nullptr);
}

std::size_t DeviceEngine::largest_cached_block() {
  std::size_t largest = 0;
  for (StreamPool* p : all_pools_snapshot())  // private pools too, as c10's cacheInfo
    largest =
        std::max({largest, p->largest_free_block(kSmallPool), p->largest_free_block(kLargePool)});
  if (CompactPool* c = compact_if_made()) largest = std::max(largest, c->largest_free_block());
  return largest;
}

DeviceStats DeviceEngine::stats() {
  DeviceStats s;
  ledger_.read(&s);
  s.num_alloc_retries = counters_.alloc_retries.load(std::memory_order_relaxed);
  s.num_ooms = counters_.ooms.load(std::memory_order_relaxed);
  s.num_sync_all_streams = counters_.sync_all_streams.load(std::memory_order_relaxed);
  s.num_device_alloc = counters_.device_allocs.load(std::memory_order_relaxed);
  s.num_device_free = counters_.device_frees.load(std::memory_order_relaxed);
  s.num_device_map = counters_.device_maps.load(std::memory_order_relaxed);
  s.num_device_unmap = counters_.device_unmaps.load(std::memory_order_relaxed);
  s.num_stream_waits = counters_.stream_waits.load(std::memory_order_relaxed);
  s.host_kept_bytes = static_cast<std::int64_t>(host_stash_.kept_bytes());
  {
    std::lock_guard<std::mutex> guard(create_mutex_);
    for (const auto& p : private_pools_)  // tags' own pools are not the program's pools
      if (p->pool_id().first != kTagPoolMark)
        s.private_pool_reserved_bytes += static_cast<std::int64_t>(p->reserved_bytes());
  }
  s.private_pools = static_cast<std::int64_t>(private_registry_.pools().size());
  std::lock_guard<std::mutex> guard(config_mutex_);
  s.max_split_size = static_cast<std::int64_t>(settings_.policy.max_split_size());
  return s;
}

void DeviceEngine::reset_accumulated_stats() {
  ledger_.reset_accumulated();
  counters_.reset();
}

void DeviceEngine::lock_every_pool(EveryPoolLocked* held) {
  held->locks.reserve(pools_.size() + private_pools_.size() + 1);
  for (auto& p : pools_) held->locks.emplace_back(p->lock());
  for (auto& p : private_pools_) held->locks.emplace_back(p->lock());
  if (compact_) {
    held->locks.emplace_back(compact_->lock());
    held->compact.emplace(*compact_);
  }
}

void DeviceEngine::update_config(const Config& config, bool apply_fraction) {
  {
    // No pool is created meanwhile (creation reads the settings), and every existing
    // one is locked while they change.
    std::lock_guard<std::mutex> guard(config_mutex_);
    std::lock_guard<std::mutex> creating(create_mutex_);
    EveryPoolLocked locked;
    lock_every_pool(&locked);
    config_ = config;
    settings_ = PoolSettings(config);
    gc_.set_enabled(budget_.limited() && config.garbage_collection_threshold > 0.0);
    for (auto& p : pools_) p->forget_fit();
    for (auto& p : private_pools_) p->forget_fit();
    const bool compact = config.policy == Config::Policy::compact;
    compact_on_.store(compact, std::memory_order_relaxed);
    if (compact)
      detours_.fetch_or(kDetourCompact, std::memory_order_relaxed);
    else
      detours_.fetch_and(static_cast<std::uint8_t>(~kDetourCompact), std::memory_order_relaxed);
  }
  if (apply_fraction && config.per_process_memory_fraction_set)
    set_memory_fraction(config.per_process_memory_fraction);
}

// What it compares is read under the locks that guard it, in the lock order: walking
// the pools one by one and reading the budget afterwards compared different moments.
void DeviceEngine::validate() {
  std::lock_guard<std::mutex> creating(create_mutex_);  // no pool made or recycled
  private_registry_.validate();
  for (StreamPool* spare : spare_)
    RESERVOIR_CHECK(!spare->holds_segments(), "a spare private-pool cache holds segments");
  StreamPool* first = first_pool_.load(std::memory_order_acquire);
  RESERVOIR_CHECK(
      !first || (table_.find(first_stream_) == first && first->stream() == first_stream_),
      "the first stream's pool is not the table's");
  std::unordered_set<const StreamPool*> listed;
  table_.for_each([&](StreamHandle stream, StreamPool* p) {
    RESERVOIR_CHECK(p->stream() == stream, "the stream table maps stream " +
                                               std::to_string(stream) + " to a pool of stream " +
                                               std::to_string(p->stream()));
    RESERVOIR_CHECK(listed.insert(p).second, "a pool is in two stream table slots");
  });
  for (StreamPool* p : recycled_) {
    RESERVOIR_CHECK(p->stream() == StreamPool::kNoStream && !p->holds_blocks(),
                    "a recycled stream pool serves a stream or holds blocks");
    RESERVOIR_CHECK(listed.insert(p).second,
                    "a recycled stream pool is in the stream table or recycled twice");
  }
  RESERVOIR_CHECK(listed.size() == pools_.size(),
                  "a stream pool is neither in the stream table nor recycled");
  std::unordered_set<const StreamPool*> draining;
  for (StreamPool* p : draining_) {
    RESERVOIR_CHECK(p->stream() != StreamPool::kNoStream && table_.find(p->stream()) == p,
                    "a draining stream pool is not its stream's");
    RESERVOIR_CHECK(draining.insert(p).second, "a stream pool is twice in the draining list");
  }
  // Every pool locked for the whole walk: the budget and the threads' statistics
  // shards change only under a pool's lock.
  EveryPoolLocked locked;
  lock_every_pool(&locked);
  ValidationTotals totals;
  for (auto& p : pools_) p->validate_locked(&totals);
  for (auto& p : private_pools_) p->validate_locked(&totals);
  if (compact_) compact_->validate_locked(&totals, *locked.compact);
  RESERVOIR_CHECK(totals.use_queues == waiting_.pairs(),
                  "the device lists " + std::to_string(waiting_.pairs()) +
                      " (stream, pool) waits but the pools hold " +
                      std::to_string(totals.use_queues) + " use queues");
  const std::string ledger = ledger_.problem();
  RESERVOIR_CHECK(ledger.empty(), ledger);
  const std::string stash = host_stash_.problem();
  RESERVOIR_CHECK(stash.empty(), stash);
  // The statistics are the blocks' sums (fixed shards are other engines' books).
  for (int pool = 0; pool < kPoolCount; ++pool)
    for (int kind = 0; kind < kStatKinds; ++kind) {
      const std::int64_t counted = ledger_.pooled_total(kind, pool);
      RESERVOIR_CHECK(counted == totals.counted[kind][pool],
                      std::string("statistic ") + kStatKindNames[kind] +
                          (pool ? ".large_pool" : ".small_pool") + " is " +
                          std::to_string(counted) + " but the blocks add up to " +
                          std::to_string(totals.counted[kind][pool]));
    }
  RESERVOIR_CHECK(totals.reserved + budget_.unlocked() == budget_.reserved(),
                  "pools reserve " + std::to_string(totals.reserved) + " bytes (and " +
                      std::to_string(budget_.unlocked()) +
                      " are in device calls) but the device budget counts " +
                      std::to_string(budget_.reserved()));
}

}  // namespace reservoir::detail
