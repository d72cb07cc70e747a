// AddressMap<T>: address -> T* hash map for the allocated blocks of one stream pool.
// Open addressing with linear probing and backward-shift deletion (no tombstones),
// so lookups stay short however many allocations come and go.
//
// Invariants: capacity is a power of two; size <= capacity * 3/4; key 0 marks an
// empty slot (device addresses are never 0); every key sits in the probe run that
// starts at its home slot (home(k) .. its slot holds no empty slot).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace reservoir::detail {

template <typename T>
class AddressMap {
 public:
  AddressMap() : slots_(16) {}

  std::size_t size() const { return size_; }

  T* find(std::uintptr_t key) const {
    std::size_t mask = slots_.size() - 1;
    for (std::size_t i = home(key);; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == 0) return nullptr;
    }
  }

  // pre: key != 0 and key not present.
  void insert(std::uintptr_t key, T* value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    place(key, value);
    ++size_;
  }

  // Removes key; returns its value or nullptr when absent.
  T* erase(std::uintptr_t key) {
    std::size_t mask = slots_.size() - 1;
    std::size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return nullptr;
      i = (i + 1) & mask;
    }
    T* value = slots_[i].value;
    // Backward shift: pull later members of the run into the hole when their home
    // slot does not lie cyclically in (hole, j].
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask; slots_[j].key != 0; j = (j + 1) & mask) {
      std::size_t h = home(slots_[j].key);
      bool movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    return value;
  }

  template <typename F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.key != 0) f(s.key, s.value);
  }

 private:
  struct Slot {
    std::uintptr_t key = 0;
    T* value = nullptr;
  };

  std::size_t home(std::uintptr_t key) const {
    // Blocks are 512-byte aligned: drop the zero bits, then mix (Fibonacci hashing).
    std::uint64_t h = static_cast<std::uint64_t>(key >> 9) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h >> 32) & (slots_.size() - 1);
  }

  void place(std::uintptr_t key, T* value) {
    std::size_t mask = slots_.size() - 1;
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask;
    slots_[i] = Slot{key, value};
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old)
      if (s.key != 0) place(s.key, s.value);
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace reservoir::detail
