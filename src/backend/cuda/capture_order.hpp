// The order of work inside a CUDA graph capture, from the graph being built: where a
// stream's captured work stands (its current dependencies) and whether work captured
// on a stream next follows given nodes (they are its dependencies or their ancestors).
//
// What a block freed during a capture needs (graph_capture_record_stream_reuse): once
// the stream that reuses it has joined every stream that used it, its new work is
// ordered after those uses in the graph. The walk goes from the stream's dependencies
// up their dependencies; the nodes a stream has reached stay reached for the rest of
// the capture (its next dependencies descend from them), so each stream's walk
// resumes where the last one stopped instead of walking the graph again.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "backend/cuda/driver_api.hpp"
#include "reservoir/backend.hpp"

namespace reservoir::detail::cuda {

class CaptureOrder {
 public:
  // stream's capture: *capturing false when it is not capturing (out untouched).
  static CUresult point(const DriverApi& api, CUstream stream, bool* capturing, CapturePoint* out);
  // Whether every node of points[0..count) is one of stream's dependencies or an
  // ancestor of one (false for a point of another capture); *capturing as above.
  CUresult follows(const DriverApi& api, CUstream stream, const CapturePoint* points,
                   std::size_t count, bool* capturing, bool* follows);

 private:
  // Invariant: nodes holds only nodes of capture `capture` that are ancestors of (or
  // are) the stream's dependencies at the last walk.
  struct Reached {
    std::uint64_t capture = 0;
    std::unordered_set<std::uintptr_t> nodes;
  };
  std::mutex mutex_;
  std::unordered_map<CUstream, Reached> reached_;
};

}  // namespace reservoir::detail::cuda
