// StreamEvents and Fence: when memory last used on some streams may be used again —
// on another stream (the device is made to wait) or at another address (its pages
// unmapped and mapped elsewhere, which the host must know to be safe).
//
// Each stream has a timeline of markers: events recorded on it, numbered by a
// device-wide sequence. A Fence is, per stream, the marker a block's past uses need
// (the latest one wins: markers on one stream complete in order). A free does not
// record an event at once: it asks for a marker on its stream, and the marker is
// recorded at the next allocation on that stream or when a fence is first needed, so
// a burst of frees shares one event. A marker recorded later than the free it
// stands for only covers more work: it may wait longer, never too little.
//
// Invariants: per timeline, pending_ holds recorded, not yet known complete markers in
//   increasing seq order, all > completed; wanted > completed means a marker is owed
//   (its seq is wanted, not yet recorded); a Fence holds at most one mark per stream.
// Not thread-safe: used under its owner's lock.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "engine/event_pool.hpp"
#include "reservoir/backend.hpp"

namespace reservoir::detail {

class Fence {
 public:
  struct Mark {
    StreamHandle stream;
    std::uint64_t seq;
  };
  bool empty() const noexcept { return marks_.empty(); }
  const std::vector<Mark>& marks() const noexcept { return marks_; }
  // Keeps the later of two marks on one stream.
  void add(StreamHandle stream, std::uint64_t seq);
  void merge(const Fence& other) {
    for (const Mark& m : other.marks_) add(m.stream, m.seq);
  }
  void clear() noexcept { marks_.clear(); }
  // Drops marks that are complete (completed(stream, seq) true).
  template <typename Completed>
  void prune(Completed&& completed) {
    std::erase_if(marks_, [&](const Mark& m) { return completed(m.stream, m.seq); });
  }

 private:
  std::vector<Mark> marks_;
};

class StreamEvents {
 public:
  StreamEvents(Backend& backend, int device, EventPool& events)
      : backend_(backend), device_(device), events_(events) {}
  ~StreamEvents();
  StreamEvents(const StreamEvents&) = delete;
  StreamEvents& operator=(const StreamEvents&) = delete;

  // The seq of a marker after all work submitted to stream so far (owed: recorded
  // lazily). For a Fence.
  std::uint64_t want_marker(StreamHandle stream);
  // Records the owed marker of stream, if any (at an allocation on it).
  void settle(StreamHandle stream);
  // Whether every mark of fence on streams other than `on` has completed (queries,
  // never waits; records owed markers it needs). Marks on `on` itself are ordered by
  // the stream and need nothing.
  bool complete(const Fence& fence, StreamHandle on);
  // Whether every mark has completed, on any stream (the host may unmap then).
  bool complete(const Fence& fence) { return complete(fence, kNoStream); }
  // Makes stream wait on the device for every incomplete mark of fence on other
  // streams; returns the number of waits inserted. Throws DeviceError.
  int order_after(StreamHandle stream, const Fence& fence);
  // The host waited for stream: all of its markers are complete.
  void host_waited(StreamHandle stream);
  // Waits on the host for every marker of every stream (the out-of-memory ladder).
  void synchronize_all();
  // Streams seen so far.
  std::size_t streams() const noexcept { return timelines_.size(); }

  static constexpr StreamHandle kNoStream = ~StreamHandle{0} - 0x5eed;

 private:
  struct Timeline {
    StreamHandle stream;
    std::uint64_t completed = 0;  // every marker <= completed has completed
    std::uint64_t wanted = 0;     // owed marker (0: none)
    std::deque<std::pair<std::uint64_t, EventHandle>> pending;
  };
  Timeline& timeline(StreamHandle stream);
  void record(Timeline& t);  // records the owed marker
  void poll(Timeline& t);    // retires completed markers (queries)
  bool done(Timeline& t, std::uint64_t seq);
  EventHandle event_of(Timeline& t, std::uint64_t seq);  // the first marker >= seq

  Backend& backend_;
  const int device_;
  EventPool& events_;
  std::vector<Timeline> timelines_;  // few streams: a linear search is cheapest
  std::uint64_t next_seq_ = 1;
};

}  // namespace reservoir::detail
