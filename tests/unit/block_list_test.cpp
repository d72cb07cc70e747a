// block_list (engine/books/block_list.hpp) on its own: the first block of a segment,
// splitting at either end, and the merge with neighbours, each checked against the
// tiling invariants and the hooks the owner sees.
#include "engine/books/block_list.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "engine/books/block.hpp"
#include "util/node_pool.hpp"

namespace reservoir::detail {
namespace {

constexpr std::uintptr_t kBase = 0x100000;

// A segment of size bytes and the node pool of its blocks; drops every block left.
struct Books {
  NodePool nodes{sizeof(Block)};
  Segment segment;
  explicit Books(std::size_t size, PoolIndex pool = kLargePool, bool expandable = false) {
    segment.set_range(kBase, size);
    segment.pool = pool;
    segment.expandable = expandable;
  }
  ~Books() {
    for (Block* b = segment.head; b;) {
      Block* n = b->next;
      block_list::destroy(nodes, b);
      b = n;
    }
  }
  // The list as "offset+size:state" items, after checking block.hpp's tiling invariants.
  std::string layout() const {
    std::string out;
    std::uintptr_t at = segment.base;
    const Block* prev = nullptr;
    for (const Block* b = segment.head; b; prev = b, b = b->next) {
      EXPECT_EQ(b->prev, prev);
      EXPECT_EQ(b->address, at);
      EXPECT_GT(b->size, 0u);
      EXPECT_EQ(b->segment, &segment);
      EXPECT_EQ(b->pool_index, segment.pool);
      EXPECT_EQ(b->in_expandable, segment.expandable);
      at += b->size;
      if (!out.empty()) out += ' ';
      out += std::to_string(b->address - segment.base) + "+" + std::to_string(b->size) + ":" +
             "fapuk"[static_cast<int>(b->state)];
    }
    EXPECT_EQ(at, segment.base + segment.size) << "the blocks do not tile the segment";
    return out;
  }
};

// The owner's side of a merge, recorded.
struct Recorder {
  explicit Recorder(Books& b) : books(b) {}
  Books& books;
  std::vector<std::string> calls;
  std::int64_t absorbed_count = 0, absorbed_bytes = 0;
  std::string name(const Block* x) const { return std::to_string(x->address - kBase); }
  void drop(Block* x) {
    calls.push_back("drop " + name(x));
    block_list::destroy(books.nodes, x);
  }
  void unindex(Block* x) { calls.push_back("unindex " + name(x)); }
  void index(Block* x) {
    calls.push_back("index " + name(x));
    x->state = BlockState::free;
  }
  void reposition(Block* x) { calls.push_back("reposition " + name(x)); }
  void absorbed(const Block& x) {
    ++absorbed_count;
    absorbed_bytes += static_cast<std::int64_t>(x.size);
  }
};

TEST(BlockList, StartMakesOneBlockOfTheWholeSegmentItsHead) {
  Books books(4096, kSmallPool, true);
  Block* b = block_list::start(books.nodes, &books.segment, BlockState::unmapped);
  EXPECT_EQ(books.segment.head, b);
  EXPECT_EQ(b->next, nullptr);
  EXPECT_EQ(b->requested, 0u);
  EXPECT_EQ(b->event_count, 0u);
  EXPECT_FALSE(b->oversize);
  EXPECT_EQ(books.layout(), "0+4096:u");
}

TEST(BlockList, SplitFrontPutsTheNewBlockBeforeAndMovesTheRestUp) {
  Books books(4096);
  Block* whole = block_list::start(books.nodes, &books.segment, BlockState::free);
  Block* out = block_list::split_front(books.nodes, whole, 1024, BlockState::allocated);
  EXPECT_EQ(books.segment.head, out);  // the head moves to the new block
  EXPECT_EQ(out->next, whole);
  EXPECT_EQ(books.layout(), "0+1024:a 1024+3072:f");
  // In the middle of a list: the previous block's next is relinked, the head stays.
  Block* mid = block_list::split_front(books.nodes, whole, 512, BlockState::allocated);
  EXPECT_EQ(books.segment.head, out);
  EXPECT_EQ(out->next, mid);
  EXPECT_EQ(books.layout(), "0+1024:a 1024+512:a 1536+2560:f");
}

TEST(BlockList, SplitBackPutsTheRestAfterAndRelinksTheNextBlock) {
  Books books(4096);
  Block* whole = block_list::start(books.nodes, &books.segment, BlockState::unmapped);
  Block* tail = block_list::split_back(books.nodes, whole, 3072, BlockState::unmapped);
  EXPECT_EQ(whole->next, tail);
  whole->state = BlockState::free;
  EXPECT_EQ(books.layout(), "0+3072:f 3072+1024:u");
  Block* rest = block_list::split_back(books.nodes, whole, 1024, BlockState::free);
  EXPECT_EQ(rest->next, tail);
  EXPECT_EQ(tail->prev, rest);
  EXPECT_EQ(books.segment.head, whole);
  EXPECT_EQ(books.layout(), "0+1024:f 1024+2048:f 3072+1024:u");
}

// Blocks of the given sizes, in the given states, tiling a segment.
std::vector<Block*> lay_out(Books& books,
                            const std::vector<std::pair<std::size_t, BlockState>>& l) {
  std::size_t total = 0;
  for (auto& [size, state] : l) total += size;
  books.segment.set_range(kBase, total);
  Block* rest = block_list::start(books.nodes, &books.segment, l.back().second);
  std::vector<Block*> out;
  for (std::size_t i = 0; i + 1 < l.size(); ++i)
    out.push_back(block_list::split_front(books.nodes, rest, l[i].first, l[i].second));
  out.push_back(rest);
  return out;
}

TEST(BlockList, CoalesceWithNoNeighbourInTheStateIndexesTheBlock) {
  Books books(0);
  auto b = lay_out(
      books,
      {{512, BlockState::allocated}, {1024, BlockState::pending}, {512, BlockState::unmapped}});
  Recorder r(books);
  EXPECT_EQ(block_list::coalesce(b[1], BlockState::free, r), b[1]);
  EXPECT_EQ(r.calls, (std::vector<std::string>{"index 512"}));
  EXPECT_EQ(r.absorbed_count, 0);
  EXPECT_EQ(books.layout(), "0+512:a 512+1024:f 1536+512:u");
}

TEST(BlockList, CoalesceIntoThePreviousBlockKeepsItsNode) {
  Books books(0);
  auto b = lay_out(books, {{512, BlockState::free}, {1024, BlockState::pending}});
  Recorder r(books);
  EXPECT_EQ(block_list::coalesce(b[1], BlockState::free, r), b[0]);
  EXPECT_EQ(r.calls, (std::vector<std::string>{"drop 512", "reposition 0"}));
  EXPECT_EQ(r.absorbed_count, 1);
  EXPECT_EQ(r.absorbed_bytes, 512);
  EXPECT_EQ(books.layout(), "0+1536:f");
}

TEST(BlockList, CoalesceIntoTheNextBlockKeepsItsNodeAndMovesTheHead) {
  Books books(0);
  auto b = lay_out(books, {{512, BlockState::pending}, {1024, BlockState::free}});
  Recorder r(books);
  EXPECT_EQ(block_list::coalesce(b[0], BlockState::free, r), b[1]);
  EXPECT_EQ(r.calls, (std::vector<std::string>{"drop 0", "reposition 0"}));
  EXPECT_EQ(books.segment.head, b[1]);
  EXPECT_EQ(r.absorbed_bytes, 1024);
  EXPECT_EQ(books.layout(), "0+1536:f");
}

TEST(BlockList, CoalesceWithBothNeighboursLeavesThePreviousAndUnindexesTheNext) {
  Books books(0);
  auto b = lay_out(books, {{512, BlockState::allocated},
                           {512, BlockState::free},
                           {1024, BlockState::pending},
                           {2048, BlockState::free},
                           {512, BlockState::allocated}});
  Recorder r(books);
  EXPECT_EQ(block_list::coalesce(b[2], BlockState::free, r), b[1]);
  EXPECT_EQ(r.calls,
            (std::vector<std::string>{"drop 1024", "unindex 2048", "drop 2048", "reposition 512"}));
  EXPECT_EQ(r.absorbed_count, 2);
  EXPECT_EQ(r.absorbed_bytes, 512 + 2048);
  EXPECT_EQ(b[1]->next, b[4]);
  EXPECT_EQ(b[4]->prev, b[1]);
  EXPECT_EQ(books.layout(), "0+512:a 512+3584:f 4096+512:a");
}

TEST(BlockList, CoalesceMergesOnlyNeighboursInTheGivenState) {
  Books books(0);
  auto b = lay_out(
      books, {{512, BlockState::free}, {1024, BlockState::pending}, {512, BlockState::unmapped}});
  Recorder r(books);
  // Entering unmapped: the free neighbour stays, the unmapped one absorbs it.
  EXPECT_EQ(block_list::coalesce(b[1], BlockState::unmapped, r), b[2]);
  EXPECT_EQ(r.calls, (std::vector<std::string>{"drop 512", "reposition 512"}));
  EXPECT_EQ(books.layout(), "0+512:f 512+1536:u");
}

}  // namespace
}  // namespace reservoir::detail
