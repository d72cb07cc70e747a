// FreeIndex: the free blocks of one pool in best-fit order — smallest size first, ties
// by lowest address (PyTorch's order, so the default stays byte-exact).
//
// Bins of sizes, each a B+tree. A size maps to one of kBins bins, monotonically
// (bin_of: 512-byte steps below 16 KiB, then 16 bins per power of two), so the bins
// in turn hold the keys in order. A nonempty bin is a B+tree of keys (size, address):
// up to kSlots keys per node, each key beside its block in the leaves. The leaves of
// all bins form one list, in key order, which the iterator walks; a bitmap of the
// nonempty bins finds the next one. Most bins hold a few keys in one leaf, so an
// insert, an erase or a search reads one small leaf and no Block (a single tree over
// all keys descends two or three levels and shifts a dozen keys in its leaf), while a
// bin of many equal sizes is still a tree of logarithmic depth. Deletion is relaxed:
// a node is removed when it empties, never merged with a sibling, and a bin whose
// last key leaves holds no node.
//
// Invariants (problem() checks them; validators call it and holds()):
//   keys strictly increase along the leaf list, and size() == the number of keys;
//   first_ and last_ are the list's ends (nullptr when empty);
//   roots_[i] != nullptr  <=>  bit i of nonempty_ is set  <=>  bin i holds keys, and
//     bit w of nonempty_words_ is set  <=>  nonempty_[w] != 0;
//   every key in bin i's tree has bin_of(key.size) == i;
//   a bin's root has no parent, and is a leaf or an inner node with two children or
//     more; every leaf holds at least one key, so every subtree of an inner node with
//     separators holds keys;
//   in an inner node with separators s[0..n-1] and children c[0..n], every key of
//     c[i] lies in [s[i-1], s[i]) (no bound beyond the ends), parent pointers agree;
//   for every indexed block b: b->state == free, b->free_leaf is the leaf holding it,
//     and its key there == (b->size, b->address) outside of a change that ends in
//     reposition().
// The owner changes a free block's size or address only by then calling reposition()
// (or erase() before and insert() after).
// version() changes with every insert, erase, reposition and clear: a decision drawn
// from the index (StreamPool's fit memo) stands while version() is what it was. An
// owner may keep the counter itself, shared by its indexes (count_versions_in): then it
// changes with a change of any of them, and sits where the owner reads it.
// Not thread-safe: the owner's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>

