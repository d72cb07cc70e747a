// AddressMap<T>: address -> T* hash map for the allocated blocks of one stream pool.
// Open addressing with linear probing and backward-shift deletion (no tombstones),
// so lookups stay short however many allocations come and go.
//
// Invariants: capacity == mask_ + 1 == 2^(64 - shift_) is a power of two;
// table_size_ <= capacity / 4, i.e. table_size_ < grow_at_ == capacity / 4 + 1 before an insert
// (at most a quarter full, so an erase's backward shift walks short runs: with 512 live
// blocks, a log-uniform step costs 1,009 instructions instead of 1,057 at 3/4); key 0
// marks an empty slot (device addresses are never 0); every key sits in the probe run
// that starts at its home slot (home(k) .. its slot holds no empty slot).
// The most recent insert waits in a front slot (front_key_, front_value_) and enters
// the table only at the next insert: a free of the block allocated last, the commonest
// free of all (a temporary), costs one compare and no probe. Invariants: front_key_ ==
// 0 or it is a key in no table slot; size() == table_size_ + (front_key_ != 0).
// insert and erase are the allocation hot path: inline, the mask kept as a member
// (no size computation from a vector), growth out of line.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "util/compiler.hpp"

namespace reservoir::detail {

template <typename T>
class AddressMap {
 public:
  AddressMap() : slots_(new Slot[kInitialCapacity]()) {}
  AddressMap(const AddressMap&) = delete;
  AddressMap& operator=(const AddressMap&) = delete;
  std::size_t size() const { return table_size_ + (front_key_ != 0 ? 1 : 0); }
  std::size_t capacity() const { return mask_ + 1; }

  T* find(std::uintptr_t key) const {
    if (key == front_key_) return front_value_;  // nullptr for key 0 (never a key)
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == 0) return nullptr;
    }
  }
  // pre: key != 0 and key not present.
  RESERVOIR_INLINE void insert(std::uintptr_t key, T* value) {
    if (front_key_ != 0) table_insert(front_key_, front_value_);
    front_key_ = key;
    front_value_ = value;
  }
  // Removes key; returns its value or nullptr when absent.
  RESERVOIR_INLINE T* erase(std::uintptr_t key) {
    if (key == front_key_) {
      T* value = front_value_;
      front_key_ = 0;
      front_value_ = nullptr;
      return value;
    }
    return table_erase(key);
  }
  template <typename F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i <= mask_; ++i)
      if (slots_[i].key != 0) f(slots_[i].key, slots_[i].value);
    if (front_key_ != 0) f(front_key_, front_value_);
  }

 private:
  static constexpr std::size_t kInitialCapacity = 16;
  struct Slot {
    std::uintptr_t key = 0;
    T* value = nullptr;
  };
  RESERVOIR_INLINE void table_insert(std::uintptr_t key, T* value) {
    if (RESERVOIR_UNLIKELY(table_size_ + 1 >= grow_at_)) grow();
    place(key, value);
    ++table_size_;
  }
  RESERVOIR_INLINE T* table_erase(std::uintptr_t key) {
    const std::size_t mask = mask_;
    Slot* const slots = slots_.get();
    std::size_t i = home(key);
    while (slots[i].key != key) {
      if (slots[i].key == 0) return nullptr;
      i = (i + 1) & mask;
    }
    T* value = slots[i].value;
    // Backward shift: pull later members of the run into the hole when their home
    // slot does not lie cyclically in (hole, j].
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask; slots[j].key != 0; j = (j + 1) & mask) {
      std::size_t h = home(slots[j].key);
      bool movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
      if (movable) {
        slots[hole] = slots[j];
        hole = j;
      }
    }
    slots[hole] = Slot{};
    --table_size_;
    return value;
  }
  std::size_t home(std::uintptr_t key) const {
    // Blocks are 512-byte aligned: drop the zero bits, then mix (Fibonacci hashing:
    // the product's top bits).
    std::uint64_t h = static_cast<std::uint64_t>(key >> 9) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h >> shift_);
  }
  void place(std::uintptr_t key, T* value) {
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = Slot{key, value};
  }
  RESERVOIR_COLD void grow() {
    const std::size_t old_capacity = mask_ + 1;
    std::unique_ptr<Slot[]> old(new Slot[old_capacity * 2]());
    old.swap(slots_);
    mask_ = old_capacity * 2 - 1;
    grow_at_ = (mask_ + 1) / 4 + 1;
    --shift_;
    for (std::size_t i = 0; i < old_capacity; ++i)
      if (old[i].key != 0) place(old[i].key, old[i].value);
  }

  std::unique_ptr<Slot[]> slots_;
  std::size_t mask_ = kInitialCapacity - 1;
  std::size_t grow_at_ = kInitialCapacity / 4 + 1;
  int shift_ = 64 - std::bit_width(kInitialCapacity - 1);  // home() takes the top bits
  std::size_t table_size_ = 0;  // keys in the table (the front slot's not counted)
  std::uintptr_t front_key_ = 0;
  T* front_value_ = nullptr;
};

}  // namespace reservoir::detail
