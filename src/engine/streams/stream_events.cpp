#include "engine/streams/stream_events.hpp"

#include <algorithm>
#include <string>

#include "reservoir/errors.hpp"

namespace reservoir::detail {

StreamEvents::~StreamEvents() {
  for (Timeline& t : timelines_)
    for (auto& [seq, event] : t.pending) events_.release(event);
}

StreamEvents::Timeline& StreamEvents::add_timeline(StreamHandle stream) {
  index_.emplace(stream, timelines_.size());
  timelines_.emplace_back();
  timelines_.back().stream = stream;
  // Marks numbered so far on this handle are a forgotten stream's: all completed.
  timelines_.back().completed = next_seq_ - 1;
  return timelines_.back();
}

std::uint64_t StreamEvents::want_new_marker(Timeline* found, StreamHandle stream) {
  Timeline& t = found ? *found : add_timeline(stream);
  if (t.released) {  // the handle is a new stream's
    t.released = false;
    --released_;
  }
  if (t.wanted == 0) t.wanted = next_seq_++;
  return t.wanted;
}

void StreamEvents::record(Timeline& t, bool may_query) {
  if (t.wanted == 0) return;
  // Markers nobody asked about yet are retired first when they have completed, so that
  // their events are reused: a stream's markers stay few, and few events are created.
  if (!t.pending.empty() && may_query) poll(t);
  if (t.pending.size() >= kMaxPending) {
    // Markers that do not complete (a device far behind) must not pile up: the newest
    // one is recorded again here, so it stands for its own seq and the new one (a fence
    // on the older seq waits a little longer, never less; a wait already inserted
    // keeps the recording it saw).
    auto& [seq, event] = t.pending.back();
    if (backend_.record_event(device_, event, t.stream) != DeviceStatus::ok)
      throw DeviceError("reservoir: recording an event on device " + std::to_string(device_) +
                        " (a fence for memory reuse) failed: " + backend_.last_error());
    seq = t.wanted;
    t.wanted = 0;
    t.deferred = 0;
    return;
  }
  EventHandle e = events_.acquire();
  if (backend_.record_event(device_, e, t.stream) != DeviceStatus::ok) {
    events_.release(e);
    throw DeviceError("reservoir: recording an event on device " + std::to_string(device_) +
                      " (a fence for memory reuse) failed: " + backend_.last_error());
  }
  t.pending.emplace_back(t.wanted, e);
  t.wanted = 0;
  t.deferred = 0;
}

void StreamEvents::poll(Timeline& t) {
  while (!t.pending.empty()) {
    auto [seq, event] = t.pending.front();
    DeviceStatus st = backend_.query_event(device_, event);
    if (st == DeviceStatus::not_ready) return;
    if (st != DeviceStatus::ok)
      throw DeviceError("reservoir: querying an event on device " + std::to_string(device_) +
                        " failed: " + backend_.last_error());
    t.completed = seq;
    t.pending.pop_front();
    events_.release(event);
  }
}

bool StreamEvents::done(Timeline& t, std::uint64_t seq) {
  if (seq <= t.completed) return true;
  if (t.wanted != 0 && seq >= t.wanted) record(t);  // the marker it needs is owed
  poll(t);
  return seq <= t.completed;
}

bool StreamEvents::complete(const Fence& fence, StreamHandle on) {
  for (std::size_t i = 0; i < fence.size(); ++i) {
    const Fence::Mark& m = fence[i];
    if (m.stream == on) continue;
    Timeline* t = find(m.stream);
    if (t && !done(*t, m.seq)) return false;  // no timeline: forgotten, so complete
  }
  return true;
}

void StreamEvents::drop_completed(Fence& fence) {
  fence.erase_if([this](const Fence::Mark& m) {
    const Timeline* t = find(m.stream);
    return !t || m.seq <= t->completed;  // no timeline: forgotten once complete
  });
}

EventHandle StreamEvents::event_of(Timeline& t, std::uint64_t seq) {
  for (auto& [s, event] : t.pending)
    if (s >= seq) return event;
  return 0;  // unreachable when done(t, seq) is false
}

int StreamEvents::wait_for_scratch(StreamHandle stream) {
  int waits = 0;
  for (Timeline* t : scratch_) {
    if (done(*t, t->stamp_seq)) continue;
    EventHandle e = event_of(*t, t->stamp_seq);
    if (backend_.stream_wait_event(device_, stream, e) != DeviceStatus::ok)
      throw DeviceError("reservoir: making a stream wait for another on device " +
                        std::to_string(device_) + " failed: " + backend_.last_error());
    ++waits;
  }
  return waits;
}

std::string StreamEvents::problem() const {
  const auto released = std::count_if(timelines_.begin(), timelines_.end(),
                                      [](const Timeline& t) { return t.released; });
  if (static_cast<std::size_t>(released) != released_)
    return std::to_string(released) + " released timelines, counted " + std::to_string(released_);
  if (index_.size() != timelines_.size())
    return "the stream index lists " + std::to_string(index_.size()) + " streams, the timelines " +
           std::to_string(timelines_.size());
  for (std::size_t i = 0; i < timelines_.size(); ++i)
    if (auto it = index_.find(timelines_[i].stream); it == index_.end() || it->second != i)
      return "stream " + std::to_string(timelines_[i].stream) + ": not indexed at its timeline";
  for (const Timeline& t : timelines_) {
    auto stream = [&] { return "stream " + std::to_string(t.stream) + ": "; };
    std::uint64_t last = t.completed;
    for (const auto& [seq, event] : t.pending) {
      if (seq <= last)
        return stream() + "pending marker " + std::to_string(seq) + " not after " +
               std::to_string(last);
      last = seq;
    }
    if (t.wanted != 0 && t.wanted <= last)
      return stream() + "owed marker " + std::to_string(t.wanted) + " not after " +
             std::to_string(last);
    if (t.wanted == 0 ? t.deferred != 0 : t.deferred >= kSettleEvery)
      return stream() + std::to_string(t.deferred) + " allocations deferred its marker";
    if (std::max(last, t.wanted) >= next_seq_) return stream() + "a marker from the future";
    if (t.pending.size() > kMaxPending)
      return stream() + std::to_string(t.pending.size()) + " markers pending";
  }
  return {};
}

void StreamEvents::host_waited(StreamHandle stream) {
  // The program says the host waited for stream: its markers have likely completed.
  // They are queried, not assumed (a wrong hint must never let memory move early).
  if (Timeline* t = find(stream)) {
    record(*t);
    poll(*t);
  }
  forget_released();
}

void StreamEvents::release(StreamHandle stream, bool may_query) {
  if (Timeline* t = find(stream)) {
    record(*t, may_query);
    if (!t->released) {
      t->released = true;
      ++released_;
    }
  }
  if (may_query) forget_released();
}

void StreamEvents::forget_released() {
  if (released_ == 0) return;
  for (std::size_t i = 0; i < timelines_.size();) {
    Timeline& t = timelines_[i];
    if (t.released) poll(t);
    if (!t.released || !t.pending.empty() || t.wanted != 0) {
      ++i;
      continue;
    }
    --released_;
    index_.erase(t.stream);
    if (i + 1 != timelines_.size()) {
      t = std::move(timelines_.back());
      index_[t.stream] = i;
    }
    timelines_.pop_back();
  }
}

void StreamEvents::synchronize_all() {
  if (timelines_.empty()) return;
  if (backend_.synchronize_device(device_) != DeviceStatus::ok)
    throw DeviceError("reservoir: waiting for device " + std::to_string(device_) +
                      " (the out-of-memory ladder) failed: " + backend_.last_error());
  for (Timeline& t : timelines_) {
    for (auto& [seq, event] : t.pending) {
      t.completed = seq;
      events_.release(event);
    }
    t.pending.clear();
    if (t.wanted != 0) t.completed = t.wanted;
    t.wanted = 0;
    t.deferred = 0;
  }
  forget_released();
}

}  // namespace reservoir::detail
