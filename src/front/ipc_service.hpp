// IpcService: Allocator::share / open / close / unshare (docs/ipc.md). The owner's
// side asks the engine what an allocated block is (CachingAllocator::share) and
// exports it — the segment's IPC handle, or the pages' shareable handles — into the
// versioned handle (engine/ipc/ipc_handle.hpp); the receiver's side decodes it and maps
// it through the cache of IpcImports. Blocks shared with keep are held back when the
// program frees them, until unshare.
//
// Invariants (under mutex_): freed_ is a subset of kept_; holding_ is true iff kept_
// is not empty.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

#include "engine/allocators/caching_allocator.hpp"
#include "engine/ipc/ipc_imports.hpp"
#include "reservoir/backend.hpp"
#include "reservoir/ipc.hpp"

namespace reservoir::detail {

class IpcService {
 public:
  IpcService(Backend& backend, CachingAllocator& core);

  SharedHandle share(void* ptr, bool keep);
  void* open(const SharedHandle& handle, int device);
  void close(void* ptr);
  // true when ptr was freed by the program while kept: the caller frees it now.
  bool unshare(void* ptr);
  // A free of ptr: true when it is held back (ptr is kept).
  bool hold_free(void* ptr);
  bool holding() const noexcept { return holding_.load(std::memory_order_acquire); }
  void add_peer(int device, int peer);
  IpcImports& imports() noexcept { return imports_; }
  std::uint64_t id() const noexcept { return id_; }

 private:
  Backend& backend_;
  CachingAllocator& core_;
  const std::uint64_t id_;
  IpcImports imports_;
  std::mutex mutex_;
  std::set<std::uintptr_t> kept_, freed_;
  std::atomic<bool> holding_{false};
  std::vector<std::vector<int>> peers_;  // per device: devices that reach its memory
};

}  // namespace reservoir::detail
