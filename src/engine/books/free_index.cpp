// FreeIndex: inserting (with node splits, and a bin's first leaf), erasing (with
// removal of emptied nodes and bins), and the structural check. See free_index.hpp for the
// invariants.
#include "engine/books/free_index.hpp"

#include <algorithm>
#include <iterator>
#include <new>
#include <type_traits>

#include "util/checks.hpp"

namespace reservoir::detail {

namespace {
constexpr std::size_t kNodeBytes = 640;   // a Leaf or an Inner, whichever is larger
constexpr std::size_t kNodesPerSlab = 8;  // 5 KiB at a time: most pools need one or two nodes
}  // namespace

FreeIndex::FreeIndex() : nodes_(kNodeBytes, kNodesPerSlab) {
  static_assert(sizeof(Leaf) <= kNodeBytes && sizeof(Inner) <= kNodeBytes);
  static_assert(kBinWords <= 32, "nonempty_words_ has a bit per word of nonempty_");
}

template <typename T>
T* FreeIndex::make() {
  T* n = new (nodes_.get()) T;
  n->leaf = std::is_same_v<T, Leaf>;
  return n;
}

void FreeIndex::release(Node* n) {
  if (n->leaf)
    static_cast<Leaf*>(n)->~Leaf();
  else
    static_cast<Inner*>(n)->~Inner();
  nodes_.put(n);
}

void FreeIndex::clear_below(Node* n) {
  if (!n->leaf) {
    Inner* in = static_cast<Inner*>(n);
    for (int i = 0; i <= in->count; ++i) clear_below(in->children[i]);
  }
  release(n);
}

void FreeIndex::clear() {
  ++*version_;
  for (int bin = next_bin(0); bin >= 0; bin = next_bin(bin + 1)) {
    clear_below(roots_[bin]);
    roots_[bin] = nullptr;
  }
  std::fill(std::begin(nonempty_), std::end(nonempty_), 0);
  nonempty_words_ = 0;
  first_ = last_ = nullptr;
  size_ = 0;
}

void FreeIndex::insert(Block* b) {
  ++*version_;
  const FreeKey key{b->size, b->address};
  const int bin = bin_of(key.size);
  const Node* root = roots_[bin];
  if (root == nullptr) {
    insert_into_empty_bin(bin, key, b);
    return;
  }
  Leaf* leaf = descend(root, key);
  if (leaf->count == kSlots) {  // split: the upper half moves to a new right sibling
    Leaf* right = make<Leaf>();
    const int keep = kSlots / 2;
    right->count = kSlots - keep;
    std::copy(leaf->entries + keep, leaf->entries + kSlots, right->entries);
    for (int i = 0; i < right->count; ++i) right->entries[i].block->free_leaf = right;
    leaf->count = keep;
    right->prev = leaf;
    right->next = leaf->next;
    if (right->next)
      right->next->prev = right;
    else
      last_ = right;
    leaf->next = right;
    insert_separator(leaf, right->entries[0].key, right, bin);
    if (!less(key, right->entries[0].key)) leaf = right;
  }
  int j = leaf->count;
  while (j > 0 && less(key, leaf->entries[j - 1].key)) {
    leaf->entries[j] = leaf->entries[j - 1];
    --j;
  }
  leaf->entries[j].key = key;
  leaf->entries[j].block = b;
  b->free_leaf = leaf;
  ++leaf->count;
  ++size_;
}

// The bin's first key: a leaf of its own, in the list before the next nonempty bin's
// first leaf (or last).
void FreeIndex::insert_into_empty_bin(int bin, const FreeKey& key, Block* b) {
  Leaf* leaf = make<Leaf>();
  leaf->count = 1;
  leaf->entries[0].key = key;
  leaf->entries[0].block = b;
  b->free_leaf = leaf;
  const int next = next_bin(bin + 1);
  if (next >= 0) {
    Leaf* after = leftmost(roots_[next]);
    leaf->next = after;
    leaf->prev = after->prev;
    after->prev = leaf;
  } else {
    leaf->prev = last_;
    last_ = leaf;
  }
  if (leaf->prev)
    leaf->prev->next = leaf;
  else
    first_ = leaf;
  roots_[bin] = leaf;
  nonempty_[bin >> 6] |= std::uint64_t{1} << (bin & 63);
  nonempty_words_ |= std::uint32_t{1} << (bin >> 6);
  ++size_;
}

// right (new) follows left, its keys from key on: key becomes a separator in left's
// parent, splitting it (and so on up) when full; a full root of the bin gets a new
// root above.
void FreeIndex::insert_separator(Node* left, const FreeKey& key, Node* right, int bin) {
  Inner* parent = left->parent;
  if (parent == nullptr) {
    Inner* root = make<Inner>();
    root->count = 1;
    root->keys[0] = key;
    root->children[0] = left;
    root->children[1] = right;
    left->parent = right->parent = root;
    roots_[bin] = root;
    return;
  }
  int at = 0;
  while (parent->children[at] != left) ++at;
  if (parent->count == kSlots) {
    // Split the parent: with the new separator it holds kSlots + 1 keys and kSlots + 2
    // children; the middle key moves up.
    FreeKey keys[kSlots + 1];
    Node* children[kSlots + 2];
    std::copy(parent->keys, parent->keys + at, keys);
    keys[at] = key;
    std::copy(parent->keys + at, parent->keys + kSlots, keys + at + 1);
    std::copy(parent->children, parent->children + at + 1, children);
    children[at + 1] = right;
    std::copy(parent->children + at + 1, parent->children + kSlots + 1, children + at + 2);
    const int mid = (kSlots + 1) / 2;
    Inner* sibling = make<Inner>();
    parent->count = mid;
    std::copy(keys, keys + mid, parent->keys);
    std::copy(children, children + mid + 1, parent->children);
    sibling->count = kSlots - mid;
    std::copy(keys + mid + 1, keys + kSlots + 1, sibling->keys);
    std::copy(children + mid + 1, children + kSlots + 2, sibling->children);
    for (int i = 0; i <= parent->count; ++i) parent->children[i]->parent = parent;
    for (int i = 0; i <= sibling->count; ++i) sibling->children[i]->parent = sibling;
    insert_separator(parent, keys[mid], sibling, bin);
    return;
  }
  for (int i = parent->count; i > at; --i) {
    parent->keys[i] = parent->keys[i - 1];
    parent->children[i + 1] = parent->children[i];
  }
  parent->keys[at] = key;
  parent->children[at + 1] = right;
  right->parent = parent;
  ++parent->count;
}

void FreeIndex::erase(Block* b) {
  ++*version_;
  remove_at(b->free_leaf, slot_of(b->free_leaf, b));
}

void FreeIndex::remove_at(Leaf* leaf, int slot) {
  const std::size_t size = leaf->entries[slot].key.size;  // names the bin
  std::copy(leaf->entries + slot + 1, leaf->entries + leaf->count, leaf->entries + slot);
  --leaf->count;
  --size_;
  if (leaf->count > 0) return;
  // An emptied leaf leaves the list and its bin's tree.
  if (leaf->prev)
    leaf->prev->next = leaf->next;
  else
    first_ = leaf->next;
  if (leaf->next)
    leaf->next->prev = leaf->prev;
  else
    last_ = leaf->prev;
  const int bin = bin_of(size);
  if (leaf->parent != nullptr) {
    remove_child(leaf->parent, leaf, bin);
    return;
  }
  // It was the bin's only node: the bin empties.
  release(leaf);
  roots_[bin] = nullptr;
  std::uint64_t& word = nonempty_[bin >> 6];
  word &= ~(std::uint64_t{1} << (bin & 63));
  if (word == 0) nonempty_words_ &= ~(std::uint32_t{1} << (bin >> 6));
}

// child (emptied) leaves parent with one separator; a parent left with no child goes
// too. A root left with one child hands the root down (through inner nodes of one
// child as well), so the bin's root is a leaf or an inner node of two children or more.
void FreeIndex::remove_child(Inner* parent, Node* child, int bin) {
  int at = 0;
  while (parent->children[at] != child) ++at;
  release(child);
  if (parent->count == 0) {  // child was the only one (so parent is not the root)
    RESERVOIR_ASSERT(parent->parent != nullptr);
    remove_child(parent->parent, parent, bin);
    return;
  }
  // Children after at shift down; the separator before the removed child goes (or,
  // for the first child, the one after it: the next child becomes the first).
  const int key_at = at > 0 ? at - 1 : 0;
  std::copy(parent->keys + key_at + 1, parent->keys + parent->count, parent->keys + key_at);
  std::copy(parent->children + at + 1, parent->children + parent->count + 1, parent->children + at);
  --parent->count;
  if (parent->parent != nullptr || parent->count > 0) return;
  Node* n = parent;
  while (!n->leaf && static_cast<Inner*>(n)->count == 0) {
    Node* only = static_cast<Inner*>(n)->children[0];
    release(n);
    n = only;
  }
  roots_[bin] = n;
  n->parent = nullptr;
}

bool FreeIndex::holds(const Block* b) const {
  const Node* root = roots_[bin_of(b->size)];
  if (root == nullptr) return false;
  const Leaf* leaf = descend(root, FreeKey{b->size, b->address});  // where a search goes
  if (leaf != b->free_leaf) return false;
  for (int j = 0; j < leaf->count; ++j)
    if (leaf->entries[j].block == b)
      return leaf->entries[j].key.size == b->size && leaf->entries[j].key.address == b->address;
  return false;
}

std::string FreeIndex::problem_below(const Node* n, const FreeKey* low, const FreeKey* high,
                                     int bin, std::size_t* keys, const Leaf** previous) const {
  auto key = [n](int i) -> const FreeKey& {
    return n->leaf ? static_cast<const Leaf*>(n)->entries[i].key
                   : static_cast<const Inner*>(n)->keys[i];
  };
  for (int i = 0; i < n->count; ++i) {
    if (low && less(key(i), *low)) return "a key below its subtree's separator";
    if (high && !less(key(i), *high)) return "a key at or above the next separator";
    if (i > 0 && !less(key(i - 1), key(i))) return "keys out of order in a node";
    if (bin_of(key(i).size) != bin) return "a key in the tree of another bin";
  }
  if (n->leaf) {
    const Leaf* leaf = static_cast<const Leaf*>(n);
    if (leaf->count == 0) return "an empty leaf";
    if (leaf->prev != *previous) return "the leaf list skips or repeats a leaf";
    if (*previous && (*previous)->next != leaf) return "a leaf's next is not the leaf after it";
    if (*previous && !less((*previous)->entries[(*previous)->count - 1].key, leaf->entries[0].key))
      return "keys out of order across leaves";
    for (int i = 0; i < leaf->count; ++i) {
      if (leaf->entries[i].block->state != BlockState::free)
        return "an indexed block that is not free";
      if (leaf->entries[i].block->free_leaf != leaf)
        return "an indexed block that names another leaf";
    }
    *keys += static_cast<std::size_t>(leaf->count);
    *previous = leaf;
    return "";
  }
  const Inner* in = static_cast<const Inner*>(n);
  for (int i = 0; i <= in->count; ++i) {
    if (in->children[i]->parent != in) return "a child whose parent pointer is wrong";
    std::string p = problem_below(in->children[i], i > 0 ? &in->keys[i - 1] : low,
                                  i < in->count ? &in->keys[i] : high, bin, keys, previous);
    if (!p.empty()) return p;
  }
  return "";
}

std::string FreeIndex::problem() const {
  std::size_t keys = 0;
  const Leaf* first = nullptr;  // the first bin's first leaf
  const Leaf* previous = nullptr;
  for (int w = 0; w < kBinWords; ++w)
    if (((nonempty_words_ >> w) & 1) != (nonempty_[w] != 0 ? 1u : 0u))
      return "free index: the bitmap's word summary disagrees with word " + std::to_string(w);
  for (int bin = 0; bin < kBins; ++bin) {
    const Node* root = roots_[bin];
    if (((nonempty_[bin >> 6] >> (bin & 63)) & 1) != (root != nullptr ? 1u : 0u))
      return "free index: bin " + std::to_string(bin) + "'s bit disagrees with its tree";
    if (root == nullptr) continue;
    if (root->parent != nullptr) return "free index: a bin's root has a parent";
    if (!root->leaf && root->count == 0) return "free index: a bin's root has one child";
    if (first == nullptr) first = leftmost(root);
    std::string p = problem_below(root, nullptr, nullptr, bin, &keys, &previous);
    if (!p.empty()) return "free index: bin " + std::to_string(bin) + ": " + p;
  }
  if (first != first_) return "free index: the first leaf is not the list's start";
  if (previous != last_ || (last_ && last_->next))
    return "free index: the last leaf is not the list's end";
  if (keys != size_)
    return "free index: holds " + std::to_string(keys) + " keys, counts " + std::to_string(size_);
  return "";
}

}  // namespace reservoir::detail
