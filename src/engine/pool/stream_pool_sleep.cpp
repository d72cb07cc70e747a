// StreamPool's sleep and wake (a tag's pools: docs/sleep.md). A tagged pool's segments
// are all expandable (set_private's vmm), so its memory is pages that can be given
// back and mapped again at the same addresses: sleep waits for the pool's users, gives
// its free pages back as empty_cache would, then puts every page still mapped to sleep
// (ExpandableSegment::sleep); wake maps them again. While asleep nothing is handed out
// (the engine refuses the tag's requests) and nothing is given back (release_cached
// skips it); frees, record_stream and queries work on the books as ever.
#include <algorithm>
#include <vector>

#include "engine/pool/expandable_segment.hpp"
#include "engine/pool/stream_pool.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"

namespace reservoir::detail {

std::size_t StreamPool::sleep(bool offload, bool keep_free) {
  Guard guard(*this);
  RESERVOIR_ASSERT(!asleep_);
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool)
    if (!seg->expandable)
      throw InvalidArgumentError(
          "reservoir: cannot put private pool " + pool_name(pool_id_) +
          " to sleep: its segments are not pages Reservoir can unmap (it was made before its "
          "tag, or takes its memory from its own allocator)");
  // The work that used the blocks: the pool's stream (the whole device once the
  // program said it destroys it) and every stream recorded on a block; then the frees
  // still waiting for other streams.
  std::vector<StreamHandle> streams;
  allocated_.for_each([&](std::uintptr_t, Block* b) {
    if (b->extras)
      for (StreamHandle s : b->extras->uses)
        if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
  });
  auto check = [&](DeviceStatus status, const char* what) {
    if (status != DeviceStatus::ok)
      throw DeviceError(std::string("reservoir: synchronizing ") + what +
                        " before putting memory to sleep on device " +
                        std::to_string(services_.device) +
                        " failed: " + services_.backend.last_error());
  };
  if (stream_released_)
    check(services_.backend.synchronize_device(services_.device), "the device");
  else
    check(services_.backend.synchronize_stream(services_.device, stream()), "the pool's stream");
  for (StreamHandle s : streams)
    check(services_.backend.synchronize_stream(services_.device, s),
          "a stream a block was used on");
  if (pending_blocks_ != 0) process_events(true);
  if (!keep_free) release_cached_locked();  // free pages go back rather than to sleep
  asleep_ = true;
  sleep_offload_ = offload;
  std::size_t slept = 0;
  try {
    for (Segment* seg = segments_; seg; seg = seg->next_in_pool) slept += sleep_segment(seg);
  } catch (...) {
    finish_operation();
    throw;
  }
  finish_operation();
  return slept;
}

std::size_t StreamPool::sleep_segment(Segment* seg) {
  const std::size_t held = seg->vm->held_bytes();
  const std::size_t before = seg->vm->mapped_bytes();
  const auto ranges = seg->vm->mapped_ranges();
  auto settle = [&] {
    // Trackers (a communication library's registrations) hear of each run unmapped.
    if (tracing()) {
      const auto asleep = seg->vm->asleep_ranges();
      for (const auto& r : ranges)
        if (std::find(asleep.begin(), asleep.end(), r) != asleep.end())
          trace(TraceAction::segment_unmap, r.first, r.second, seg->context);
    }
    const std::size_t gone = before - seg->vm->mapped_bytes();
    seg->mapped_bytes -= gone;
    count_held(seg, held, gone);  // pages the device would not take back stay reserved
    stats().add<kReservedBytes>(seg->pool, -static_cast<std::int64_t>(gone));
    DeviceCounters::bump(services_.counters.device_unmaps,
                         static_cast<std::int64_t>(gone / seg->vm->page_size()));
    return gone;
  };
  try {
    seg->vm->sleep(sleep_offload_);
  } catch (...) {
    settle();
    throw;
  }
  return settle();
}

bool StreamPool::wake_segment(Segment* seg, WakeCopies* restoring) {
  const std::size_t want = seg->vm->asleep_bytes();
  if (want == 0) return true;
  if (!services_.budget.reserve(want)) return false;
  const std::size_t held = seg->vm->held_bytes();
  const auto ranges = seg->vm->asleep_ranges();
  auto settle = [&] {
    // A failed wake maps nothing, but for runs whose undo the device refused (awake).
    const std::size_t mapped = want - seg->vm->asleep_bytes();
    if (tracing()) {
      const auto asleep = seg->vm->asleep_ranges();
      for (const auto& r : ranges)
        if (std::find(asleep.begin(), asleep.end(), r) == asleep.end())
          trace(TraceAction::segment_map, r.first, r.second, seg->context);
    }
    count_held(seg, held, want - mapped);
    seg->mapped_bytes += mapped;
    stats().add<kReservedBytes>(seg->pool, static_cast<std::int64_t>(mapped));
    DeviceCounters::bump(services_.counters.device_maps,
                         static_cast<std::int64_t>(mapped / seg->vm->page_size()));
  };
  bool ok = false;
  try {
    ok = seg->vm->wake(restoring);
  } catch (...) {
    settle();
    throw;
  }
  settle();
  return ok;
}

bool StreamPool::wake(WakeCopies* restoring) {
  Guard guard(*this);
  RESERVOIR_ASSERT(asleep_);
  // All or nothing: a failure puts the segments woken so far back to sleep as they
  // were (offloaded contents copied out again, once the copies back have landed; the
  // host copies those read are then freed).
  std::vector<Segment*> woken;
  const std::size_t first_host = restoring ? restoring->host.size() : 0;
  const std::size_t first_bytes = restoring ? restoring->bytes : 0;
  auto undo = [&] {
    if (restoring && restoring->host.size() > first_host) {
      (void)services_.backend.synchronize_stream(services_.device, restoring->stream);
      for (std::size_t i = first_host; i < restoring->host.size(); ++i)
        services_.host_stash.give(restoring->host[i]);
      restoring->host.resize(first_host);
      restoring->bytes = first_bytes;
    }
    for (Segment* seg : woken) sleep_segment(seg);
  };
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool) {
    bool ok = false;
    try {
      ok = wake_segment(seg, restoring);
    } catch (...) {
      undo();
      finish_operation();
      throw;
    }
    if (!ok) {
      undo();
      finish_operation();
      return false;
    }
    woken.push_back(seg);
  }
  asleep_ = false;
  finish_operation();
  return true;
}

StreamPool::SleepCounts StreamPool::sleep_counts() {
  Guard guard(*this);
  SleepCounts c;
  allocated_.for_each([&](std::uintptr_t, Block* b) { c.allocated += b->size; });
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool) {
    c.reserved += seg->mapped_bytes + (seg->expandable ? seg->vm->held_bytes() : 0);
    if (seg->expandable) {
      c.asleep += seg->vm->asleep_bytes();
      c.offloaded += seg->vm->offloaded_bytes();
    }
  }
  return c;
}

}  // namespace reservoir::detail
