// The random walk's private-pool steps: kOpDevice with an argument byte of 0x80 and
// up (below it the byte still sets the current device, as in older inputs).
//   arg bits 0-2: step, bit 3: slot (two pools), bit 4: device of a new pool.
//   0 create (next byte: bit 0 use_on_oom, bit 1 no_split)  1 route this thread
//   2 route a capture on stream (next byte)  3 end the route  4 release the pool
//   5 checkpoint  6 restore the checkpoint  7 check the pool's live blocks
// The model: each live block knows the pool slot that served it; a restore replaces
// the pool's live blocks by the checkpoint's. While a capture route is on a device,
// the device must get no memory, segment or address range back (check_capture; the
// simulated device counts calls for all devices together, so events are checked by
// the conformance tests, which model the capture on the device).
#include <algorithm>
#include <memory>
#include <utility>

#include "fuzz/walker.hpp"

namespace reservoir::fuzz {

bool Walker::in_compact_arena(std::uintptr_t address) const {
  for (const SegmentInfo& seg : alloc_->snapshot().segments)
    if (address >= seg.address && address < seg.address + seg.total_size)
      return seg.is_expandable && seg.pool == PoolId{};
  return false;
}

bool Walker::capture_on() const {
  return std::any_of(pools_.begin(), pools_.end(),
                     [](const PoolSlot& s) { return s.exists && s.route == 2; });
}

bool Walker::capture_on(int device) const {
  return std::any_of(pools_.begin(), pools_.end(), [device](const PoolSlot& s) {
    return s.exists && s.route == 2 && s.device == device;
  });
}

int Walker::serving_slot(int device, StreamHandle stream, std::uintptr_t address,
                         bool other_thread) {
  int best = -1;
  bool lends = false;
  for (int i = 0; i < 2; ++i) {
    const PoolSlot& s = pools_[static_cast<std::size_t>(i)];
    if (!s.exists || s.device != device) continue;
    lends |= s.use_on_oom;
    if (s.route == 0 || (s.route == 1 && other_thread) || (s.route == 2 && s.stream != stream))
      continue;
    if (best < 0 || s.order > pools_[static_cast<std::size_t>(best)].order) best = i;
  }
  if (best >= 0 || !lends) return best;
  // Not routed, but a use_on_oom pool may have lent one of its blocks.
  for (const SegmentInfo& seg : alloc_->snapshot().segments) {
    if (address < seg.address || address >= seg.address + seg.total_size) continue;
    for (int i = 0; i < 2; ++i)
      if (pools_[static_cast<std::size_t>(i)].exists &&
          pools_[static_cast<std::size_t>(i)].id == seg.pool)
        return i;
  }
  return -1;
}

// Per device (captures are a device's): what the device holds may only grow while a
// capture route on it is on.
void Walker::check_capture() {
  for (int d = 0; d < kDevices; ++d) {
    DeviceHold& was = capture_hold_[static_cast<std::size_t>(d)];
    bool capturing = false;
    for (const PoolSlot& s : pools_) capturing |= s.exists && s.route == 2 && s.device == d;
    const DeviceHold now{sim_->used(d), sim_->live_segments(d), sim_->live_reservations(d)};
    if (capturing && was.valid)
      WALK_CHECK(now.used >= was.used && now.segments >= was.segments &&
                     now.reservations >= was.reservations,
                 "device " + std::to_string(d) + " got memory back during a capture");
    was = now;
    was.valid = capturing;
  }
}

void Walker::op_pool(std::uint8_t arg) {
  if ((arg & 0x60) == 0x60) return op_tag(arg);
  const int step = arg & 7;
  const int index = (arg >> 3) & 1;
  PoolSlot& slot = pools_[static_cast<std::size_t>(index)];
  // A step with an injected failure pending would leave the model unsure.
  if (fault_active_) return;
  if (trace_) std::fprintf(stderr, "  pool step %d on slot %d\n", step, index);
  const bool was_capture = capture_on();
  switch (step) {
    case 0: {
      const std::uint8_t options = in_.u8();
      if (slot.exists) return;
      slot = PoolSlot{};
      slot.device = (arg >> 4) & 1;
      const PoolOptions pool_options{(options & 1) != 0, (options & 2) != 0};
      if (options & 4) {
        // Segments from the program's source: here the simulated device's own calls
        // (what a communication library's allocator does), so the device's books agree.
        std::weak_ptr<SimBackend> sim = sim_;
        auto source = std::make_shared<FunctionSegmentSource>(
            [sim](int d, std::size_t size, StreamHandle, void** ptr) {
              auto s = sim.lock();
              return s ? s->allocate(d, size, ptr) : DeviceStatus::error;
            },
            [sim](int d, void* ptr, std::size_t size, StreamHandle) {
              auto s = sim.lock();
              return s ? s->deallocate(d, ptr, size) : DeviceStatus::error;
            },
            "the walk's segment source");
        slot.id = alloc_->create_pool(std::move(source), pool_options, slot.device);
      } else {
        slot.id = alloc_->create_pool(pool_options, slot.device);
      }
      slot.use_on_oom = (options & 1) != 0;
      slot.exists = true;
      WALK_CHECK(alloc_->pool_use_count(slot.id, slot.device) == 1, "a new pool's use count");
      return;
    }
    case 1:
    case 2: {
      const StreamHandle stream = step == 2 ? in_.u8() % 4 : 0;
      if (!slot.exists || slot.route != 0) return;
      const int uses = alloc_->pool_use_count(slot.id, slot.device);
      if (step == 1) {
        alloc_->begin_allocate_current_thread_to_pool(slot.id, slot.device);
      } else {
        alloc_->begin_capture_to_pool(slot.id, stream, slot.device);  // either policy
      }
      WALK_CHECK(alloc_->pool_use_count(slot.id, slot.device) == uses + 1, "begin adds a use");
      slot.route = step;
      slot.stream = stream;
      slot.order = ++route_order_;
      return;
    }
    case 3:
      if (!slot.exists || slot.route == 0) return;
      alloc_->end_allocate_to_pool(slot.id, slot.device);  // deferred frees record events
      alloc_->release_pool(slot.id, slot.device);
      slot.route = 0;
      return;
    case 4:
      if (!slot.exists || slot.route != 0) return;
      // Half the pools go as torch.cuda.MemPool's destructor lets them (their cache
      // back at once), chosen by id: no input byte, so the corpus keeps its meaning.
      alloc_->release_pool(slot.id, slot.device, (slot.id.second & 1) != 0);
      for (Live& l : live_)
        if (l.pool == index) l.pool = -2;
      slot = PoolSlot{};
      return;
    case 5:
      if (!slot.exists || was_capture) return;  // a capture may leave frees pending
      try {
        slot.checkpoint = alloc_->checkpoint_pool(slot.id, slot.device);
      } catch (const InvalidArgumentError& e) {
        // Never refused once its pending frees are waited for (expandable segments too).
        WALK_CHECK(false, std::string("checkpoint refused: ") + e.what());
        slot.checkpoint.reset();
      }
      in_flight_.clear();  // it waited for the pool's pending frees
      return;
    case 6:
      if (!slot.exists || !slot.checkpoint || was_capture) return;
      return pool_restore(slot, index);
    default: {
      if (!slot.exists) return;
      std::vector<void*> expected;
      std::size_t bytes = 0;
      for (const Live& l : live_)
        if (l.pool == index) {
          expected.push_back(reinterpret_cast<void*>(l.address));
          bytes += l.block;
        }
      WALK_CHECK(alloc_->pool_live_allocations_are(slot.id, expected, slot.device),
                 "the pool's live blocks differ from the walk's");
      // Its blocks lent out of memory (use_on_oom) count as its own too: at least these.
      const PrivatePoolUsage usage = alloc_->pool_usage(slot.id, slot.device);
      WALK_CHECK(usage.allocated_bytes >= bytes && usage.reserved_bytes >= usage.allocated_bytes,
                 "pool_usage disagrees with the pool's live blocks");
      return;
    }
  }
}

void Walker::pool_restore(PoolSlot& slot, int index) {
  PoolRestore r;
  try {
    r = alloc_->restore_pool(*slot.checkpoint);
  } catch (const InvalidArgumentError&) {
    // The pool gave a checkpointed segment back since (out-of-memory release of an
    // oversize block), or pages of its expandable segment (empty_cache): refused,
    // nothing changed.
    return;
  }
  std::vector<std::uintptr_t> freed;
  for (void* p : r.freed) freed.push_back(reinterpret_cast<std::uintptr_t>(p));
  for (std::size_t i = live_.size(); i-- > 0;) {
    if (live_[i].pool != index) continue;
    WALK_CHECK(std::find(freed.begin(), freed.end(), live_[i].address) != freed.end(),
               "a restore kept a live block of the pool allocated");
    shadow_.erase(live_[i].address);
    if (i + 1 != live_.size()) live_[i] = std::move(live_.back());
    live_.pop_back();
  }
  WALK_CHECK(freed.size() == r.freed.size(), "freed list");
  in_flight_.clear();  // the restore waited for the pool's pending frees
  for (void* p : r.allocated) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    StreamHandle stream = 0;
    for (const CheckpointSegment& s : slot.checkpoint->segments)
      if (address >= s.base && address < s.base + s.size) stream = s.stream;
    Live l{
        address, alloc_->requested_size(p), alloc_->block_size(p), slot.device, stream, next_id_++,
        {}};
    l.pool = index;  // a private pool's block (never a compact one)
    check_disjoint(l);
    shadow_.emplace(l.address, l.address + l.block);
    for_pattern(l.requested, [&](std::size_t o) {
      reinterpret_cast<std::uint8_t*>(l.address)[o] = pattern_byte(l.id, o);
    });
    live_.push_back(std::move(l));
  }
}

