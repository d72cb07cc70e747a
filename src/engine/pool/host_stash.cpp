#include "engine/pool/host_stash.hpp"

#include <algorithm>
#include <iterator>
#include <new>

namespace reservoir::detail {

HostStash::~HostStash() {
  free_all(kept_);
}

DeviceStatus HostStash::take(std::size_t bytes, void** host) {
  *host = nullptr;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    // The smallest kept buffer that fits, unless it would waste more than it holds.
    auto it = kept_.lower_bound(bytes);
    if (it != kept_.end() && it->first / 2 <= bytes) {
      *host = it->second;
      kept_bytes_ -= it->first;
      in_use_bytes_ += it->first;
      peak_in_use_ = std::max(peak_in_use_, in_use_bytes_);
      kept_.erase(it);
      return DeviceStatus::ok;
    }
  }
  DeviceStatus status = backend_.allocate_host(device_, bytes, host);
  if (status == DeviceStatus::out_of_memory && release() > 0)
    status = backend_.allocate_host(device_, bytes, host);
  if (status != DeviceStatus::ok) {
    *host = nullptr;
    return status;
  }
  std::multimap<std::size_t, void*> surplus;
  bool listed = false;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    try {
      sizes_.emplace(*host, bytes);
      listed = true;
    } catch (const std::bad_alloc&) {  // no host memory for its entry: it goes back below
    }
    if (listed) {
      in_use_bytes_ += bytes;
      peak_in_use_ = std::max(peak_in_use_, in_use_bytes_);
      surplus = trim_locked(peak_in_use_ - in_use_bytes_);
    }
  }
  free_all(surplus);
  if (!listed) {
    (void)backend_.free_host(device_, *host);
    *host = nullptr;
    return DeviceStatus::out_of_memory;
  }
  return DeviceStatus::ok;
}

void HostStash::give(void* host) noexcept {
  if (!host) return;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    const auto it = sizes_.find(host);
    if (it != sizes_.end()) {
      const std::size_t size = it->second;
      in_use_bytes_ -= size;
      try {
        kept_.emplace(size, host);
        kept_bytes_ += size;
        return;
      } catch (const std::bad_alloc&) {
        sizes_.erase(it);  // no host memory to keep it: freed below
      }
    }
  }
  // Not taken from here, or not kept: freed.
  (void)backend_.free_host(device_, host);
}

std::size_t HostStash::release() noexcept {
  std::multimap<std::size_t, void*> all;
  std::size_t bytes = 0;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    bytes = kept_bytes_;
    all = trim_locked(0);
  }
  free_all(all);
  return bytes;
}

std::multimap<std::size_t, void*> HostStash::trim_locked(std::size_t limit) {
  std::multimap<std::size_t, void*> out;
  // The largest go first: the fewest buffers to free for the bytes.
  while (kept_bytes_ > limit) {
    auto last = std::prev(kept_.end());
    kept_bytes_ -= last->first;
    sizes_.erase(last->second);
    out.insert(kept_.extract(last));  // the node moves: no allocation (release is noexcept)
  }
  return out;
}

void HostStash::free_all(const std::multimap<std::size_t, void*>& buffers) noexcept {
  for (const auto& [size, host] : buffers) {
    (void)size;
    (void)backend_.free_host(device_, host);  // nothing to do if it fails
  }
}

std::size_t HostStash::kept_bytes() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return kept_bytes_;
}

std::size_t HostStash::in_use_bytes() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return in_use_bytes_;
}

std::string HostStash::problem() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::size_t kept = 0;
  for (const auto& [size, host] : kept_) {
    kept += size;
    const auto it = sizes_.find(host);
    if (it == sizes_.end() || it->second != size)
      return "a kept pinned host buffer is not listed with its size";
  }
  if (kept != kept_bytes_) return "the pinned host buffers kept do not sum to kept_bytes";
  std::size_t all = 0;
  for (const auto& [host, size] : sizes_) {
    (void)host;
    all += size;
  }
  if (all != kept_bytes_ + in_use_bytes_)
    return "the pinned host buffers listed do not sum to those kept and in use";
  if (kept_bytes_ + in_use_bytes_ > peak_in_use_)
    return "the pinned host buffers kept and in use exceed the most ever in use at once";
  return "";
}

}  // namespace reservoir::detail
