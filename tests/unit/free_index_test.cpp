// FreeIndex (bins of sizes, each a B+tree, free blocks in best-fit order) against a
// reference std::set of (size, address) under random inserts, erases and repositions:
// every best-fit search, the whole order, the largest block, the structure (problem())
// and each block's leaf (holds()) agree after every operation. Sizes repeat often so
// that ties by address are exercised, bins grow past several levels of nodes and
// shrink back to empty (node splits and removals), and sizes span every bin.
#include "engine/books/free_index.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace reservoir::detail {
namespace {

using Key = std::pair<std::size_t, std::uintptr_t>;  // (size, address): best-fit order

class FreeIndexModel {
 public:
  explicit FreeIndexModel(std::size_t blocks) : blocks_(blocks) {
    for (std::size_t i = 0; i < blocks; ++i) {
      blocks_[i].address = (i + 1) * 4096;  // distinct addresses, never 0
      blocks_[i].state = BlockState::allocated;
    }
  }
  Block& block(std::size_t i) { return blocks_[i]; }
  bool indexed(std::size_t i) const { return blocks_[i].state == BlockState::free; }

  void insert(std::size_t i, std::size_t size) {
    Block& b = blocks_[i];
    b.size = size;
    b.state = BlockState::free;
    index.insert(&b);
    ref.insert({b.size, b.address});
  }
  void erase(std::size_t i) {
    Block& b = blocks_[i];
    index.erase(&b);
    ref.erase({b.size, b.address});
    b.state = BlockState::allocated;
  }
  // A split or a merge: the block's size and (here, within its slot) address change.
  void reposition(std::size_t i, std::size_t size, std::uintptr_t address) {
    Block& b = blocks_[i];
    ref.erase({b.size, b.address});
    b.size = size;
    b.address = address;
    index.reposition(&b);
    ref.insert({b.size, b.address});
  }

  // Everything the index answers, against the reference.
  void check(std::size_t probe) {
    ASSERT_EQ(index.problem(), "");
    ASSERT_EQ(index.size(), ref.size());
    ASSERT_EQ(index.empty(), ref.empty());
    auto it = index.begin();
    for (const Key& k : ref) {
      ASSERT_NE(it, index.end());
      ASSERT_EQ((*it)->size, k.first);
      ASSERT_EQ((*it)->address, k.second);
      ASSERT_EQ(it.size(), k.first);
      ASSERT_TRUE(index.holds(*it));
      ++it;
    }
    ASSERT_EQ(it, index.end());
    if (!ref.empty()) {
      ASSERT_EQ(index.largest()->address, std::prev(ref.end())->second);
      ASSERT_EQ(*std::prev(index.end()), index.largest());
    }
    auto want = ref.lower_bound({probe, 0});
    auto got = index.lower_bound(probe);
    if (want == ref.end()) {
      ASSERT_EQ(got, index.end());
    } else {
      ASSERT_NE(got, index.end());
      ASSERT_EQ((*got)->address, want->second);
      ASSERT_EQ((*got)->size, want->first);
    }
  }

  FreeIndex index;
  std::set<Key> ref;

