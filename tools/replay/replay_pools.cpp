// The private pools of a trace in a replay (replay_pools.hpp).
#include "replay_pools.hpp"

#include <algorithm>
#include <unordered_set>

#include "reservoir/errors.hpp"

namespace reservoir::replay {

TracePools::TracePools(Allocator& alloc, const Trace& trace, int device)
    : alloc_(alloc),
      trace_(trace),
      device_(device),
      routed_(trace.pools + 1u, false),
      uses_(trace.pools + 1u, 0),
      open_capture_(trace.pools + 1u, -1),
      released_(trace.pools + 1u, false),
      figures_(trace.pools + 1u) {
  for (std::uint32_t k = 1; k <= trace.pools; ++k) {
    figures_[k].number = k;
    if (k < trace.pool_peak_live.size()) figures_[k].peak_live = trace.pool_peak_live[k];
  }
}

TracePools::~TracePools() {
  for (std::uint32_t k = 1; k < routed_.size(); ++k)
    if (routed_[k]) {
      try {
        alloc_.end_allocate_to_pool(id_of(k), device_);
      } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): teardown, nothing to undo
      }
    }
}

void TracePools::after_alloc(std::uint32_t slot, std::uint64_t size, void* ptr) {
  const std::uint16_t pool = target_;
  target_ = 0;
  if (pool == 0) return;
  ++figures_[pool].requests;
  if (const std::int64_t c = open_capture_[pool]; c >= 0) {
    ++captures_[static_cast<std::size_t>(c)].requests;
    captures_[static_cast<std::size_t>(c)].requested_bytes += size;
  }
  if (ptr != nullptr) pooled_[ptr] = slot;
  sample(pool);
}

std::uint64_t TracePools::reserved_now() {
  const std::int64_t r = alloc_.stats(device_).reserved_bytes.all().current;
  return r < 0 ? 0 : static_cast<std::uint64_t>(r);
}

void TracePools::sample(std::uint32_t pool) {
  const PrivatePoolUsage u = alloc_.pool_usage(id_of(pool), device_);
  PoolFigures& f = figures_[pool];
  f.peak_reserved = std::max<std::uint64_t>(f.peak_reserved, u.reserved_bytes);
  f.peak_allocated = std::max<std::uint64_t>(f.peak_allocated, u.allocated_bytes);
}

void TracePools::apply(const Event& ev) {
  const std::uint32_t pool = ev.slot;
  switch (ev.kind) {
    case EventKind::pool_retain: {
      PoolOptions options;
      options.use_on_oom = (ev.size & kPoolUseOnOom) != 0;
      options.no_split = (ev.size & kPoolNoSplit) != 0;
      alloc_.retain_pool(id_of(pool), options, device_);
      ++uses_[pool];
      break;
    }
    case EventKind::pool_release:
      alloc_.release_pool(id_of(pool), device_, ev.size != 0);
      released_[pool] = --uses_[pool] == 0;
      break;
    case EventKind::route_begin:
      alloc_.begin_route_to_pool(
          id_of(pool), [this, pool](StreamHandle) { return target_ == pool; },
          ev.size != kRouteThread, device_);
      routed_[pool] = true;
      ++uses_[pool];
      if (ev.size != kRouteThread) {
        open_capture_[pool] = static_cast<std::int64_t>(captures_.size());
        CaptureFigures c;
        c.pool = pool;
        c.reserved_before = reserved_now();
        captures_.push_back(c);
      }
      break;
    case EventKind::route_end:
      alloc_.end_allocate_to_pool(id_of(pool), device_);
      routed_[pool] = false;
      if (const std::int64_t c = open_capture_[pool]; c >= 0) {
        CaptureFigures& f = captures_[static_cast<std::size_t>(c)];
        f.reserved_after = reserved_now();
        const std::int64_t held = alloc_.stats(device_).private_pool_reserved_bytes;
        f.pools_reserved_after = held < 0 ? 0 : static_cast<std::uint64_t>(held);
        f.ended = true;
        open_capture_[pool] = -1;
      }
      break;
    case EventKind::checkpoint: {
      const auto of = static_cast<std::uint32_t>(ev.size);
      Checkpoint c;
      c.state = alloc_.checkpoint_pool(id_of(of), device_);
      for (const CheckpointSegment& segment : c.state.segments)
        for (const CheckpointBlock& block : segment.blocks) {
          if (!block.allocated) continue;
          const auto it = pooled_.find(reinterpret_cast<void*>(block.address));
          if (it != pooled_.end()) c.address_of[it->second] = block.address;
        }
      checkpoints_[ev.slot] = std::move(c);
      break;
    }
    default:
      break;
  }
}

std::size_t TracePools::restore(std::size_t index, std::vector<void*>& ptrs) {
  const Event& ev = trace_.events[index];
  const Checkpoint& c = checkpoints_.at(ev.slot);
  const PoolRestore r = alloc_.restore_pool(c.state);
  std::unordered_set<void*> freed(r.freed.begin(), r.freed.end());
  std::unordered_set<void*> allocated(r.allocated.begin(), r.allocated.end());
  // Its y events first: every block the restore freed must then be none of the trace's.
  for (std::size_t k = 1; k <= ev.size; ++k) {
    const Event& e = trace_.events[index + k];
    if (e.kind != EventKind::restore_free) continue;
    void* p = ptrs[e.slot];
    if (p == nullptr) continue;  // its allocation failed in this replay
    if (freed.count(p) == 0) diverged(index, "did not free a block the recorded restore freed");
    pooled_.erase(p);
    ptrs[e.slot] = nullptr;
  }
  for (void* p : r.freed)
    if (pooled_.count(p) != 0) diverged(index, "freed a block the recorded restore did not");
  // Its o events: the block OLDID was at the checkpoint, allocated again.
  for (std::size_t k = 1; k <= ev.size; ++k) {
    const Event& e = trace_.events[index + k];
    if (e.kind != EventKind::restore_alloc) continue;
    const auto old = c.address_of.find(static_cast<std::uint32_t>(e.size));
    if (old == c.address_of.end()) continue;  // it failed here, or was not pooled
    void* p = reinterpret_cast<void*>(old->second);
    if (allocated.erase(p) == 0) continue;
    ptrs[e.slot] = p;
    pooled_[p] = e.slot;
  }
  // Blocks it allocated that no o line names (allocated before the recording) stay
  // the replay's to give back.
  orphans_.insert(orphans_.end(), allocated.begin(), allocated.end());
  sample(static_cast<std::uint32_t>(c.state.pool.second));
  return ev.size;
}

void TracePools::diverged(std::size_t index, const std::string& what) const {
  const Event& ev = trace_.events[index];
  throw TraceError(trace_.path + ": the replay's restore of checkpoint " + std::to_string(ev.slot) +
                   " (event " + std::to_string(index) + ") " + what +
                   ": the replay diverged from the program (its pools hold other blocks)");
}

std::vector<PoolFigures> TracePools::finish() {
  std::vector<PoolFigures> out;
  for (std::uint32_t k = 1; k < figures_.size(); ++k) {
    PoolFigures f = figures_[k];
    try {
      const PrivatePoolUsage u = alloc_.pool_usage(id_of(k), device_);
      f.end_reserved = u.reserved_bytes;
      f.end_allocated = u.allocated_bytes;
    } catch (const InvalidArgumentError&) {  // released and forgotten: nothing held
    }
    f.released = released_[k];
    out.push_back(f);
  }
  return out;
}

}  // namespace reservoir::replay