// ---------------------------------------------------------------- the walk's tag

void Walker::check_tag_state(int device) {
  const TagState t = alloc_->tag_state(kTag, device);
  const auto d = static_cast<std::size_t>(device);
  WALK_CHECK(t.asleep == tag_asleep_[d], "the tag's state is not the walk's");
  std::size_t held = 0;
  for (const Live& l : live_)
    if (l.tagged && l.device == device) held += l.block;
  WALK_CHECK(t.allocated_bytes == held, "the tag's allocated bytes are not its live blocks'");
  if (t.asleep) {
    WALK_CHECK(held_reported_ || t.reserved_bytes == 0, "a sleeping tag keeps memory mapped");
    WALK_CHECK(t.offloaded_bytes == (tag_discarded_[d] ? 0 : t.asleep_bytes),
               "offloaded bytes are not what slept");
  } else {
    WALK_CHECK(t.asleep_bytes == 0, "an awake tag has pages asleep");
    WALK_CHECK(t.offloaded_bytes == 0 || tag_woke_on_stream_[d],
               "an awake tag keeps host copies without a wake on a stream");
  }
}

void Walker::op_tag(std::uint8_t arg) {
  const int device = (arg >> 4) & 1;
  const auto d = static_cast<std::size_t>(device);
  const int step = arg & 7;
  if (trace_)
    std::fprintf(stderr, "  tag step %d on device %d%s\n", step, device,
                 step == 6 && (arg & 8)   ? " (on a stream)"
                 : step == 7 && (arg & 8) ? " (host cache emptied)"
                                          : "");
  // Where the engine keeps no pools, tags are refused up front.
  const bool pools = alloc_->engine_name() == "native";
  if (step < 4) {  // a request under the tag, when no route would take it first
    const std::uint8_t a = in_.u8();
    const std::uint16_t s = in_.u16();
    if (!pools) {
      try {
        TagScope scope(*alloc_, kTag);
        WALK_CHECK(false, "a tag scope opened where the engine keeps no pools");
      } catch (const InvalidArgumentError&) {
      }
      return;
    }
    const bool routed = std::any_of(pools_.begin(), pools_.end(),
                                    [](const PoolSlot& p) { return p.exists && p.route != 0; });
    if (routed) return;
    next_on_thread_ = false;  // the scope is this thread's
    expandable_seen_ = true;  // the tag's pool is expandable segments (reservations),
    pairs_ = false;           // whose page runs need not pair
    tag_request_ = true;
    try {
      request(size_for(a & 7, s), (a >> 3) & 3, device, false);
    } catch (...) {
      tag_request_ = false;
      throw;
    }
    tag_request_ = false;
    return;
  }
  if (!pools) return;
  bool made = false;
  for (const Live& l : live_) made = made || l.tagged;
  if (step == 7) {
    if (arg & 8) {  // the pinned host memory wakes keep for the next offload goes back
      if (trace_)
        std::fprintf(stderr, "  %lld bytes of pinned host memory kept\n",
                     static_cast<long long>(alloc_->stats(device).host_kept_bytes));
      alloc_->empty_host_cache();
      WALK_CHECK(alloc_->stats(device).host_kept_bytes == 0,
                 "empty_host_cache left pinned host memory kept");
    }
    if (made || tag_asleep_[d]) check_tag_state(device);
    return;
  }
  const bool capturing = capture_on();  // a capture on any device refuses sleep and wake
  const std::int64_t syncs_before = alloc_->stats(device).num_sync_all_streams;
  try {
    if (step == 6) {
      const bool on_stream = (arg & 8) != 0;  // the copies back enqueued on stream 1
      if (on_stream)
        alloc_->wake_async(kTag, 1, device);
      else
        alloc_->wake(kTag, device);
      WALK_CHECK(tag_asleep_[d] && !capturing, "wake succeeded where it must be refused");
      tag_asleep_[d] = false;
      tag_woke_on_stream_[d] = on_stream;
      // Offloaded contents are back; discarded ones are the program's to write again.
      for (Live& l : live_) {
        if (!l.tagged || l.device != device) continue;
        if (tag_discarded_[d])
          for_pattern(l.requested, [&](std::size_t o) {
            reinterpret_cast<std::uint8_t*>(l.address)[o] = pattern_byte(l.id, o);
          });
        else
          check_pattern(l);
      }
    } else {
      const bool discard = step == 5;
      alloc_->sleep(kTag, discard ? SleepMode::discard : SleepMode::offload, device);
      WALK_CHECK(!tag_asleep_[d] && !capturing, "sleep succeeded where it must be refused");
      tag_asleep_[d] = true;
      tag_discarded_[d] = discard;
    }
  } catch (const InvalidArgumentError& e) {
    const std::string what = e.what();
    // Never made (a fresh process), asleep already / awake, or a capture under way.
    WALK_CHECK(capturing || (step == 6) != tag_asleep_[d] ||
                   what.find("no memory was ever tagged") != std::string::npos,
               "InvalidArgumentError: " + what);
    return;
  } catch (const OutOfMemoryError& e) {
    WALK_CHECK(step == 6, std::string("OutOfMemoryError from sleep: ") + e.what());
    // Waking needs room: under a cap or a full device it may have none; still asleep,
    // and only once Reservoir's own cache went back to the device.
    WALK_CHECK(alloc_->tag_state(kTag, device).asleep, "a failed wake left the tag awake");
    WALK_CHECK(alloc_->stats(device).num_sync_all_streams > syncs_before,
               "a wake ran out of memory without giving Reservoir's cache back");
    return;
  } catch (const DeviceError& e) {
    WALK_CHECK(device_error_ok_, std::string("DeviceError from sleep or wake: ") + e.what());
    note_device_error(e);
    WALK_CHECK(alloc_->tag_state(kTag, device).asleep == tag_asleep_[d],
               "a failed sleep or wake changed the tag");
    // A failed discard may have dropped what had gone to sleep before the failure (the
    // program asked to drop it): the walk writes its blocks again.
    if (step == 5)
      for (Live& l : live_)
        if (l.tagged && l.device == device)
          for_pattern(l.requested, [&](std::size_t o) {
            reinterpret_cast<std::uint8_t*>(l.address)[o] = pattern_byte(l.id, o);
          });
    return;
  }
  check_tag_state(device);
}

}  // namespace reservoir::fuzz
