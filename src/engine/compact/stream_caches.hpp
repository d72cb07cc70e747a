// StreamCaches: policy:compact's per-stream front. The blocks a stream's program
// freed are kept, up to a small bound, for that stream's next requests of the same
// size: a thread working on its own stream allocates and frees without the device-wide
// pool's lock, and memory reused on the stream that last used it needs no marker, no
// wait and no page bookkeeping. Only sizes the stream asked for among its last
// kRecent requests are kept: a block of a size not asked for again would wait in the
// cache for nothing, and drain at a cost. Besides the small blocks, one larger block
// of the size of the stream's last larger request: a loop that frees and asks again
// for one large buffer (a 64 MiB pair) would otherwise book every page of it twice.
// Only one: placement matters for large blocks (sixteen of up to 256 MiB made a
// bundled trace reserve 4.4% more), and any request the caches do not serve drains it.
//
// A cached block stays where it is in its arena: allocated for its neighbours and
// its pages (ExtentMap still counts its bytes live), but freed for the statistics and
// for the program. A request no cache serves drains every cache back into the pool's
// free blocks (coalesced, fenced) but for blocks of its own size (drain_all with a size: their
// streams are likely to ask again, and handing one to another stream costs a wait on
// the device); the pool drains those too before it takes physical memory (a mapping, a
// move or a new arena), at the ladder and empty_cache, and drains a stream's cache when
// the stream is released: a cache never makes the device hold more memory than the
// pool would without it.
//
// Invariants (problem(), every cache locked): a live cache serves one stream and the
// table finds it; a recycled cache is empty and in recycled_; a cache holds at most
// kMaxBlocks blocks, each of its stream, of size <= kMaxBlock, allocated, requested == 0,
// and bytes == the sum of their sizes <= kMaxBytes; large == nullptr or a block of its
// stream, of size > kMaxBlock, allocated, requested == 0 (not in bytes).
// Locking: each cache has its own Lock; writers_ (a cache made or released) is taken
// before any cache's lock, and the pool's lock (when held) before writers_. Nothing on
// the requests' path writes memory shared by every stream (no device-wide count): a
// thread on its own stream touches its cache's line and its blocks only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/books/block.hpp"
#include "engine/streams/stream_table.hpp"
#include "util/compiler.hpp"
#include "util/lock.hpp"

namespace reservoir::detail {

class StreamCaches {
 public:
  // Larger blocks are where mapping and placement matter: the pool serves them.
  static constexpr std::size_t kMaxBlock = std::size_t{2} << 20;
  static constexpr std::size_t kMaxBlocks = 16;
  static constexpr std::size_t kMaxBytes = std::size_t{16} << 20;
  static constexpr std::size_t kRecent = 4;

  struct alignas(64) Cache {
    Lock lock;
    StreamHandle stream = 0;
    bool live = false;  // serves stream (false: recycled)
    std::uint32_t next_recent = 0;
    std::size_t recent[kRecent] = {};  // sizes of the last requests (0: none)
    std::size_t bytes = 0;             // sum of blocks' sizes
    std::size_t count = 0;
    std::size_t sizes[kMaxBlocks] = {};  // sizes[i] == blocks[i]->size: a search loads no block
    Block* blocks[kMaxBlocks] = {};      // the most recently freed last
    std::size_t recent_large = 0;        // size of the last request over kMaxBlock (0: none)
    Block* large = nullptr;              // a freed block of that size, or nullptr
    // The large block last kept by the pool's decision, and the pool's operation count
    // then: while no pool operation has run since, the pool would decide the same, so
    // its next free is kept at once (a hint: compared, never followed).
    const Block* large_kept = nullptr;
    std::uint64_t large_epoch = 0;
  };

  StreamCaches() = default;
  StreamCaches(const StreamCaches&) = delete;
  StreamCaches& operator=(const StreamCaches&) = delete;

  // stream's cache (made on its first use), locked: the caller adopts the lock.
  RESERVOIR_INLINE Cache* lock(StreamHandle stream) {
    // The table is a hint without writers_: confirmed under the cache's own lock.
    if (Cache* c = table_.find(stream)) {
      c->lock.lock();
      if (RESERVOIR_LIKELY(c->live && c->stream == stream)) return c;
      c->lock.unlock();
    }
    return lock_made(stream);
  }
  // stream's cache if it has one, locked, or nullptr: without waiting (the caller may
  // hold a lock that comes after the caches' in the lock order) nor making one.
  Cache* try_lock(StreamHandle stream) {
    Cache* c = table_.find(stream);  // a hint: confirmed under the cache's lock
    if (!c || !c->lock.try_lock()) return nullptr;
    if (c->live && c->stream == stream) return c;
    c->lock.unlock();
    return nullptr;
  }

