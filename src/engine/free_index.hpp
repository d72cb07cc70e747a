// FreeIndex: the free blocks of one pool in best-fit order — smallest size first, ties
// by lowest address (PyTorch's order, so the default stays byte-exact).
//
// Each entry keeps a copy of its block's key (size, address) beside the pointer, so a
// search compares tree nodes only and never loads a Block: one dependent load per
// level of the tree instead of two, which is most of the cost of a best-fit search
// once the pool holds a few hundred free blocks.
//
// Invariants (checked by holds(), which validators call):
//   for every entry e: e.size == e.block->size, e.address == e.block->address,
//     e.block->state == free and e.block->free_at designates e;
//   entries are ordered by (size, address), no two equal.
// The owner changes a free block's size or address only by then calling reposition()
// (or erase() before and insert() after), so the copies never go stale between calls.
// Not thread-safe: the owner's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

#include "engine/block.hpp"
#include "util/compiler.hpp"

namespace reservoir::detail {

class FreeIndex {
 public:
  // Walks the free blocks in best-fit order; dereferences to the Block.
  class iterator {
   public:
    using iterator_category = std::bidirectional_iterator_tag;
    using value_type = Block*;
    using difference_type = std::ptrdiff_t;
    using pointer = Block* const*;
    using reference = Block*;
    iterator() = default;
    explicit iterator(FreeSet::const_iterator it) : it_(it) {}
    Block* operator*() const { return it_->block; }
    iterator& operator++() {
      ++it_;
      return *this;
    }
    iterator operator++(int) {
      iterator old = *this;
      ++it_;
      return old;
    }
    iterator& operator--() {
      --it_;
      return *this;
    }
    iterator operator--(int) {
      iterator old = *this;
      --it_;
      return old;
    }
    bool operator==(const iterator& o) const { return it_ == o.it_; }
    bool operator!=(const iterator& o) const { return it_ != o.it_; }
    // The block's size and address as the index holds them (no Block load).
    std::size_t size() const { return it_->size; }
    std::uintptr_t address() const { return it_->address; }

   private:
    FreeSet::const_iterator it_;
  };

  explicit FreeIndex(NodePool* nodes)
      : set_(BySizeThenAddress{}, PoolAllocator<FreeEntry>(nodes)) {}

  std::size_t size() const noexcept { return set_.size(); }
  bool empty() const noexcept { return set_.empty(); }
  iterator begin() const { return iterator(set_.begin()); }
  iterator end() const { return iterator(set_.end()); }
  void clear() { set_.clear(); }
  // The largest free block (pre: !empty()).
  Block* largest() const { return std::prev(set_.end())->block; }
  // The first block of at least size bytes in best-fit order (end() when none).
  RESERVOIR_INLINE iterator lower_bound(std::size_t size) const {
    return iterator(set_.lower_bound(SizeKey{size}));
  }

  // b (free) enters the index.
  void insert(Block* b) { b->free_at = set_.insert(FreeEntry{b->size, b->address, b}).first; }
  // b leaves the index.
  void erase(Block* b) { set_.erase(b->free_at); }
  // b's size or address changed while in the index: keeps its entry when the order
  // still holds (the common case of splitting or merging the same block), else moves
  // it.
  RESERVOIR_INLINE void reposition(Block* b) {
    const FreeEntry& e = *b->free_at;
    if (set_.size() == 1 || in_order(b)) {
      e.size = b->size;
      e.address = b->address;
      return;
    }
    move(b);
  }

  // Whether b is indexed as the invariants say (validators).
  bool holds(const Block* b) const {
    const FreeEntry& e = *b->free_at;
    if (e.block != b || e.size != b->size || e.address != b->address) return false;
    auto it = set_.find(e);
    return it != set_.end() && it == b->free_at;
  }

 private:
  // Whether b's new key still lies between its neighbours' keys.
  bool in_order(const Block* b) const {
    const FreeEntry key{b->size, b->address, nullptr};
    BySizeThenAddress less;
    auto it = b->free_at;
    return (it == set_.begin() || less(*std::prev(it), key)) &&
           (std::next(it) == set_.end() || less(key, *std::next(it)));
  }
  void move(Block* b) {
    set_.erase(b->free_at);
    insert(b);
  }

  FreeSet set_;
};

}  // namespace reservoir::detail
