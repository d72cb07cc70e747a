#include "engine/stats/history.hpp"

#include <cstdio>
#include <exception>

namespace reservoir {

const char* to_string(TraceAction action) noexcept {
  switch (action) {
    case TraceAction::alloc:
      return "alloc";
    case TraceAction::free_requested:
      return "free_requested";
    case TraceAction::free_completed:
      return "free_completed";
    case TraceAction::segment_alloc:
      return "segment_alloc";
    case TraceAction::segment_free:
      return "segment_free";
    case TraceAction::segment_map:
      return "segment_map";
    case TraceAction::segment_unmap:
      return "segment_unmap";
    case TraceAction::snapshot:
      return "snapshot";
    case TraceAction::oom:
      return "oom";
  }
  return "unknown";
}

const char* to_string(BlockStateInfo state) noexcept {
  switch (state) {
    case BlockStateInfo::active_allocated:
      return "active_allocated";
    case BlockStateInfo::active_pending_free:
      return "active_pending_free";
    case BlockStateInfo::inactive:
      return "inactive";
  }
  return "unknown";
}

namespace detail {

void History::configure(bool enabled, std::size_t max_entries, ContextLevel level,
                        ContextRecorder recorder) {
  std::lock_guard<std::mutex> guard(mutex_);
  enabled_ = enabled;
  max_entries_ = max_entries < 1 ? 1 : max_entries;
  recorder_ = enabled ? std::move(recorder) : ContextRecorder{};
  level_.store(enabled && recorder_ ? level : ContextLevel::none, std::memory_order_relaxed);
  if (!enabled) {
    entries_.clear();
    next_ = 0;
  } else if (entries_.size() > max_entries_) {
    // Keep the newest entries in order.
    std::vector<TraceEntry> ordered;
    ordered.insert(ordered.end(), entries_.begin() + static_cast<std::ptrdiff_t>(next_),
                   entries_.end());
    ordered.insert(ordered.end(), entries_.begin(),
                   entries_.begin() + static_cast<std::ptrdiff_t>(next_));
    entries_.assign(ordered.end() - static_cast<std::ptrdiff_t>(max_entries_), ordered.end());
    next_ = 0;
  }
  update_active();
}

void History::add_tracker(TraceTracker tracker) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto next = std::make_shared<std::vector<TraceTracker>>(*trackers_);
  next->push_back(std::move(tracker));
  trackers_ = std::move(next);
  update_active();
}

void History::update_active() {
  active_.store(enabled_ || !trackers_->empty(), std::memory_order_relaxed);
}

Context History::gather(ContextLevel needed) const {
  if (level() < needed) return nullptr;
  ContextRecorder recorder;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    recorder = recorder_;
  }
  if (!recorder) return nullptr;
  return std::make_shared<const std::string>(recorder());
}

namespace {
// This thread's Deliveries under way and the entries waiting for the trackers.
struct Waiting {
  std::shared_ptr<const std::vector<TraceTracker>> trackers;
  TraceEntry entry;
};
thread_local int t_delivery_depth = 0;
thread_local std::vector<Waiting> t_waiting;

// A tracker's exception cannot undo the operation that made the entry (it is done,
// or the tracker runs from a destructor): printed and dropped.
void deliver(const std::vector<TraceTracker>& trackers, const TraceEntry& entry) {
  for (const auto& t : trackers) {
    try {
      t(entry);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "reservoir: a trace tracker threw (ignored): %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "reservoir: a trace tracker threw (ignored)\n");
    }
  }
}
}  // namespace

History::Delivery::Delivery(bool held) noexcept : held_(held) {
  if (held_) ++t_delivery_depth;
}

History::Delivery::~Delivery() {
  if (!held_ || --t_delivery_depth != 0 || t_waiting.empty()) return;
  // Taken first: a tracker that calls the allocator starts a queue of its own.
  std::vector<Waiting> waiting;
  waiting.swap(t_waiting);
  for (const Waiting& w : waiting) deliver(*w.trackers, w.entry);
}

void History::record(const TraceEntry& entry) {
  std::shared_ptr<const std::vector<TraceTracker>> trackers;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    trackers = trackers_;
    if (enabled_) {
      if (entries_.size() < max_entries_) {
        entries_.push_back(entry);
      } else {
        entries_[next_] = entry;
        next_ = (next_ + 1) % max_entries_;
      }
    }
  }
  if (trackers->empty()) return;
  if (t_delivery_depth > 0) {
    t_waiting.push_back(Waiting{std::move(trackers), entry});
    return;
  }
  deliver(*trackers, entry);
}

std::vector<TraceEntry> History::entries() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<TraceEntry> out;
  out.reserve(entries_.size());
  out.insert(out.end(), entries_.begin() + static_cast<std::ptrdiff_t>(next_), entries_.end());
  out.insert(out.end(), entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(next_));
  return out;
}

}  // namespace detail
}  // namespace reservoir
