// CaptureOrder: where a stream's captured work stands, and what it follows.
#include "backend/cuda/capture_order.hpp"

#include <vector>

namespace reservoir::detail::cuda {

namespace {
std::uintptr_t key(CUgraphNode node) {
  return reinterpret_cast<std::uintptr_t>(node);
}
}  // namespace

CUresult CaptureOrder::point(const DriverApi& api, CUstream stream, bool* capturing,
                             CapturePoint* out) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUgraph graph = nullptr;
  const CUgraphNode* deps = nullptr;
  size_t count = 0;
  const CUresult r = api.StreamGetCaptureInfo(stream, &status, &id, &graph, &deps, &count);
  if (r != CUDA_SUCCESS) return r;
  *capturing = status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (!*capturing) return CUDA_SUCCESS;
  out->capture = id;
  out->nodes.clear();
  for (size_t i = 0; i < count; ++i) out->nodes.push_back(key(deps[i]));
  return CUDA_SUCCESS;
}

CUresult CaptureOrder::follows(const DriverApi& api, CUstream stream, const CapturePoint* points,
                               std::size_t count, bool* capturing, bool* follows) {
  CapturePoint now;
  if (CUresult r = point(api, stream, capturing, &now); r != CUDA_SUCCESS || !*capturing) return r;
  *follows = false;
  for (std::size_t i = 0; i < count; ++i)
    if (points[i].capture != now.capture) return CUDA_SUCCESS;  // another capture's: unproved

  std::lock_guard<std::mutex> guard(mutex_);
  if (reached_.size() > 64)  // streams of finished captures: their nodes are gone
    for (auto it = reached_.begin(); it != reached_.end();)
      it = it->second.capture != now.capture ? reached_.erase(it) : std::next(it);
  Reached& seen = reached_[stream];
  if (seen.capture != now.capture) seen = Reached{now.capture, {}};
  // Walk up from the dependencies, stopping at nodes reached before.
  std::vector<CUgraphNode> todo;
  for (std::uintptr_t n : now.nodes)
    if (seen.nodes.insert(n).second) todo.push_back(reinterpret_cast<CUgraphNode>(n));
  std::vector<CUgraphNode> parents;
  while (!todo.empty()) {
    CUgraphNode node = todo.back();
    todo.pop_back();
    size_t n = 0;
    if (CUresult r = api.GraphNodeGetDependencies(node, nullptr, &n); r != CUDA_SUCCESS) return r;
    parents.resize(n);
    if (n != 0) {
      if (CUresult r = api.GraphNodeGetDependencies(node, parents.data(), &n); r != CUDA_SUCCESS)
        return r;
    }
    for (size_t i = 0; i < n; ++i)
      if (seen.nodes.insert(key(parents[i])).second) todo.push_back(parents[i]);
  }
  for (std::size_t i = 0; i < count; ++i)
    for (std::uintptr_t n : points[i].nodes)
      if (seen.nodes.count(n) == 0) return CUDA_SUCCESS;
  *follows = true;
  return CUDA_SUCCESS;
}

}  // namespace reservoir::detail::cuda
