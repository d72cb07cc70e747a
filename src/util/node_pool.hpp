// NodePool: a free list of fixed-size chunks, and PoolAllocator, an allocator that
// serves single-object allocations (std::set nodes, Blocks) from it, so the
// allocation hot path never calls malloc. Not thread-safe: each stream pool owns
// its own and uses it under its lock. Chunks are returned to the system only when
// the NodePool is destroyed. A pool whose chunks different threads write at once (each
// its own) asks for chunks aligned to a cache line, so that no two share one.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "util/compiler.hpp"

namespace reservoir::detail {

class NodePool {
 public:
  // per_slab: chunks fetched from the system at a time; align: each chunk's alignment
  // (a power of two; its stride is a multiple of it).
  explicit NodePool(std::size_t chunk_size, std::size_t per_slab = 256,
                    std::size_t align = alignof(std::max_align_t))
      : chunk_size_(chunk_size < sizeof(void*) ? sizeof(void*) : chunk_size),
        per_slab_(per_slab == 0 ? 1 : per_slab),
        align_(align < alignof(std::max_align_t) ? alignof(std::max_align_t) : align) {}
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;
  ~NodePool() {
    for (void* slab : slabs_) ::operator delete(slab, std::align_val_t(align_));
  }

  // Inline: every split takes a Block from here; refilling is out of line.
  RESERVOIR_INLINE void* get() {
    if (RESERVOIR_UNLIKELY(free_ == nullptr)) refill();
    void* chunk = free_;
    free_ = *static_cast<void**>(free_);
    return chunk;
  }
  void put(void* chunk) noexcept {
    *static_cast<void**>(chunk) = free_;
    free_ = chunk;
  }
  std::size_t chunk_size() const { return chunk_size_; }

 private:
  RESERVOIR_COLD void refill() {
    const std::size_t stride = (chunk_size_ + align_ - 1) & ~(align_ - 1);
    char* slab = static_cast<char*>(::operator new(stride* per_slab_, std::align_val_t(align_)));
    slabs_.push_back(slab);
    for (std::size_t i = per_slab_; i-- > 0;) put(slab + i * stride);
  }

  std::size_t chunk_size_;
  std::size_t per_slab_;
  std::size_t align_;
  void* free_ = nullptr;
  std::vector<void*> slabs_;
};

template <typename T>
class PoolAllocator {
 public:
  using value_type = T;
  explicit PoolAllocator(NodePool* pool) noexcept : pool_(pool) {}
  template <typename U>
  PoolAllocator(const PoolAllocator<U>& other) noexcept : pool_(other.pool()) {}

  T* allocate(std::size_t n) {
    if (n != 1 || sizeof(T) > pool_->chunk_size())
      return static_cast<T*>(::operator new(n * sizeof(T)));
    return static_cast<T*>(pool_->get());
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n != 1 || sizeof(T) > pool_->chunk_size()) {
      ::operator delete(p);
      return;
    }
    pool_->put(p);
  }
  NodePool* pool() const noexcept { return pool_; }
  template <typename U>
  bool operator==(const PoolAllocator<U>& o) const noexcept {
    return pool_ == o.pool();
  }

 private:
  NodePool* pool_;
};

}  // namespace reservoir::detail
