// EventPool: the device events used to defer frees of blocks used on other streams
// (record_stream). Events are created on demand, returned after use, and reused;
// the engine never creates one per free. Destroyed with the engine.
// Invariant: every handle in free_ was created by backend_ on device_ and is not
// recorded in any pending queue.
#pragma once

#include <mutex>
#include <vector>

#include "reservoir/backend.hpp"

namespace reservoir::detail {

class EventPool {
 public:
  EventPool(Backend& backend, int device) : backend_(backend), device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // Throws DeviceError when the device cannot create an event.
  EventHandle acquire();
  void release(EventHandle event) noexcept;
  std::size_t idle() const;

 private:
  Backend& backend_;
  int device_;
  mutable std::mutex mutex_;
  std::vector<EventHandle> free_;
};

}  // namespace reservoir::detail
