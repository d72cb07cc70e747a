// StreamEvents and Fence: when memory last used on some streams may be used again —
// on another stream (the device is made to wait) or at another address (its pages
// unmapped and mapped elsewhere, which the host must know to be safe).
//
// Each stream has a timeline of markers: events recorded on it, numbered by a
// device-wide sequence. A Fence is, per stream, the marker a block's past uses need
// (the latest one wins: markers on one stream complete in order). A free does not
// record an event at once: it asks for a marker on its stream, and the marker is
// recorded at the next allocation on that stream or when a fence is first needed, so
// a burst of frees shares one event. An allocation records the owed marker only every
// kSettleEvery-th time it finds one owed (an event and its query cost ~0.9 us on an
// H200, more than the rest of an allocation; alloc/free alternation would record one
// per allocation, and one every 8th was still a sixth of a log-uniform step), so a
// marker covers at most that many allocations' work more than it must. A marker
// recorded later than the free it stands for only covers more work: it may wait
// longer, never too little.
//
// A marker is recorded on its stream when a fence first needs it, whichever stream's
// request that is: so a stream must exist until nothing is owed on it — the program
// calls Allocator::release_stream before destroying a stream it allocated or freed on
// (undefined otherwise, as any CUDA call on a destroyed stream).
//
// A released stream's timeline is forgotten once its markers have completed (checked
// at each release, host wait and device-wide wait): a mark on a stream with no
// timeline has completed. A timeline made later for the same handle (streams come
// back under old handles) starts with every marker numbered so far completed, so old
// marks never wait for the new stream's work.
//
// Invariants: per timeline, pending_ holds at most kMaxPending recorded, not yet known
//   complete markers in increasing seq order, all > completed; wanted > completed
//   means a marker is owed (its seq is wanted, not yet recorded), and then
//   0 <= deferred < kSettleEvery (deferred == 0 when nothing is owed); a Fence holds
//   at most one mark per stream.
// Not thread-safe: used under its owner's lock.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/streams/event_pool.hpp"
#include "reservoir/backend.hpp"
#include "util/compiler.hpp"

namespace reservoir::detail {

// Marks per stream, at most one each. Most memory is used on one or two streams:
// those marks are kept inline (no heap allocation on the free path).
class Fence {
 public:
  struct Mark {
    StreamHandle stream;
    std::uint64_t seq;
  };
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  const Mark& operator[](std::size_t i) const noexcept {
    return i < kInline ? inline_[i] : more_[i - kInline];
  }
  // Keeps the later of two marks on one stream. Inline for the common case, memory
  // used again on the stream of its first mark (a call per page freed cost a tenth
  // of a policy:compact free).
  RESERVOIR_INLINE void add(StreamHandle stream, std::uint64_t seq) {
    if (size_ != 0 && inline_[0].stream == stream) {
      if (seq > inline_[0].seq) inline_[0].seq = seq;
      return;
    }
    add_other(stream, seq);
  }
  void clear() noexcept {
    size_ = 0;
    more_.clear();
  }
  // Drops the marks pred accepts.
  template <typename Pred>
  void erase_if(Pred pred) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < size_; ++i) {
      const Mark m = (*this)[i];
      if (!pred(m)) at(kept++) = m;
    }
    size_ = kept;
    more_.resize(kept > kInline ? kept - kInline : 0);
  }
  // Whether every mark is on stream (nothing to order or wait for there).
  RESERVOIR_INLINE bool only_on(StreamHandle stream) const noexcept {
    if (size_ <= 1) return size_ == 0 || inline_[0].stream == stream;
    for (std::size_t i = 0; i < size_; ++i)
      if ((*this)[i].stream != stream) return false;
    return true;
  }

 private:
  // add() for a stream other than the first mark's: found among the others, or new.
  void add_other(StreamHandle stream, std::uint64_t seq) {
    for (std::size_t i = 1; i < size_; ++i) {
      Mark& m = at(i);
      if (m.stream == stream) {
        if (seq > m.seq) m.seq = seq;
        return;
      }
    }
    if (size_ < kInline)
      inline_[size_] = Mark{stream, seq};
    else
      more_.push_back(Mark{stream, seq});
    ++size_;
  }
  static constexpr std::size_t kInline = 2;
  Mark& at(std::size_t i) noexcept { return i < kInline ? inline_[i] : more_[i - kInline]; }
  Mark inline_[kInline] = {};
  std::size_t size_ = 0;
  std::vector<Mark> more_;
};

class StreamEvents {
 public:
  StreamEvents(Backend& backend, int device, EventPool& events)
      : backend_(backend), device_(device), events_(events) {}
  ~StreamEvents();
  StreamEvents(const StreamEvents&) = delete;
  StreamEvents& operator=(const StreamEvents&) = delete;

