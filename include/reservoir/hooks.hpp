// Hooks and small result types shared by the engine and the C++ API: the
// vocabulary below the engine (util layer), so the engine never includes the
// front's allocator.hpp.
#pragma once

#include <cstddef>
#include <functional>

namespace reservoir {

// Called once the out-of-memory ladder has failed, before OutOfMemoryError is
// thrown: (device, bytes asked of the device, bytes allowed, bytes free).
using OomObserver =
    std::function<void(int device, std::size_t alloc_size, std::size_t allowed, std::size_t free)>;
// Called on a cache miss before asking the device: free what you can (e.g. drop
// other caches); return true if anything was freed.
using FreeMemoryCallback = std::function<bool()>;

struct BaseAllocation {
  void* base = nullptr;  // start of the segment holding the pointer
  std::size_t size = 0;  // size of that segment
};

}  // namespace reservoir