#include "engine/books/block.hpp"
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
  // Bins: sizes below 16 KiB in steps of 512 bytes (32 bins), then 16 per power of two
  // up to 2^64 (50 powers): 13 words of the bitmap.
  static constexpr int kBins = 32 + 50 * 16;
  static constexpr int kBinWords = kBins / 64;
  static_assert(kBins % 64 == 0 && kBinWords <= 32);
  // The bin of a size: with e = max(floor(log2 size), 13) - 13, the top bits
  // size >> (e + 9) (0-31 for e == 0, 16-31 above) plus 16 e. No branch.
  static RESERVOIR_INLINE int bin_of(std::size_t size) noexcept {
    const int top = 63 - __builtin_clzll(size | 1);
    const int e = (top > 13 ? top : 13) - 13;
    return static_cast<int>(size >> (e + 9)) + 16 * e;
  }

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
  std::uint64_t version() const noexcept { return *version_; }
  // counter (which outlives the index) counts the changes from now on, instead of the
  // index's own.
  void count_versions_in(std::uint64_t* counter) noexcept { version_ = counter; }
  iterator begin() const { return size_ ? iterator(this, first_, 0) : end(); }
  iterator end() const { return iterator(this, nullptr, 0); }
  void clear();
  // The largest free block (pre: !empty()).
  Block* largest() const { return last_->entries[last_->count - 1].block; }
  // The first block of at least size bytes in best-fit order (end() when none).
  RESERVOIR_INLINE iterator lower_bound(std::size_t size) const {
    if (size_ <= 1) {  // the one block (in the first leaf) fits or none does
      return size_ != 0 && first_->entries[0].key.size >= size ? iterator(this, first_, 0) : end();
    }
    const int bin = bin_of(size);
    if (const Node* root = roots_[bin]) {
      // Against the key (size, 0) only sizes decide (no block is at address 0): one
      // 64-bit compare per key instead of two.
      Leaf* leaf = descend_to_size(root, size);
      int j = 0;
      while (j < leaf->count && leaf->entries[j].key.size < size) ++j;
      if (j == leaf->count) return iterator(this, leaf->next, 0);  // the next leaf, or end
      return iterator(this, leaf, j);
    }
    const int next = next_bin(bin + 1);  // every key there is larger
    return next < 0 ? end() : iterator(this, leftmost(roots_[next]), 0);
  }

  // b (free) enters the index under its key (size, address).
  void insert(Block* b);
  // b leaves the index.
  void erase(Block* b);
  // b's size or address changed while in the index: its key is updated in place when
  // the order still holds (the common case of splitting or merging the same block),
  // else it moves.
  RESERVOIR_INLINE void reposition(Block* b) {
    ++*version_;
    const FreeKey key{b->size, b->address};
    Leaf* leaf = b->free_leaf;
    const int j = slot_of(leaf, b);
    const FreeKey& old = leaf->entries[j].key;
    // In place while the key stays between its neighbours in the leaf (so in its
    // bin); at the leaf's edge only in a bin of one leaf, if the bin stays the same.
    const bool down = less(key, old);
    const bool edge = leaf->parent == nullptr && bin_of(key.size) == bin_of(old.size);
    const bool fits = down ? (j > 0 ? less(leaf->entries[j - 1].key, key) : edge)
                           : (j + 1 < leaf->count ? less(key, leaf->entries[j + 1].key) : edge);
    if (RESERVOIR_LIKELY(fits)) {
      leaf->entries[j].key = key;
      return;
    }
    remove_at(leaf, j);
    insert(b);
  }

  // Whether b is indexed under its own key (validators).
  bool holds(const Block* b) const;
  // The first broken invariant of the index, or "" (validators).
  std::string problem() const;

  static bool less(const FreeKey& a, const FreeKey& b) noexcept {
    // (size, address) as one 128-bit number: a compare and a subtract with borrow, no
    // branch (node scans compare against keys in no predictable order).
    __extension__ typedef unsigned __int128 Wide;
    return ((Wide{a.size} << 64) | a.address) < ((Wide{b.size} << 64) | b.address);
  }

 private:
  // The leaf of root's tree whose range holds key.
  static RESERVOIR_INLINE Leaf* descend(const Node* root, const FreeKey& key) {
    return descend_while(root, [&key](const FreeKey& separator) { return !less(key, separator); });
  }
  // descend({size, 0}): the leaf holding the first key of at least size bytes.
  static RESERVOIR_INLINE Leaf* descend_to_size(const Node* root, std::size_t size) {
    return descend_while(root, [size](const FreeKey& separator) { return separator.size < size; });
  }
  // Down from root, past each separator for which right(separator) holds.
  template <typename Right>
  static RESERVOIR_INLINE Leaf* descend_while(const Node* n, Right right) {
    while (!n->leaf) {
      const Inner* in = static_cast<const Inner*>(n);
      int i = 0;
      while (i < in->count && right(in->keys[i])) ++i;
      n = in->children[i];
    }
    return static_cast<Leaf*>(const_cast<Node*>(n));
  }
  static Leaf* leftmost(const Node* n) {
    while (!n->leaf) n = static_cast<const Inner*>(n)->children[0];
    return static_cast<Leaf*>(const_cast<Node*>(n));
  }
  // The first nonempty bin at or after from, or -1.
  RESERVOIR_INLINE int next_bin(int from) const noexcept {
    if (from >= kBins) return -1;
    int w = from >> 6;
    const std::uint64_t bits = nonempty_[w] & (~std::uint64_t{0} << (from & 63));
    if (bits) return (w << 6) + __builtin_ctzll(bits);
    const std::uint32_t words = nonempty_words_ & ~((std::uint32_t{2} << w) - 1);
    if (!words) return -1;
    w = __builtin_ctz(words);
    return (w << 6) + __builtin_ctzll(nonempty_[w]);
  }
  // b's slot in leaf (pre: b is there).
  static int slot_of(const Leaf* leaf, const Block* b) {
    int j = 0;
    while (leaf->entries[j].block != b) ++j;
    return j;
  }
  void insert_into_empty_bin(int bin, const FreeKey& key, Block* b);
  void remove_at(Leaf* leaf, int slot);
  void insert_separator(Node* left, const FreeKey& key, Node* right, int bin);
  void remove_child(Inner* parent, Node* child, int bin);
  template <typename T>
  T* make();
  void release(Node* n);
  void clear_below(Node* n);
  std::string problem_below(const Node* n, const FreeKey* low, const FreeKey* high, int bin,
                            std::size_t* keys, const Leaf** previous) const;

  // Hot fields first (a cache hit reads first_ and size_), then the bitmap, the bins'
  // roots and the node pool.
  Leaf* first_ = nullptr;
  Leaf* last_ = nullptr;
  std::size_t size_ = 0;
  std::uint64_t* version_ = &own_version_;
  std::uint32_t nonempty_words_ = 0;  // bit w: nonempty_[w] != 0
  std::uint64_t nonempty_[kBinWords] = {};
  Node* roots_[kBins] = {};
  NodePool nodes_;
  std::uint64_t own_version_ = 0;
};

}  // namespace reservoir::detail
