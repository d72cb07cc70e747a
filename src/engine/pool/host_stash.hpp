// HostStash: the pinned host buffers that offloads (sleep, docs/sleep.md) copy pages
// into, kept after a wake for the next offload. Pinning is the slow part of an offload:
// on an H100, pinning 482 MiB took 0.21 s and copying it 0.01 s, so a tag that sleeps
// again, with the same layout, reuses the buffers of its last sleep instead of pinning
// anew. One per device; empty_host_cache() (release()) gives the kept ones back.
//
// A buffer kept is reused by a request of at most its size and at least half of it.
// What the stash holds never exceeds what offloads needed at once:
//   kept_bytes_ == sum of the sizes in kept_; in_use_bytes_ == sum of the sizes of the
//   buffers taken and not yet given back; sizes_ holds exactly those two sets;
//   kept_bytes_ + in_use_bytes_ <= peak_in_use_ (the most ever in use at once), so
//   sleeping and waking with changing sizes does not grow host memory.
// Thread-safe (its own lock; no backend call is made under it).
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "reservoir/backend.hpp"

namespace reservoir::detail {

class HostStash {
 public:
  HostStash(Backend& backend, int device) : backend_(backend), device_(device) {}
  // Frees every buffer it kept (those in use are their takers': given back first).
  ~HostStash();
  HostStash(const HostStash&) = delete;
  HostStash& operator=(const HostStash&) = delete;

  // A pinned buffer of at least bytes in *host: a kept one, else a new one (when the
  // host has no memory for it, the kept buffers go back and it is asked again).
  // Returns the backend's status; *host is null unless ok.
  DeviceStatus take(std::size_t bytes, void** host);
  // A buffer from take() that no copy reads any more: kept for a later take (or freed,
  // past the bound above). Never throws.
  void give(void* host) noexcept;
  // Frees every kept buffer; returns their bytes.
  std::size_t release() noexcept;
  std::size_t kept_bytes() const;
  std::size_t in_use_bytes() const;
  // The invariants above: "" or the first one broken.
  std::string problem() const;

 private:
  // Under mutex_: takes kept buffers out until kept_bytes_ <= limit; returns them.
  std::multimap<std::size_t, void*> trim_locked(std::size_t limit);
  void free_all(const std::multimap<std::size_t, void*>& buffers) noexcept;

  Backend& backend_;
  const int device_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> kept_;        // by size
  std::unordered_map<void*, std::size_t> sizes_;  // every buffer kept or in use
  std::size_t kept_bytes_ = 0, in_use_bytes_ = 0, peak_in_use_ = 0;
};

}  // namespace reservoir::detail
