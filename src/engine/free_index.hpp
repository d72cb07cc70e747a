// FreeIndex: the free blocks of one pool in best-fit order — smallest size first, ties
// by lowest address (PyTorch's order, so the default stays byte-exact).
//
// A B+tree of keys (size, address): up to kSlots keys per node, each key beside its
// block in the leaves, the leaves in a list. A search reads a few nodes of a few
// cache lines each and never loads a Block, where a red-black tree of a few hundred
// free blocks walks ten nodes and, to compare, the block behind each. Deletion is
// relaxed: a node is removed when it empties, never merged with a sibling (the height
// only grows when a full root splits).
//
// Invariants (problem() checks them; validators call it and holds()):
//   keys strictly increase along the leaf list, and size() == the number of keys;
//   the root is a leaf or an inner node with two children or more;
//   every leaf but a lone root holds at least one key, so every subtree of an inner
//     node with separators holds keys (with one key in all, no separator is above it);
//   in an inner node with separators s[0..n-1] and children c[0..n], every key of
//     c[i] lies in [s[i-1], s[i]) (no bound beyond the ends), parent pointers agree;
//   for every indexed block b: b->state == free, b->free_leaf is the leaf holding it,
//     and its key there == (b->size, b->address) outside of a change that ends in
//     reposition().
// The owner changes a free block's size or address only by then calling reposition()
// (or erase() before and insert() after).
// version() changes with every insert, erase, reposition and clear: a decision drawn
// from the index (StreamPool's fit memo) stands while version() is what it was.
// Not thread-safe: the owner's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>

#include "engine/block.hpp"
#include "util/compiler.hpp"
#include "util/node_pool.hpp"

namespace reservoir::detail {

// The nodes of a FreeIndex (its machinery; FreeLeaf is named by Block::free_leaf).
struct FreeEntry {  // a key beside its block: a hit reads one cache line
  FreeKey key;
  Block* block;
};
struct FreeInner;
struct FreeNode {
  // Keys per node (a leaf is ten cache lines). 24 rather than 14: on the GPU host's
  // Xeon the log-uniform pattern ran 5-9% faster (two interleaved runs, docs/benchmarks.md)
  // for 11% more instructions: longer scans, fewer nodes to reach and to split.
  static constexpr int kSlots = 24;
  FreeInner* parent = nullptr;
  int count = 0;  // keys
  bool leaf = true;
};
struct FreeLeaf : FreeNode {
  FreeLeaf* prev = nullptr;
  FreeLeaf* next = nullptr;
  FreeEntry entries[kSlots];  // each block's free_leaf is this leaf
};
struct FreeInner : FreeNode {
  FreeKey keys[kSlots];            // separators
  FreeNode* children[kSlots + 1];  // count + 1 of them
};

class FreeIndex {
  static constexpr int kSlots = FreeNode::kSlots;
  using Node = FreeNode;
  using Leaf = FreeLeaf;
  using Inner = FreeInner;

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
    Block* operator*() const { return leaf_->entries[slot_].block; }
    iterator& operator++() {
      if (++slot_ == leaf_->count) {
        leaf_ = leaf_->next;
        slot_ = 0;
      }
      return *this;
    }
    iterator operator++(int) {
      iterator old = *this;
      ++*this;
      return old;
    }
    iterator& operator--() {
      if (leaf_ == nullptr) {
        leaf_ = index_->last_;
        slot_ = leaf_->count - 1;
      } else if (slot_-- == 0) {
        leaf_ = leaf_->prev;
        slot_ = leaf_->count - 1;
      }
      return *this;
    }
    iterator operator--(int) {
      iterator old = *this;
      --*this;
      return old;
    }
    bool operator==(const iterator& o) const { return leaf_ == o.leaf_ && slot_ == o.slot_; }
    bool operator!=(const iterator& o) const { return !(*this == o); }
    // The block's size as the index holds it (no Block load).
    std::size_t size() const { return leaf_->entries[slot_].key.size; }
    const FreeKey& key() const { return leaf_->entries[slot_].key; }

   private:
    friend class FreeIndex;
    iterator(const FreeIndex* index, Leaf* leaf, int slot)
        : index_(index), leaf_(leaf), slot_(slot) {}
    const FreeIndex* index_ = nullptr;
    Leaf* leaf_ = nullptr;  // nullptr: end()
    int slot_ = 0;
  };

