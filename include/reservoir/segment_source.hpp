// SegmentSource: where a private pool's segments come from instead of the device
// (PyTorch's MemPool(allocator=...)): memory a communication library registers
// (ncclMemAlloc), memory the program maps itself (cuMem calls, to release and map it
// again: sleep / wake), managed or host-mapped memory. The pool still splits its
// segments into blocks and caches them by the same rules, counts them in the
// statistics and the memory fraction; only a segment's own allocation and release go
// through the source (docs/pools.md).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "reservoir/backend.hpp"

namespace reservoir {

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // size bytes on device for a request on stream (the pool's stream). ok: *ptr set,
  //   512-byte aligned, overlapping no live range of the program's allocators;
  // out_of_memory: none now (the pool's out-of-memory ladder goes on); anything
  //   else: the request fails with DeviceError naming last_error().
  // Called with no lock of the allocator held only under release_lock_on_cudamalloc;
  // it must not call the allocator.
  virtual DeviceStatus allocate(int device, std::size_t size, StreamHandle stream,
                                void** ptr) = 0;
  // Gives back a segment that allocate gave (ptr, size): called once no block of it is
  // allocated and the work submitted to its stream has completed (the allocator waits
  // for that stream first: a source may unmap at once).
  virtual DeviceStatus deallocate(int device, void* ptr, std::size_t size,
                                  StreamHandle stream) = 0;
  // Why the last call failed, for error messages.
  virtual std::string last_error() const { return "the segment source refused"; }
};

// A source of two functions (the C and Python APIs' shape). Each returns a
// DeviceStatus; alloc sets *ptr.
class FunctionSegmentSource final : public SegmentSource {
 public:
  using AllocFn = std::function<DeviceStatus(int device, std::size_t size, StreamHandle stream,
                                             void** ptr)>;
  using FreeFn = std::function<DeviceStatus(int device, void* ptr, std::size_t size,
                                            StreamHandle stream)>;
  FunctionSegmentSource(AllocFn alloc, FreeFn free, std::string name = "segment source")
      : alloc_(std::move(alloc)), free_(std::move(free)), name_(std::move(name)) {}
  DeviceStatus allocate(int device, std::size_t size, StreamHandle stream, void** ptr) override {
    return alloc_(device, size, stream, ptr);
  }
  DeviceStatus deallocate(int device, void* ptr, std::size_t size, StreamHandle stream) override {
    return free_(device, ptr, size, stream);
  }
  std::string last_error() const override { return name_ + " refused"; }

 private:
  AllocFn alloc_;
  FreeFn free_;
  std::string name_;
};

}  // namespace reservoir
