// StreamPool during a CUDA graph capture: frees that cannot record or query events
// wait (pending, no events) for the capture's end, or, with
// graph_capture_record_stream_reuse, serve the capture again once it orders the
// stream after every use (Backend::capture_point / capture_follows; docs/pools.md).
#include <string>
#include <vector>

#include "engine/pool/stream_pool.hpp"
#include "reservoir/errors.hpp"

namespace reservoir::detail {

// Freed while a capture may be under way: recording an event now could record it
// into the graph, and querying it later is illegal, so the block waits (pending,
// no events) until the engine calls flush_capture_deferred().
void StreamPool::defer_past_capture(Block* b) {
  b->state = BlockState::pending;
  capture_deferred_.push_back(b);
  if (services_.settings.capture_reuse) mark_captured(b);
}

// With graph_capture_record_stream_reuse the block may serve this stream again in the
// same capture: once the capture orders the stream's new work after every use (the
// program joined those streams back), the graph cannot run them together. A use from
// before the capture ran on its stream, outside the graph: only an event, after the
// capture, says it is done. A point the device cannot give leaves the block to the
// capture's end, as without the setting.
void StreamPool::mark_captured(Block* b) {
  BlockExtras& x = *b->extras;
  for (StreamHandle s : x.uses)
    if (!x.capture_uses.contains(s)) return;
  std::vector<CapturePoint> points(x.uses.size() + 1);
  Backend& backend = services_.backend;
  if (backend.capture_point(services_.device, stream(), &points[0]) != DeviceStatus::ok) return;
  std::size_t i = 1;
  for (StreamHandle s : x.uses)
    if (backend.capture_point(services_.device, s, &points[i++]) != DeviceStatus::ok) return;
  x.capture_points = std::move(points);
  ++capture_marked_;
}

void StreamPool::reclaim_captured() {
  for (std::size_t i = 0; i < capture_deferred_.size();) {
    Block* b = capture_deferred_[i];
    BlockExtras& x = *b->extras;
    bool follows = false;
    if (x.capture_points.empty() ||
        services_.backend.capture_follows(services_.device, stream(), x.capture_points.data(),
                                          x.capture_points.size(), &follows) != DeviceStatus::ok ||
        !follows) {
      ++i;
      continue;
    }
    capture_deferred_.erase(capture_deferred_.begin() + static_cast<std::ptrdiff_t>(i));
    --capture_marked_;
    complete_pending(b);
  }
}

void StreamPool::flush_capture_deferred() {
  Guard guard(*this);
  std::vector<Block*> blocks;
  blocks.swap(capture_deferred_);
  capture_marked_ = 0;  // (free_block drops the points with the extras)
  std::string failure;
  for (Block* b : blocks) {
    BlockExtras& x = *b->extras;
    // Work captured into a graph is not work on the stream: no event is needed for it.
    x.uses.erase_all(x.capture_uses);
    x.capture_uses.clear();
    if (x.uses.empty()) {
      complete_pending(b);
      continue;
    }
    try {
      defer_free(b);  // records the events (a failure strands the block)
    } catch (const DeviceError& e) {
      if (failure.empty()) failure = e.what();
    }
  }
  finish_operation();
  if (!failure.empty()) throw DeviceError(failure);
}

}  // namespace reservoir::detail
