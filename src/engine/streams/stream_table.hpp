// StreamTable: stream -> StreamPool for one device, read without a lock (every
// allocation looks its pool up here). Open addressing with linear probing; a slot is
// empty while its pool pointer is null, so every StreamHandle value (0 and
// UINTPTR_MAX included) is a valid key. Writers serialize on the engine's creation
// mutex; a full table is replaced by one twice as large, and the old one is kept
// alive (retired) because readers may still be walking it (at most one per doubling:
// a table never shrinks, so their number stays logarithmic in the most streams ever
// live at once). erase() shifts later entries of the probe run back (no tombstones,
// so a table of released streams stays as short to probe as a fresh one).
// Invariants: capacity is a power of two, size * 2 <= capacity; every live entry is
// reachable from its hash slot without crossing an empty slot; a slot's key is
// written before its pool is published (release).
// Readers racing a writer: keys and pools are atomics, so a reader sees each whole,
// but a slot being moved by erase() may pair one entry's key with another's pool,
// and an entry being moved may be missed. So find() is a hint: the caller confirms
// the pool's stream under the pool's lock and, on a miss or a mismatch, asks again
// under the writers' mutex.
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

  // The pool of stream, or nullptr when there is none (see the class comment: exact
  // under the writers' mutex, a hint without it).
  Pool* find(StreamHandle stream) const noexcept {
    const Table* t = current_.load(std::memory_order_acquire);
    const std::size_t mask = t->capacity - 1;
    std::size_t i = hash(stream) & mask;
    // The home slot first, without the walk's bound (most finds end there).
    Pool* p = t->slots[i].pool.load(std::memory_order_acquire);
    if (!p || t->slots[i].key.load(std::memory_order_relaxed) == stream) return p;
    for (std::size_t n = 1; n < t->capacity; ++n) {
      i = (i + 1) & mask;
      p = t->slots[i].pool.load(std::memory_order_acquire);
      if (!p) return nullptr;
      if (t->slots[i].key.load(std::memory_order_relaxed) == stream) return p;
    }
    return nullptr;  // only while writers move entries: the caller asks again
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
          place(bigger, t->slots[i].key.load(std::memory_order_relaxed), p);
      place(bigger, stream, pool);
      current_.store(bigger, std::memory_order_release);
    } else {
      place(t, stream, pool);
    }
    ++size_;
  }

  // Removes stream's entry (backward-shift deletion); false when it has none. pre:
  // the caller holds the writers' mutex.
  bool erase(StreamHandle stream) {
    Table* t = current_.load(std::memory_order_relaxed);
    const std::size_t mask = t->capacity - 1;
    std::size_t hole = hash(stream) & mask;
    for (;; hole = (hole + 1) & mask) {
      if (!t->slots[hole].pool.load(std::memory_order_relaxed)) return false;
      if (t->slots[hole].key.load(std::memory_order_relaxed) == stream) break;
    }
    // Later entries of the run move back into the hole unless their home slot lies
    // cyclically in (hole, j]: then they are reachable where they are.
    for (std::size_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
      Pool* p = t->slots[j].pool.load(std::memory_order_relaxed);
      if (!p) break;
      const StreamHandle key = t->slots[j].key.load(std::memory_order_relaxed);
      const std::size_t home = hash(key) & mask;
      if (((j - home) & mask) < ((j - hole) & mask)) continue;
      t->slots[hole].key.store(key, std::memory_order_relaxed);
      t->slots[hole].pool.store(p, std::memory_order_release);
      hole = j;
    }
    t->slots[hole].pool.store(nullptr, std::memory_order_release);
    --size_;
    return true;
  }

  // Every entry as (stream, pool). pre: the caller holds the writers' mutex.
  template <typename F>
  void for_each(F&& f) const {
    const Table* t = current_.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < t->capacity; ++i)
      if (Pool* p = t->slots[i].pool.load(std::memory_order_relaxed))
        f(t->slots[i].key.load(std::memory_order_relaxed), p);
  }
  // Under the writers' mutex (tests and the validator).
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept {
    return current_.load(std::memory_order_relaxed)->capacity;
  }
  std::size_t tables() const noexcept { return tables_.size(); }

 private:
  static constexpr std::size_t kInitialCapacity = 64;
  struct Slot {
    std::atomic<StreamHandle> key{0};
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
    t->slots[i].key.store(stream, std::memory_order_relaxed);
    t->slots[i].pool.store(pool, std::memory_order_release);
  }

  std::atomic<Table*> current_{nullptr};
  std::vector<std::unique_ptr<Table>> tables_;  // current and retired
  std::size_t size_ = 0;
};

}  // namespace reservoir::detail