  // The seq of a marker after all work submitted to stream so far (owed: recorded
  // lazily). For a Fence. Inline when one is owed already (a stream freeing again
  // before its next marker).
  RESERVOIR_INLINE std::uint64_t want_marker(StreamHandle stream) {
    Timeline* t = find(stream);
    if (RESERVOIR_LIKELY(t && t->wanted != 0 && !t->released)) return t->wanted;
    return want_new_marker(t, stream);
  }
  // At an allocation on stream: records its owed marker, if any, every kSettleEvery-th
  // time (the others leave it owed; a fence that needs it records it).
  RESERVOIR_INLINE void settle(StreamHandle stream) {
    Timeline* t = find(stream);
    if (!t || t->wanted == 0) return;
    if (RESERVOIR_LIKELY(t->deferred + 1 < kSettleEvery)) {
      ++t->deferred;
      return;
    }
    // Counted only once recorded: a record that throws (a device error) leaves
    // deferred below kSettleEvery, and the next allocation tries again.
    record(*t);
  }
  static constexpr std::uint32_t kSettleEvery = 64;
  // Recorded, incomplete markers kept per stream at most: beyond, the newest is
  // recorded again for the next (order_after and complete walk them: a device that
  // never caught up made every turn of two streams slower than the last).
  static constexpr std::size_t kMaxPending = 16;
  // Whether every mark of fence on streams other than `on` has completed (queries,
  // never waits; records owed markers it needs). Marks on `on` itself are ordered by
  // the stream and need nothing.
  bool complete(const Fence& fence, StreamHandle on);
  // Whether every mark has completed, on any stream (the host may unmap then).
  bool complete(const Fence& fence) { return complete(fence, kNoStream); }
  // Drops the marks known complete (no query): a fence keeps nothing of streams whose
  // work it no longer waits for, however many streams used its memory.
  void drop_completed(Fence& fence);
  // Makes stream wait on the device for every incomplete mark of fence on other
  // streams; returns the number of waits inserted. Throws DeviceError.
  int order_after(StreamHandle stream, const Fence& fence) {
    return order_after_all(stream, [&](auto&& visit) { visit(fence); });
  }
  // The same for the marks of several fences (each_fence(visit) calls visit(fence) for
  // each), as if merged into one first: one wait per other stream, for the latest of its
  // marks. O(marks): a block whose pages hundreds of streams used costs no search per
  // mark (merging the pages' fences one mark at a time was O(marks^2)).
  template <typename EachFence>
  int order_after_all(StreamHandle stream, EachFence&& each_fence) {
    ++stamp_;
    scratch_.clear();
    each_fence([&](const Fence& fence) {
      for (std::size_t i = 0; i < fence.size(); ++i) {
        const Fence::Mark& m = fence[i];
        if (m.stream == stream) continue;
        Timeline* t = find(m.stream);
        if (!t) continue;  // forgotten: complete
        if (t->stamp != stamp_) {
          t->stamp = stamp_;
          t->stamp_seq = m.seq;
          scratch_.push_back(t);
        } else if (m.seq > t->stamp_seq) {
          t->stamp_seq = m.seq;
        }
      }
    });
    return wait_for_scratch(stream);
  }
  // The host waited for stream: its markers are checked (queried) now.
  void host_waited(StreamHandle stream);
  // The program is about to destroy stream: the marker owed there is recorded now,
  // while it exists (later fences wait on recorded events only, which outlive it).
  // may_query false (a capture is under way, which forbids event queries; stream must
  // not be the one capturing, whose recorded event would belong to the graph): nothing
  // is queried, and released timelines are forgotten later.
  void release(StreamHandle stream, bool may_query = true);
  // Waits on the host for all work on the device (the out-of-memory ladder): every
  // marker, owed ones too, has completed then — one wait, which also covers streams
  // destroyed since (no event can be recorded there). Throws DeviceError.
  void synchronize_all();
  // Streams with a timeline: seen, and not forgotten since their release.
  std::size_t streams() const noexcept { return timelines_.size(); }
  // The invariants above: empty when they hold, else what breaks them (the validator).
  std::string problem() const;

  static constexpr StreamHandle kNoStream = ~StreamHandle{0} - 0x5eed;

 private:
  struct Timeline {
    StreamHandle stream;
    std::uint64_t completed = 0;  // every marker <= completed has completed
    std::uint64_t wanted = 0;     // owed marker (0: none)
    std::uint32_t deferred = 0;   // allocations that left the owed marker unrecorded
    bool released = false;        // release() since its last want_marker()
    std::deque<std::pair<std::uint64_t, EventHandle>> pending;
    // order_after_all's scratch: the latest mark seen on this stream in the call
    // stamped stamp.
    std::uint64_t stamp = 0;
    std::uint64_t stamp_seq = 0;
  };
  // nullptr: never seen (or forgotten). A look at each timeline while they are few, the
  // index beyond.
  Timeline* find(StreamHandle stream) {
    if (timelines_.size() <= kScanned) {
      for (Timeline& t : timelines_)
        if (t.stream == stream) return &t;
      return nullptr;
    }
    auto it = index_.find(stream);
    return it == index_.end() ? nullptr : &timelines_[it->second];
  }
  // Waits for the marks scratch_ collected (order_after_all).
  int wait_for_scratch(StreamHandle stream);
  Timeline& add_timeline(StreamHandle stream);  // pre: find(stream) == nullptr
  // want_marker's other cases; found: find(stream), nullptr when never seen.
  std::uint64_t want_new_marker(Timeline* found, StreamHandle stream);
  // Records the owed marker; may_query false: no completed marker is retired first.
  void record(Timeline& t, bool may_query = true);
  void poll(Timeline& t);  // retires completed markers (queries)
  bool done(Timeline& t, std::uint64_t seq);
  EventHandle event_of(Timeline& t, std::uint64_t seq);  // the first marker >= seq
  void forget_released();  // drops released timelines whose markers have completed

  Backend& backend_;
  const int device_;
  EventPool& events_;
  // Timelines, and where each stream's is: index_[t.stream] == i for every
  // timelines_[i], and nothing else (problem() checks it).
  std::vector<Timeline> timelines_;
  std::unordered_map<StreamHandle, std::size_t> index_;
  static constexpr std::size_t kScanned = 8;  // up to this many: a linear search
  std::vector<Timeline*> scratch_;            // order_after_all's timelines of the call
  std::uint64_t stamp_ = 0;                   // order_after_all's calls so far
  std::uint64_t next_seq_ = 1;
  std::size_t released_ = 0;  // timelines with released set
};

}  // namespace reservoir::detail