 private:
  std::vector<Block> blocks_;
};

TEST(FreeIndex, MatchesAReferenceSetUnderRandomOperations) {
  constexpr std::size_t kBlocks = 3000;
  FreeIndexModel m(kBlocks);
  std::mt19937_64 rng(11);
  // Few distinct sizes: many ties, broken by address.
  auto size = [&] { return (1 + rng() % 64) * 512; };
  for (int step = 0; step < 60000; ++step) {
    // Grow for a while, then shrink to nothing, then grow again: splits and removals.
    const int phase = (step / 15000) % 2;
    const std::size_t i = rng() % kBlocks;
    const unsigned op = static_cast<unsigned>(rng() % 10);
    if (!m.indexed(i)) {
      if (phase == 0 || op < 2) m.insert(i, size());
    } else if (op < (phase == 0 ? 3u : 7u)) {
      m.erase(i);
    } else {
      // Address moves within the block's own 4 KiB slot, so addresses stay distinct.
      const std::uintptr_t slot = m.block(i).address & ~std::uintptr_t{4095};
      m.reposition(i, size(), slot + (rng() % 8) * 512);
    }
    if (step % 7 == 0 || m.index.size() < 40) {
      ASSERT_NO_FATAL_FAILURE(m.check(size()));
    }
  }
  for (std::size_t i = 0; i < kBlocks; ++i)
    if (m.indexed(i)) m.erase(i);
  ASSERT_NO_FATAL_FAILURE(m.check(512));
  EXPECT_TRUE(m.index.empty());
  EXPECT_EQ(m.index.lower_bound(512), m.index.end());
}

TEST(FreeIndex, RepositionKeepsOrderAtLeafEdges) {
  // Ascending sizes fill leaves in order; each block then grows past its successor or
  // shrinks below its predecessor (moves), or changes within its neighbours (in place).
  FreeIndexModel m(400);
  for (std::size_t i = 0; i < 400; ++i) m.insert(i, (i + 1) * 1024);
  ASSERT_NO_FATAL_FAILURE(m.check(1024));
  std::mt19937_64 rng(5);
  for (int step = 0; step < 4000; ++step) {
    const std::size_t i = rng() % 400;
    const std::size_t now = m.block(i).size;
    std::size_t next;
    switch (rng() % 3) {
      case 0:
        next = now + 512;  // usually in place
        break;
      case 1:
        next = now > 50 * 1024 ? now - 50 * 1024 : now + 70 * 1024;  // a move
        break;
      default:
        next = (1 + rng() % 800) * 512;  // anywhere
    }
    m.reposition(i, next, m.block(i).address);
    if (step % 5 == 0) {
      ASSERT_NO_FATAL_FAILURE(m.check(next));
    }
  }
  ASSERT_NO_FATAL_FAILURE(m.check(512));
}

TEST(FreeIndex, ClearEmptiesAndTheIndexServesAgain) {
  FreeIndexModel m(100);
  for (std::size_t i = 0; i < 100; ++i) m.insert(i, 512 * (1 + i % 7));
  m.index.clear();
  m.ref.clear();
  for (std::size_t i = 0; i < 100; ++i) m.block(i).state = BlockState::allocated;
  ASSERT_NO_FATAL_FAILURE(m.check(512));
  for (std::size_t i = 0; i < 50; ++i) m.insert(i, 4096);
  ASSERT_NO_FATAL_FAILURE(m.check(4096));
  EXPECT_EQ((*m.index.lower_bound(1))->address, m.block(0).address);  // lowest address wins
}

TEST(FreeIndex, BinsFollowSizeOrderAndCoverEverySize) {
  // Monotone (so the bins in turn hold the keys in order), 512-byte steps below 16 KiB,
  // 16 bins per power of two above, and the largest size in the last bin.
  EXPECT_EQ(FreeIndex::bin_of(0), 0);
  EXPECT_EQ(FreeIndex::bin_of(511), 0);
  EXPECT_EQ(FreeIndex::bin_of(512), 1);
  EXPECT_EQ(FreeIndex::bin_of(16383), 31);
  EXPECT_EQ(FreeIndex::bin_of(16384), 32);
  EXPECT_EQ(FreeIndex::bin_of(16384 + 1023), 32);
  EXPECT_EQ(FreeIndex::bin_of(16384 + 1024), 33);
  EXPECT_EQ(FreeIndex::bin_of(~std::size_t{0}), FreeIndex::kBins - 1);
  std::vector<std::size_t> edges;  // around every power of two
  for (int power = 0; power < 64; ++power) {
    const std::size_t p = std::size_t{1} << power;
    for (std::size_t s : {p - 1, p, p + 1, p + p / 16, p + p / 2}) edges.push_back(s);
  }
  std::sort(edges.begin(), edges.end());
  for (std::size_t k = 1; k < edges.size(); ++k) {
    ASSERT_LE(FreeIndex::bin_of(edges[k - 1]), FreeIndex::bin_of(edges[k])) << edges[k];
    ASSERT_LT(FreeIndex::bin_of(edges[k]), FreeIndex::kBins);
  }
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100000; ++i) {
    std::size_t a = rng() >> (rng() % 64), b = rng() >> (rng() % 64);
    if (a > b) std::swap(a, b);
    ASSERT_LE(FreeIndex::bin_of(a), FreeIndex::bin_of(b)) << a << " " << b;
  }
}

TEST(FreeIndex, MatchesAReferenceSetAcrossEveryScaleOfSize) {
  // Log-uniform sizes from 1 byte to 2^62 (not only multiples of 512), so keys fall in
  // most bins, bins empty and refill, and repositions cross bins.
  constexpr std::size_t kBlocks = 2000;
  FreeIndexModel m(kBlocks);
  std::mt19937_64 rng(17);
  auto size = [&] {
    const unsigned power = static_cast<unsigned>(rng() % 63);
    return (std::size_t{1} << power) + rng() % (std::size_t{1} << power);
  };
  for (int step = 0; step < 40000; ++step) {
    const std::size_t i = rng() % kBlocks;
    const unsigned op = static_cast<unsigned>(rng() % 10);
    if (!m.indexed(i)) {
      if (op < 6) m.insert(i, size());
    } else if (op < 4) {
      m.erase(i);
    } else if (op < 7) {
      // A small change: usually in place, in the same bin.
      const std::size_t now = m.block(i).size;
      m.reposition(i, now + (now > 64 ? now / 64 : 1), m.block(i).address);
    } else {
      m.reposition(i, size(), m.block(i).address);
    }
    if (step % 5 == 0 || m.index.size() < 20) {
      ASSERT_NO_FATAL_FAILURE(m.check(size()));
    }
  }
  for (std::size_t i = 0; i < kBlocks; ++i)
    if (m.indexed(i)) m.erase(i);
  ASSERT_NO_FATAL_FAILURE(m.check(1));
}

TEST(FreeIndex, ABinOfManyEqualSizesStaysOrderedByAddress) {
  // Thousands of free blocks of one size (one bin, a tree several levels deep), in
  // shuffled address order: best fit is always the lowest address, and the bin
  // empties node by node.
  constexpr std::size_t kBlocks = 6000;
  FreeIndexModel m(kBlocks);
  std::vector<std::size_t> order(kBlocks);
  for (std::size_t i = 0; i < kBlocks; ++i) order[i] = i;
  std::mt19937_64 rng(23);
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t k = 0; k < kBlocks; ++k) {
    m.insert(order[k], 1024);
    if (k % 97 == 0) {
      ASSERT_NO_FATAL_FAILURE(m.check(1024));
    }
  }
  ASSERT_NO_FATAL_FAILURE(m.check(1024));
  EXPECT_EQ(*m.index.lower_bound(512), &m.block(0));
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t k = 0; k < kBlocks; ++k) {
    m.erase(order[k]);
    if (k % 89 == 0) {
      ASSERT_NO_FATAL_FAILURE(m.check(1024));
    }
  }
  ASSERT_NO_FATAL_FAILURE(m.check(1024));
  EXPECT_TRUE(m.index.empty());
}

}  // namespace
}  // namespace reservoir::detail