  // A block of exactly size from c (the most recently freed), or nullptr; size counts
  // as asked for. pre: c locked.
  static Block* take(Cache& c, std::size_t size) {
    if (size > kMaxBlock) {
      c.recent_large = size;
      Block* b = c.large;
      if (!b || b->size != size) return nullptr;
      c.large = nullptr;
      return b;
    }
    asked(c, size);
    for (std::size_t i = c.count; i-- > 0;) {
      if (c.sizes[i] != size) continue;
      Block* b = c.blocks[i];
      --c.count;
      c.sizes[i] = c.sizes[c.count];
      c.blocks[i] = c.blocks[c.count];
      c.bytes -= size;
      return b;
    }
    return nullptr;
  }
  // Whether a block of size is worth keeping in c. pre: c locked.
  static bool wants(const Cache& c, std::size_t size) noexcept {
    if (size > kMaxBlock) return c.large == nullptr && size == c.recent_large;
    if (c.count == kMaxBlocks || c.bytes + size > kMaxBytes) return false;
    for (std::size_t r : c.recent)
      if (r == size) return true;
    return false;
  }
  // pre: c locked, wants(c, b->size), b of c's stream.
  void put(Cache& c, Block* b) {
    // Written only when it changes: threads keeping blocks all the time only read it.
    if (!any_.load(std::memory_order_relaxed)) any_.store(true, std::memory_order_relaxed);
    if (b->size > kMaxBlock) {
      c.large = b;
      return;
    }
    c.sizes[c.count] = b->size;
    c.blocks[c.count] = b;
    ++c.count;
    c.bytes += b->size;
  }

  // Whether a cache may hold a block (false: none does, but for a put under way).
  bool any() const noexcept { return any_.load(std::memory_order_relaxed); }
  // Every block of every cache handed to drain(Block*), the caches emptied, but for
  // blocks of exactly keep bytes (0: none), which stay (another stream's request of
  // their size takes other memory first: their streams are likely to ask again). The
  // caller holds the pool's lock.
  template <typename F>
  void drain_all(F&& drain, std::size_t keep = 0) {
    if (!any()) return;
    std::lock_guard<std::mutex> guard(writers_);
    // Cleared first: a put after this point sets it again.
    any_.store(false, std::memory_order_relaxed);
    bool kept = false;
    for (auto& c : all_) {
      if (!c->live) continue;  // recycled caches are empty
      std::lock_guard<Lock> cache_guard(c->lock);
      std::size_t n = 0;
      for (std::size_t i = 0; i < c->count; ++i) {
        if (c->sizes[i] == keep) {
          c->sizes[n] = c->sizes[i];
          c->blocks[n++] = c->blocks[i];
        } else {
          c->bytes -= c->sizes[i];
          drain(c->blocks[i]);
        }
      }
      c->count = n;
      if (c->large && c->large->size != keep) drain(std::exchange(c->large, nullptr));
      kept = kept || n > 0 || c->large;
    }
    if (kept) any_.store(true, std::memory_order_relaxed);
  }
  // stream's blocks handed to drain(Block*), and its cache recycled (the stream is
  // about to be destroyed). The caller holds the pool's lock.
  template <typename F>
  void release(StreamHandle stream, F&& drain) {
    std::lock_guard<std::mutex> guard(writers_);
    Cache* c = table_.find(stream);
    if (!c) return;
    std::lock_guard<Lock> cache_guard(c->lock);
    drain_locked(*c, drain);
    table_.erase(stream);
    c->live = false;
    recycled_.push_back(c);
  }

  // Every cache locked while it lives (walks that must see one state: the validator,
  // snapshots). The caller holds the pool's lock.
  class AllLocked {
   public:
    explicit AllLocked(StreamCaches& s) : s_(s), writers_(s.writers_) {
      for (auto& c : s_.all_) c->lock.lock();
    }
    ~AllLocked() {
      for (auto& c : s_.all_) c->lock.unlock();
    }
    AllLocked(const AllLocked&) = delete;
    AllLocked& operator=(const AllLocked&) = delete;
    // Every cached block, sorted by address.
    std::vector<Block*> blocks() const;
    // What breaks the invariants above, or empty.
    std::string problem() const;
    // Caches made (live and recycled).
    std::size_t caches() const noexcept { return s_.all_.size(); }

   private:
    StreamCaches& s_;
    std::lock_guard<std::mutex> writers_;
  };

 private:
  // lock() when the table did not name the stream's cache: found or made under writers_.
  RESERVOIR_COLD Cache* lock_made(StreamHandle stream);
  template <typename F>
  static void drain_locked(Cache& c, F& drain) {
    for (std::size_t i = 0; i < c.count; ++i) drain(c.blocks[i]);
    c.count = 0;
    c.bytes = 0;
    if (c.large) drain(std::exchange(c.large, nullptr));
  }
  static void asked(Cache& c, std::size_t size) noexcept {
    for (std::size_t r : c.recent)
      if (r == size) return;
    c.recent[c.next_recent] = size;
    c.next_recent = (c.next_recent + 1) % kRecent;
  }

  std::mutex writers_;
  StreamTable<Cache> table_;                 // live caches by stream; read without a lock
  std::vector<std::unique_ptr<Cache>> all_;  // every cache made (never freed: readers)
  std::vector<Cache*> recycled_;             // released, for the next new stream
  std::atomic<bool> any_{false};             // set by a put, cleared by drain_all
};

}  // namespace reservoir::detail
