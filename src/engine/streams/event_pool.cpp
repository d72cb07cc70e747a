#include "engine/streams/event_pool.hpp"

#include "reservoir/errors.hpp"

namespace reservoir::detail {

EventPool::~EventPool() {
  for (EventHandle e : free_) (void)backend_.destroy_event(device_, e);
}

EventHandle EventPool::acquire() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (!free_.empty()) {
      EventHandle e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  EventHandle e = 0;
  if (backend_.create_event(device_, &e) != DeviceStatus::ok)
    throw DeviceError("reservoir: creating an event on device " + std::to_string(device_) +
                      " failed: " + backend_.last_error());
  return e;
}

void EventPool::release(EventHandle event) noexcept {
  std::lock_guard<std::mutex> guard(mutex_);
  try {
    free_.push_back(event);
  } catch (...) {
    (void)backend_.destroy_event(device_, event);
  }
}

std::size_t EventPool::idle() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return free_.size();
}

}  // namespace reservoir::detail
