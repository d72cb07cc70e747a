// StreamCaches: finding or making a stream's cache, and the validator's view. See
// stream_caches.hpp.
#include "engine/compact/stream_caches.hpp"

#include <algorithm>

#include "util/format.hpp"

namespace reservoir::detail {

StreamCaches::Cache* StreamCaches::lock_made(StreamHandle stream) {
  std::lock_guard<std::mutex> guard(writers_);
  Cache* c = table_.find(stream);
  if (!c) {
    if (!recycled_.empty()) {
      c = recycled_.back();
      recycled_.pop_back();
    } else {
      all_.push_back(std::make_unique<Cache>());
      c = all_.back().get();
    }
    {
      std::lock_guard<Lock> cache_guard(c->lock);
      c->stream = stream;
      c->live = true;
      for (std::size_t& r : c->recent) r = 0;  // a new stream asked for nothing yet
      c->recent_large = 0;
      c->large_kept = nullptr;
    }
    table_.insert(stream, c);
  }
  c->lock.lock();
  return c;
}

std::vector<Block*> StreamCaches::AllLocked::blocks() const {
  std::vector<Block*> out;
  for (const auto& c : s_.all_) {
    out.insert(out.end(), c->blocks, c->blocks + c->count);
    if (c->large) out.push_back(c->large);
  }
  std::sort(out.begin(), out.end(),
            [](const Block* a, const Block* b) { return a->address < b->address; });
  return out;
}

std::string StreamCaches::AllLocked::problem() const {
  std::size_t live = 0;
  for (const auto& c : s_.all_) {
    const std::string which = "the cache of stream " + std::to_string(c->stream);
    if (c->live) {
      ++live;
      if (s_.table_.find(c->stream) != c.get()) return which + " is not in the stream table";
    } else if (c->count != 0 || c->large ||
               std::find(s_.recycled_.begin(), s_.recycled_.end(), c.get()) == s_.recycled_.end()) {
      return which + " was recycled but holds blocks or is not listed as recycled";
    }
    if (c->count > kMaxBlocks) return which + " holds more than its bound of blocks";
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < c->count; ++i) {
      const Block* b = c->blocks[i];
      if (b->size != c->sizes[i]) return which + " keeps a stale size of a block";
      if (b->stream != c->stream || b->size > kMaxBlock || b->state != BlockState::allocated ||
          b->requested != 0)
        return which + " holds the block at " +
               format_pointer(reinterpret_cast<void*>(b->address)) +
               " of another stream, too large, not allocated or still requested";
      bytes += b->size;
    }
    if (const Block* b = c->large; b && (b->stream != c->stream || b->size <= kMaxBlock ||
                                         b->state != BlockState::allocated || b->requested != 0))
      return which + " holds a large block at " +
             format_pointer(reinterpret_cast<void*>(b->address)) +
             " of another stream, too small, not allocated or still requested";
    if (bytes != c->bytes || bytes > kMaxBytes)
      return which + " counts " + std::to_string(c->bytes) + " bytes but holds " +
             std::to_string(bytes);
  }
  if (live != s_.table_.size()) return "the stream table lists caches that are not live";
  if (live + s_.recycled_.size() != s_.all_.size()) return "caches are neither live nor recycled";
  return {};
}

}  // namespace reservoir::detail