  FreeIndex();
  ~FreeIndex() { clear(); }
  FreeIndex(const FreeIndex&) = delete;
  FreeIndex& operator=(const FreeIndex&) = delete;

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::uint64_t version() const noexcept { return version_; }
  iterator begin() const { return size_ ? iterator(this, first_, 0) : end(); }
  iterator end() const { return iterator(this, nullptr, 0); }
  void clear();
  // The largest free block (pre: !empty()).
  Block* largest() const { return last_->entries[last_->count - 1].block; }
  // The first block of at least size bytes in best-fit order (end() when none).
  RESERVOIR_INLINE iterator lower_bound(std::size_t size) const {
    if (size_ == 1)  // the one block (in the first leaf) fits or none does
      return first_->entries[0].key.size >= size ? iterator(this, first_, 0) : end();
    // Against the key (size, 0) only sizes decide (no block is at address 0): one
    // 64-bit compare per key instead of two.
    Leaf* leaf = descend_to_size(size);
    int j = 0;
    while (j < leaf->count && leaf->entries[j].key.size < size) ++j;
    if (j == leaf->count) return iterator(this, leaf->next, 0);  // next leaf's first, or end
    return iterator(this, leaf, j);
  }

  // b (free) enters the index under its key (size, address).
  void insert(Block* b);
  // b leaves the index.
  void erase(Block* b);
  // b's size or address changed while in the index: its key is updated in place when
  // the order still holds (the common case of splitting or merging the same block),
  // else it moves.
  RESERVOIR_INLINE void reposition(Block* b) {
    ++version_;
    const FreeKey key{b->size, b->address};
    Leaf* leaf = b->free_leaf;
    if (size_ == 1) {  // b alone, under no separator (see problem())
      leaf->entries[0].key = key;
      return;
    }
    const int j = slot_of(leaf, b);
    // In place while the key stays between its neighbours in the leaf; at the leaf's
    // edge only where no separator bounds it (the first or last leaf).
    const bool down = less(key, leaf->entries[j].key);
    const bool fits =
        down ? (j > 0 ? less(leaf->entries[j - 1].key, key) : leaf == first_)
             : (j + 1 < leaf->count ? less(key, leaf->entries[j + 1].key) : leaf == last_);
    if (RESERVOIR_LIKELY(fits)) {
      leaf->entries[j].key = key;
      return;
    }
    remove_at(leaf, j);
    insert(b);
  }

  // Whether b is indexed under its own key (validators).
  bool holds(const Block* b) const;
  // The first broken invariant of the tree, or "" (validators).
  std::string problem() const;

  static bool less(const FreeKey& a, const FreeKey& b) noexcept {
    // (size, address) as one 128-bit number: a compare and a subtract with borrow, no
    // branch (node scans compare against keys in no predictable order).
    __extension__ typedef unsigned __int128 Wide;
    return ((Wide{a.size} << 64) | a.address) < ((Wide{b.size} << 64) | b.address);
  }

 private:
  // The leaf whose range holds key.
  RESERVOIR_INLINE Leaf* descend(const FreeKey& key) const {
    return descend_while([&key](const FreeKey& separator) { return !less(key, separator); });
  }
  // descend({size, 0}): the leaf holding the first key of at least size bytes.
  RESERVOIR_INLINE Leaf* descend_to_size(std::size_t size) const {
    return descend_while([size](const FreeKey& separator) { return separator.size < size; });
  }
  // Down from the root, past each separator for which right(separator) holds.
  template <typename Right>
  RESERVOIR_INLINE Leaf* descend_while(Right right) const {
    Node* n = root_;
    while (!n->leaf) {
      const Inner* in = static_cast<const Inner*>(n);
      int i = 0;
      while (i < in->count && right(in->keys[i])) ++i;
      n = in->children[i];
    }
    return static_cast<Leaf*>(n);
  }
  // b's slot in leaf (pre: b is there).
  static int slot_of(const Leaf* leaf, const Block* b) {
    int j = 0;
    while (leaf->entries[j].block != b) ++j;
    return j;
  }
  void remove_at(Leaf* leaf, int slot);
  void insert_separator(Node* left, const FreeKey& key, Node* right);
  void remove_child(Inner* parent, Node* child);
  template <typename T>
  T* make();
  void release(Node* n);
  void clear_below(Node* n);
  std::string problem_below(const Node* n, const FreeKey* low, const FreeKey* high,
                            std::size_t* keys, const Leaf** previous) const;

  // Hot fields first (a cache hit reads root_, first_ and size_), the node pool after.
  Node* root_;
  Leaf* first_;
  Leaf* last_;
  std::size_t size_ = 0;
  std::uint64_t version_ = 0;
  NodePool nodes_;
};

}  // namespace reservoir::detail
