// The random-walk interpreter: the checks after every step, the queries, the
// bad-input steps, and the guards that skip known findings.
#include <iterator>
#include <limits>

#include "fuzz/walker.hpp"

namespace reservoir::fuzz {

void Walker::check_disjoint(const Live& l) {
  const std::uintptr_t end = l.address + l.block;
  auto next = shadow_.lower_bound(l.address);
  WALK_CHECK(next == shadow_.end() || next->first >= end,
             "new block " + pointer_text(reinterpret_cast<void*>(l.address)) +
                 " overlaps a live block at its end");
  WALK_CHECK(next == shadow_.begin() || std::prev(next)->second <= l.address,
             "new block " + pointer_text(reinterpret_cast<void*>(l.address)) +
                 " starts inside a live block");
  for (const InFlight& f : in_flight_) {
    if (end <= f.lo || l.address >= f.hi) continue;
    // Work the device completed without the walk's advance (it was done at the free,
    // or a wait the walk does not follow completed it) no longer holds the memory.
    bool done = true;
    for (std::size_t k = 0; k < f.waiting.size() && done; ++k)
      done = sim_->completed(f.waiting[k]) >= f.positions[k];
    if (done) continue;
    WALK_CHECK(f.compact,
               "memory freed with pending uses on other streams was handed out "
               "before those streams advanced");
    // policy:compact reuses it at once, the new stream ordered after the old ones.
    for (std::size_t k = 0; k < f.waiting.size(); ++k)
      WALK_CHECK(sim_->ordered_after(l.stream, f.waiting[k], f.positions[k]),
                 "policy:compact handed memory last used on stream " +
                     std::to_string(f.waiting[k]) + " to stream " + std::to_string(l.stream) +
                     " without making it wait for that work");
  }
  for (const auto& [lo, hi] : kept_)
    WALK_CHECK(end <= lo || l.address >= hi,
               "a block whose free failed (kept unused for good) was handed out again");
}

void Walker::check_pattern(const Live& l) {
  // Nothing is mapped under a sleeping tag's blocks.
  if (l.tagged && tag_asleep_[static_cast<std::size_t>(l.device)]) return;
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(l.address);
  for_pattern(l.requested, [&](std::size_t o) {
    WALK_CHECK(
        bytes[o] == pattern_byte(l.id, o),
        "live block " + pointer_text(bytes) + " was overwritten at offset " + std::to_string(o));
  });
}

std::array<double, kDevices> Walker::fractions() {
  std::array<double, kDevices> out;
  for (int d = 0; d < kDevices; ++d) out[d] = alloc_->memory_fraction(d);
  return out;
}

void Walker::op_query() {
  const std::uint8_t index = in_.u8();
  const int d = index & 1;
  const DeviceStats s = alloc_->stats(d);
  WALK_CHECK(
      alloc_->largest_cached_block(d) <= static_cast<std::size_t>(s.reserved_bytes.all().current),
      "largest cached block exceeds reserved memory");
  const double f = alloc_->memory_fraction(d);
  // Relative to the device total, which only the simulator's set_capacity changes.
  WALK_CHECK(f >= 0.0 && (f <= 1.0 || capacity_changed_), "memory fraction " + std::to_string(f));
  if (index & 2) WALK_CHECK(!alloc_->summary(d).empty(), "empty summary");
  if (live_.empty()) return;
  const Live& l = live_[(index >> 2) % live_.size()];
  void* p = reinterpret_cast<void*>(l.address);
  try {
    const BaseAllocation base = alloc_->base_allocation(p);
    const auto lo = reinterpret_cast<std::uintptr_t>(base.base);
    WALK_CHECK(lo <= l.address && l.address + l.block <= lo + base.size,
               "base_allocation does not hold the block");
  } catch (const InvalidArgumentError& e) {
    // Documented: an expandable segment has no single base allocation.
    WALK_CHECK(expandable_seen_ && std::string(e.what()).find("expandable") != std::string::npos,
               e.what());
  }
  WALK_CHECK(alloc_->block_size(p) == l.block && alloc_->requested_size(p) == l.requested,
             "block sizes changed while allocated");
  check_pattern(l);
}

// A pointer that is not the start of a live block, or 0 when none fits.
std::uintptr_t Walker::bad_pointer(std::uint8_t kind, std::uint8_t arg, const void* stack) {
  std::uintptr_t p = 0;
  switch (kind % 4) {
    case 0:
      p = freed_[arg % freed_.size()];
      break;  // freed (maybe reused since)
    case 1:
      if (!live_.empty()) {
        const Live& l = live_[arg % live_.size()];
        p = l.address + 1 + (std::size_t{arg} * 4099) % (l.block - 1);  // interior
      }
      break;
    case 2:
      p = reinterpret_cast<std::uintptr_t>(stack);
      break;
    default: {
      const std::uintptr_t foreign[] = {0x1000, 0x7f0000000000, ~std::uintptr_t{0}, heap_probe_};
      p = foreign[arg % 4];
    }
  }
  return shadow_.count(p) ? 0 : p;
}

void Walker::op_bad_input() {
  const std::uint8_t kind = in_.u8();
  const std::uint8_t arg = in_.u8();
  int stack_probe = 0;
  const std::vector<std::int64_t> before = snapshot();
  const std::string config = alloc_->config().to_string();
  const int action = (kind >> 2) % 6;
  const std::uintptr_t p = action < 3 ? bad_pointer(kind, arg, &stack_probe) : 1;
  if (p == 0) return;
  void* ptr = reinterpret_cast<void*>(p);
  const std::string name = pointer_text(ptr);
  auto expect_refusal = [&](auto&& call, auto tag, const std::string& named) {
    using Error = decltype(tag);
    try {
      call();
    } catch (const Error& e) {
      WALK_CHECK(std::string(e.what()).find(named) != std::string::npos,
                 std::string("message does not name ") + named + ": " + e.what());
      WALK_CHECK(snapshot() == before, "a refused call changed the statistics");
      WALK_CHECK(alloc_->config().to_string() == config, "a refused call changed the config");
      return;
    }
    throw Finding("a bad input was accepted: action " + std::to_string(action) + ", " + named);
  };
  switch (action) {
    case 0:
      return expect_refusal([&] { alloc_->deallocate(ptr); }, InvalidPointerError(""), name);
    case 1:
      return expect_refusal([&] { alloc_->record_stream(ptr, arg % 4); }, InvalidPointerError(""),
                            name);
    case 2:
      return expect_refusal([&] { (void)alloc_->block_size(ptr); }, InvalidPointerError(""), name);
    case 3: {
      static constexpr int kDevicesBad[] = {2, 7, 1000, std::numeric_limits<int>::max()};
      const int d = kDevicesBad[arg % 4];
      return expect_refusal([&] { (void)alloc_->allocate(512, 0, d); }, InvalidArgumentError(""),
                            "device " + std::to_string(d));
    }
    case 4: {
      static constexpr double kFractions[] = {-0.5, 1.5, std::numeric_limits<double>::infinity(),
                                              std::numeric_limits<double>::quiet_NaN()};
      return expect_refusal([&] { alloc_->set_memory_fraction(kFractions[arg % 4], arg >> 7); },
                            InvalidArgumentError(""), "fraction");
    }
    default:
      alloc_->deallocate(nullptr);  // documented no-ops
      alloc_->record_stream(nullptr, 1);
      WALK_CHECK(snapshot() == before, "a null pointer changed the statistics");
  }
}

std::vector<std::int64_t> Walker::snapshot() {
  std::vector<std::int64_t> out;
  for (int d = 0; d < kDevices; ++d) {
    const DeviceStats s = alloc_->stats(d);
    for (const StatArray* a :
         {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
          &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes})
      for (const Stat& st : a->pool)
        out.insert(out.end(), {st.current, st.peak, st.allocated, st.freed});
    out.insert(out.end(), {s.num_ooms, s.num_device_alloc, s.num_device_free});
  }
  return out;
}

Walker::AllStats Walker::stats_all() {
  std::array<DeviceStats, kDevices> out;
  for (int d = 0; d < kDevices; ++d) out[d] = alloc_->stats(d);
  return out;
}

void Walker::on_trace(const TraceEntry& e) {
  std::lock_guard<std::mutex> guard(registry_mutex_);
  const std::pair<int, std::uintptr_t> key{e.device, e.address};
  if (e.action == TraceAction::segment_alloc || e.action == TraceAction::segment_map) {
    registered_[key] = e.size;
  } else if (e.action == TraceAction::segment_free || e.action == TraceAction::segment_unmap) {
    auto it = registered_.find(key);
    if (it == registered_.end() || it->second != e.size) {
      unregistered_.push_back(std::string(to_string(e.action)) + " of " + std::to_string(e.size) +
                              " bytes at " + pointer_text(reinterpret_cast<void*>(e.address)) +
                              " on device " + std::to_string(e.device) + ", never registered");
    } else {
      registered_.erase(it);
    }
  }
}

void Walker::check_registered() {
  pairs_ = pairs_ && !alloc_->config().expandable_segments;
  if (!pairs_) return;
  // Listed before the registry is locked: listing makes a trace entry of its own.
  std::array<std::vector<SegmentInfo>, kDevices> listed;
  for (int d = 0; d < kDevices; ++d) listed[d] = alloc_->segments(d);
  std::lock_guard<std::mutex> guard(registry_mutex_);
  WALK_CHECK(unregistered_.empty(), unregistered_.front());
  for (int d = 0; d < kDevices; ++d)
    for (const SegmentInfo& s : listed[d]) {
      std::uintptr_t at = s.address;
      const std::uintptr_t hi = s.address + s.total_size;
      while (at < hi) {
        auto it = registered_.upper_bound({d, at});
        WALK_CHECK(it != registered_.begin(), "a segment listed was never registered");
        --it;
        WALK_CHECK(it->first.first == d && it->first.second + it->second > at,
                   "segment " + pointer_text(reinterpret_cast<void*>(s.address)) + " of " +
                       std::to_string(s.total_size) + " bytes on device " + std::to_string(d) +
                       " was never registered");
        at = it->first.second + it->second;
      }
    }
}

void Walker::check_books() {
  alloc_->validate();
  expandable_seen_ |= alloc_->config().expandable_segments || compact_;
  const AllStats all = stats_all();
  for (int d = 0; d < kDevices; ++d) {
    const DeviceStats& s = all[d];
    const std::string dev = "device " + std::to_string(d) + ": ";
    std::int64_t bytes = 0, count = 0;
    for (const Live& l : live_)
      if (l.device == d) bytes += static_cast<std::int64_t>(l.block), ++count;
    WALK_CHECK(s.allocated_bytes.all().current == bytes,
               dev + "allocated_bytes " + std::to_string(s.allocated_bytes.all().current) +
                   " but live blocks add up to " + std::to_string(bytes));
    WALK_CHECK(s.allocation.all().current == count, dev + "allocation count differs");
    WALK_CHECK(static_cast<std::size_t>(s.reserved_bytes.all().current) == sim_->used(d),
               dev + "reserved_bytes " + std::to_string(s.reserved_bytes.all().current) +
                   " but the device has " + std::to_string(sim_->used(d)) + " bytes in use");
    // Expandable segments are reservations, not device allocations.
    if (!expandable_seen_)
      WALK_CHECK(static_cast<std::size_t>(s.segment.all().current) == sim_->live_segments(d),
                 dev + "segment count differs from the device's");
    WALK_CHECK(s.active_bytes.all().current >= s.allocated_bytes.all().current,
               dev + "active bytes below allocated bytes");
    for (const Stat* st : {&s.oversize_allocations, &s.oversize_segments,
                           &s.inactive_split_bytes.all(), &s.requested_bytes.all()})
      WALK_CHECK(st->current >= 0 && st->peak >= st->current,
                 dev + "a statistic is negative or above its peak: current " +
                     std::to_string(st->current) + ", peak " + std::to_string(st->peak));
  }
  note_synchronizations(all);
  check_capture();
  check_registered();
  check_in_flight_mapped();
}

// Memory whose last users have not completed must stay where they use it: a page of
// it unmapped (its memory moved elsewhere) would fault them.
void Walker::check_in_flight_mapped() {
  for (const InFlight& f : in_flight_) {
    if (!f.compact) continue;
    // Pages are the simulated device's granularity (2 MiB); access() takes their start.
    for (std::uintptr_t a = f.lo & ~(2 * kMiB - 1); a < f.hi; a += 2 * kMiB)
      WALK_CHECK(!sim_->access(reinterpret_cast<void*>(a)).empty(),
                 "policy:compact unmapped " + pointer_text(reinterpret_cast<void*>(a)) +
                     " while work that used it had not completed");
  }
}

// The ladder's last rung and empty_cache wait for every pending free: after one,
// no block is in flight any more.
void Walker::note_synchronizations(const AllStats& all) {
  std::int64_t syncs = 0;
  for (const DeviceStats& s : all) syncs += s.num_sync_all_streams;
  if (syncs != syncs_) in_flight_.clear();
  syncs_ = syncs;
}

}  // namespace reservoir::fuzz
