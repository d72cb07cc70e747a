// SimBackend: the order of work inside a graph capture (capture_point,
// capture_follows), modelled on the streams' positions and device-side waits.
//
// A point is (stream, position) pairs in CapturePoint::nodes. Work submitted to a
// waiter from now on follows (s, p) when s is the waiter, s has completed p, or the
// waiter waits (stream_wait_event) for s at a position >= p, or for another stream's
// work that itself came after such a wait: the waits are followed transitively, each
// through the part of the waited stream's work that the wait covers.
#include <algorithm>
#include <limits>
#include <unordered_map>
#include <vector>

#include "backend/sim/state.hpp"

namespace reservoir {

using namespace sim;

DeviceStatus SimBackend::capture_point(int device, StreamHandle stream, CapturePoint* out) {
  State& s = *state_;
  return s.call(device, SimOp::capture_point, [&](State::Device&) {
    if (out == nullptr) return error("sim: capture_point: null out");
    if (s.capturing.empty())
      return error("sim: capture_point: stream " + std::to_string(stream) +
                   " is not capturing (no capture is under way)");
    auto it = s.streams.find(stream);
    out->capture = s.capture_id;
    out->nodes = {static_cast<std::uintptr_t>(stream),
                  it == s.streams.end() ? 0 : static_cast<std::uintptr_t>(it->second.submitted)};
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::capture_follows(int device, StreamHandle stream,
                                         const CapturePoint* points, std::size_t count,
                                         bool* follows) {
  State& s = *state_;
  return s.call(device, SimOp::capture_follows, [&](State::Device&) {
    if (follows == nullptr || (points == nullptr && count != 0))
      return error("sim: capture_follows: null argument");
    if (s.capturing.empty())
      return error("sim: capture_follows: stream " + std::to_string(stream) +
                   " is not capturing (no capture is under way)");
    // Whether work submitted to waiter from now on runs after used's work up to position.
    auto after = [&s](StreamHandle waiter, StreamHandle used, std::uint64_t position) {
      if (waiter == used || position == 0) return true;
      auto target = s.streams.find(used);
      if (target == s.streams.end() || target->second.completed >= position) return true;
      // (a stream, the last of its positions whose ordering counts)
      std::vector<std::pair<StreamHandle, std::uint64_t>> todo{
          {waiter, std::numeric_limits<std::uint64_t>::max()}};
      std::unordered_map<StreamHandle, std::uint64_t> walked;  // the furthest bound walked
      while (!todo.empty()) {
        const auto [at_stream, bound] = todo.back();
        todo.pop_back();
        if (at_stream == used && bound >= position) return true;
        auto [seen, fresh] = walked.try_emplace(at_stream, bound);
        if (!fresh) {
          if (seen->second >= bound) continue;
          seen->second = bound;
        }
        auto it = s.streams.find(at_stream);
        if (it == s.streams.end()) continue;
        for (const auto& w : it->second.waits)
          if (w.at < bound) todo.emplace_back(w.stream, w.position);  // work after `at` waits
      }
      return false;
    };
    *follows = true;
    for (std::size_t i = 0; i < count && *follows; ++i) {
      const CapturePoint& p = points[i];
      if (p.capture != s.capture_id || p.nodes.size() % 2 != 0) {
        *follows = false;
        break;
      }
      for (std::size_t n = 0; n + 1 < p.nodes.size() && *follows; n += 2)
        *follows = after(stream, static_cast<StreamHandle>(p.nodes[n]), p.nodes[n + 1]);
    }
    return DeviceStatus::ok;
  });
}

}  // namespace reservoir
