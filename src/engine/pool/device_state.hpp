// The small pieces of device-wide state that every cache shard of a device shares:
// the memory-fraction budget, the device call counters, the garbage-collection
// clock and the set of peer devices. Each is lock-free or takes its own short lock,
// so a shard can use them while holding only its own lock.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace reservoir::detail {

// Bytes reserved from the device, and the cap a memory fraction puts on them.
// Invariant: with a limit set, reserved() <= limit() + the pages an expandable request
// mapped past the gate (PyTorch's: fits() of the request's allocation size, less than
// a 20 MiB page over; reserve() refuses what would exceed it); every change is made under some
// shard's lock, and while every shard is locked, reserved() == sum of the shards' mapped segment
// bytes + unlocked() (what a shard that dropped its lock for a device call has reserved).
class DeviceBudget {
 public:
  // Takes bytes from the budget; false (nothing taken) when it would exceed the limit.
  bool reserve(std::size_t bytes) noexcept {
    std::size_t before = reserved_.fetch_add(bytes, std::memory_order_relaxed);
    if (limited_.load(std::memory_order_relaxed) &&
        before + bytes > limit_.load(std::memory_order_relaxed)) {
      reserved_.fetch_sub(bytes, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  // Whether bytes more stay within the limit (always, without one): PyTorch's gate
  // before an expandable segment maps pages.
  bool fits(std::size_t bytes) const noexcept {
    return !limited_.load(std::memory_order_relaxed) ||
           reserved_.load(std::memory_order_relaxed) + bytes <=
               limit_.load(std::memory_order_relaxed);
  }
  // Takes bytes whatever the limit: the pages an expandable request maps after fits().
  void reserve_past_limit(std::size_t bytes) noexcept {
    reserved_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void unreserve(std::size_t bytes) noexcept {
    reserved_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  std::size_t reserved() const noexcept { return reserved_.load(std::memory_order_relaxed); }
  // A shard reserved bytes and drops its lock for the device call that backs them
  // (release_lock_on_cudamalloc): counted until it relocks and records its segment.
  void unlocking(std::size_t bytes) noexcept {
    unlocked_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void relocked(std::size_t bytes) noexcept {
    unlocked_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  std::size_t unlocked() const noexcept { return unlocked_.load(std::memory_order_relaxed); }
  void set_limit(std::size_t bytes) noexcept {
    limit_.store(bytes, std::memory_order_relaxed);
    limited_.store(true, std::memory_order_relaxed);
  }
  bool limited() const noexcept { return limited_.load(std::memory_order_relaxed); }
  // The cap in bytes (meaningful when limited()).
  std::size_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> reserved_{0};
  std::atomic<std::size_t> unlocked_{0};
  std::atomic<std::size_t> limit_{~std::size_t{0}};
  std::atomic<bool> limited_{false};
};

// Device-wide event counts reported with the statistics (PyTorch's num_* fields).
struct DeviceCounters {
  std::atomic<std::int64_t> alloc_retries{0}, ooms{0}, sync_all_streams{0}, device_allocs{0},
      device_frees{0}, device_maps{0}, device_unmaps{0}, stream_waits{0};

  static void bump(std::atomic<std::int64_t>& c, std::int64_t by = 1) noexcept {
    c.fetch_add(by, std::memory_order_relaxed);
  }
  void reset() noexcept {
    for (auto* c : {&alloc_retries, &ooms, &sync_all_streams, &device_allocs, &device_frees,
                    &device_maps, &device_unmaps, &stream_waits})
      c->store(0, std::memory_order_relaxed);
  }
};

// Garbage collection (garbage_collection_threshold): a clock that ticks on each
// large-pool lookup while collection is enabled; a free block's age is the ticks
// since it became free.
class GcClock {
 public:
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) noexcept { enabled_.store(on, std::memory_order_relaxed); }
  void tick() noexcept { now_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t now() const noexcept { return now_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> enabled_{false};
  std::atomic<std::uint64_t> now_{0};
};

// Whether a CUDA graph capture may be under way on the device: some routing to a
// private pool begun for a capture (Allocator::begin_allocate_to_pool) has not ended.
// A conservative guess, as the spec's: while it holds, no event is queried or
// recorded for a free, and nothing is returned to the device (a capture forbids
// both: cudaEventQuery and cudaFree are illegal then, and a freed address may be
// baked into the graph). Pools read it only on their cold paths.
class CaptureState {
 public:
  bool underway() const noexcept { return captures_.load(std::memory_order_acquire) > 0; }
  void begin() noexcept { captures_.fetch_add(1, std::memory_order_acq_rel); }
  // True when this was the last capture under way.
  bool end() noexcept { return captures_.fetch_sub(1, std::memory_order_acq_rel) == 1; }

 private:
  std::atomic<int> captures_{0};
};

// Devices granted access to this device's expandable segments (enable_peer_access).
class PeerSet {
 public:
  std::vector<int> list() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return peers_;
  }
  // False when device was already a peer.
  bool add(int device) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (std::find(peers_.begin(), peers_.end(), device) != peers_.end()) return false;
    peers_.push_back(device);
    return true;
  }
  void remove(int device) {
    std::lock_guard<std::mutex> guard(mutex_);
    std::erase(peers_, device);
  }

 private:
  mutable std::mutex mutex_;
  std::vector<int> peers_;
};

}  // namespace reservoir::detail
