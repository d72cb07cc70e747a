// StreamTable: stream -> StreamPool for one device, read without a lock (every
// allocation looks its pool up here). Open addressing with linear probing; a slot is
// empty while its pool pointer is null, so every StreamHandle value (0 and
// UINTPTR_MAX included) is a valid key. Writers serialize on the engine's creation
// mutex; a full table is replaced by one twice as large, and the old one is kept
// alive (retired) because readers may still be walking it.
// Invariants: capacity is a power of two, size * 2 <= capacity; a slot's key is
// written before its pool is published (release), and never changes afterwards.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "reservoir/types.hpp"

namespace reservoir::detail {

template <typename Pool>
class StreamTable {
 public:
  StreamTable() {
    tables_.push_back(std::make_unique<Table>(kInitialCapacity));
    current_ = tables_.back().get();
  }

  // The pool of stream, or nullptr when there is none yet.
  Pool* find(StreamHandle stream) const noexcept {
    const Table* t = current_.load(std::memory_order_acquire);
    const std::size_t mask = t->capacity - 1;
    for (std::size_t i = hash(stream) & mask;; i = (i + 1) & mask) {
      Pool* p = t->slots[i].pool.load(std::memory_order_acquire);
      if (!p) return nullptr;
      if (t->slots[i].key == stream) return p;
    }
  }

  // Adds pool under stream. pre: the caller holds the writers' mutex and stream has
  // no pool yet.
  void insert(StreamHandle stream, Pool* pool) {
    Table* t = current_.load(std::memory_order_relaxed);
    if ((size_ + 1) * 2 > t->capacity) {
      tables_.push_back(std::make_unique<Table>(t->capacity * 2));
      Table* bigger = tables_.back().get();
      for (std::size_t i = 0; i < t->capacity; ++i)
        if (Pool* p = t->slots[i].pool.load(std::memory_order_relaxed))
          place(bigger, t->slots[i].key, p);
      place(bigger, stream, pool);
      current_.store(bigger, std::memory_order_release);
    } else {
      place(t, stream, pool);
    }
    ++size_;
  }

 private:
  static constexpr std::size_t kInitialCapacity = 64;
  struct Slot {
    StreamHandle key = 0;
    std::atomic<Pool*> pool{nullptr};
  };
  struct Table {
    explicit Table(std::size_t n) : capacity(n), slots(new Slot[n]) {}
    std::size_t capacity;
    std::unique_ptr<Slot[]> slots;
  };
  static std::size_t hash(StreamHandle s) noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(s) * 0x9E3779B97F4A7C15ull) >> 40);
  }
  static void place(Table* t, StreamHandle stream, Pool* pool) {
    const std::size_t mask = t->capacity - 1;
    std::size_t i = hash(stream) & mask;
    while (t->slots[i].pool.load(std::memory_order_relaxed)) i = (i + 1) & mask;
    t->slots[i].key = stream;
    t->slots[i].pool.store(pool, std::memory_order_release);
  }

  std::atomic<Table*> current_{nullptr};
  std::vector<std::unique_ptr<Table>> tables_;  // current and retired
  std::size_t size_ = 0;
};

}  // namespace reservoir::detail
