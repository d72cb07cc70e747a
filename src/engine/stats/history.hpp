// History: a bounded ring buffer of TraceEntry per device, plus the trace
// trackers. Zero cost when off: the engine tests one relaxed atomic (active())
// before building an entry.
// Trackers run with no lock of the allocator held (a tracker may register memory with
// a communication library, or call the allocator): an operation that may record holds
// a Delivery from before it takes a lock; entries recorded meanwhile wait in the
// thread's queue and go to the trackers when its outermost Delivery ends.
// Invariant: entries_.size() <= max_entries_; when full, next_ is the oldest entry.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "reservoir/history.hpp"

namespace reservoir::detail {

class History {
 public:
  // True when entries are kept or a tracker listens.
  bool active() const noexcept { return active_.load(std::memory_order_relaxed); }
  ContextLevel level() const noexcept { return level_.load(std::memory_order_relaxed); }

  void configure(bool enabled, std::size_t max_entries, ContextLevel level,
                 ContextRecorder recorder);
  void add_tracker(TraceTracker tracker);
  // The user's context, when the level asks for it at this point (outside locks).
  Context gather(ContextLevel needed) const;
  void record(const TraceEntry& entry);
  std::vector<TraceEntry> entries() const;

  // Held around an operation that may record under a lock (taken before the lock):
  // the trackers see its entries once the outermost Delivery of the thread ends.
  // Touches nothing when history is off.
  class Delivery {
   public:
    explicit Delivery(const History& history) noexcept : Delivery(history.active()) {}
    explicit Delivery(bool held) noexcept;  // held: history was on (read by the caller)
    ~Delivery();
    Delivery(const Delivery&) = delete;
    Delivery& operator=(const Delivery&) = delete;

   private:
    bool held_;
  };

 private:
  void update_active();
  mutable std::mutex mutex_;
  std::atomic<bool> active_{false};
  std::atomic<ContextLevel> level_{ContextLevel::none};
  bool enabled_ = false;
  std::size_t max_entries_ = 1;
  std::size_t next_ = 0;
  std::vector<TraceEntry> entries_;
  ContextRecorder recorder_;
  // Replaced, never changed, so record() can call the trackers outside the mutex
  // without copying them.
  std::shared_ptr<const std::vector<TraceTracker>> trackers_ =
      std::make_shared<const std::vector<TraceTracker>>();
};

}  // namespace reservoir::detail
