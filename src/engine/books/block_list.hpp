// Block surgery: a segment's address-ordered list of blocks, kept tiling the segment
// while blocks are created, split and merged. The one copy of it, for StreamPool
// (default policy, expandable segments) and CompactPool (policy:compact); what an
// owner does around the surgery (its free index, statistics, ledger) stays with it.
//
// Invariants kept (block.hpp), for every segment s handed to these functions:
//   s->head->address == s->base, s->head->prev == nullptr;
//   b->next != nullptr => b->next->prev == b && b->next->address == b->address + b->size;
//   sum(b->size over the list) == s->size, every b->size > 0;
//   b->segment == s, b->pool_index == s->pool, b->in_expandable == s->expandable.
// Each function changes only links, addresses and sizes (and state for a new block):
// the index a block is in is the caller's to update, before or after as it says.
//
// Block::stream is not set here: it is read only while a block is allocated (the
// compact pool's free, record_use, trace and snapshot; a StreamPool never reads it,
// it knows its own stream), and CompactPool::allocate sets it on every block it hands
// out. So a new block's stream is left as the node held it, as a StreamPool's always
// was (one store fewer on the hot path's split).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

#include "engine/books/block.hpp"
#include "util/compiler.hpp"
#include "util/node_pool.hpp"

namespace reservoir::detail::block_list {

// A block of [address, address + size) of segment, in state, linked to nothing.
RESERVOIR_INLINE Block* create(NodePool& nodes, std::uintptr_t address, std::size_t size,
                               Segment* segment, BlockState state) {
  Block* b = new (nodes.get()) Block;  // default-init: only what is set below
  b->address = address;
  b->size = size;
  b->prev = b->next = nullptr;
  b->segment = segment;
  b->pool_index = segment->pool;
  b->in_expandable = segment->expandable;
  b->requested = 0;
  b->state = state;
  b->oversize = false;
  b->event_count = 0;
  b->gc_stamp = 0;
  return b;
}

// b's node goes back (b is linked in no list any more).
RESERVOIR_INLINE void destroy(NodePool& nodes, Block* b) {
  b->~Block();
  nodes.put(b);
}

// The first block of a new segment: one block of the whole range, its head.
// pre: segment's range is set. post: segment->head == b, b tiles the segment.
inline Block* start(NodePool& nodes, Segment* segment, BlockState state) {
  Block* b = create(nodes, segment->base, segment->size, segment, state);
  segment->head = b;
  return b;
}

// A new block of b's first size bytes, in state, before b; b keeps the rest:
// pre: 0 < size < b->size. post: out->address == old b->address, out->next == b,
// b->address == out->address + size, b->size == old b->size - size.
// b's key in a size- or address-ordered index changes: the caller repositions it.
RESERVOIR_INLINE Block* split_front(NodePool& nodes, Block* b, std::size_t size, BlockState state) {
  Block* out = create(nodes, b->address, size, b->segment, state);
  out->prev = b->prev;
  if (out->prev)
    out->prev->next = out;
  else
    b->segment->head = out;
  out->next = b;
  b->prev = out;
  b->address += size;
  b->size -= size;
  return out;
}

// A new block of what follows b's first size bytes, in state, after b; b keeps its
// first size bytes: pre: 0 < size < b->size. post: rest->prev == b,
// rest->address == b->address + size, b->size == size.
RESERVOIR_INLINE Block* split_back(NodePool& nodes, Block* b, std::size_t size, BlockState state) {
  Block* rest = create(nodes, b->address + size, b->size - size, b->segment, state);
  rest->prev = b;
  rest->next = b->next;
  if (rest->next) rest->next->prev = rest;
  b->next = rest;
  b->size = size;
  return rest;
}

// The merge of b (in no index) with its neighbours in state: one block is left, which
// the caller's index holds. A neighbour that absorbs b keeps its node (and its index
// entry): in an address-ordered index its place cannot change (b is adjacent); in a
// size-ordered one the caller repositions it. Hooks, the owner's side of the merge:
//   void drop(Block* x)         x leaves the list: its node goes back;
//   void unindex(Block* x)      x (an indexed neighbour) is absorbed: out of its index;
//   void index(Block* x)        x, merged with no neighbour, enters state's index;
//   void reposition(Block* x)   x, an indexed neighbour, grew by what it absorbed;
//   void absorbed(const Block& x)  x, a neighbour in state, is merged in (for counts).
// Returns the block left. post: no neighbour of it is in state. On a hot path, make the
// hooks RESERVOIR_INLINE: the compiler may otherwise outline one (a call per merge).
template <class Hooks>
RESERVOIR_INLINE Block* coalesce(Block* b, BlockState state, Hooks& hooks) {
  Block* keep = nullptr;  // the indexed survivor, once there is one
  if (b->prev && b->prev->state == state) {
    Block* prev = b->prev;
    hooks.absorbed(*prev);
    prev->size += b->size;
    prev->next = b->next;
    if (prev->next) prev->next->prev = prev;
    hooks.drop(b);
    keep = b = prev;
  }
  if (b->next && b->next->state == state) {
    Block* next = b->next;
    hooks.absorbed(*next);
    if (keep) {  // b (indexed) absorbs next, which leaves its index
      hooks.unindex(next);
      b->size += next->size;
      b->next = next->next;
      if (b->next) b->next->prev = b;
      hooks.drop(next);
    } else {  // next absorbs b and keeps its node
      next->address = b->address;
      next->size += b->size;
      next->prev = b->prev;
      if (next->prev)
        next->prev->next = next;
      else
        next->segment->head = next;
      hooks.drop(b);
      keep = b = next;
    }
  }
  if (!keep)
    hooks.index(b);
  else
    hooks.reposition(b);
  return b;
}

}  // namespace reservoir::detail::block_list
