#include "engine/streams/waiting_pools.hpp"

#include <algorithm>

namespace reservoir::detail {

void WaitingPools::add(StreamHandle stream, StreamPool* pool) {
  std::lock_guard<std::mutex> guard(mutex_);
  waiting_[stream].push_back(pool);
  ++pairs_;
}

// Unordered removal: the order of a stream's pools means nothing.
void WaitingPools::remove(StreamHandle stream, StreamPool* pool) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = waiting_.find(stream);
  if (it == waiting_.end()) return;
  std::vector<StreamPool*>& pools = it->second;
  auto at = std::find(pools.begin(), pools.end(), pool);
  if (at == pools.end()) return;
  *at = pools.back();
  pools.pop_back();
  --pairs_;
  // A stream no pool waits for leaves the map: streams come and go by the million.
  if (pools.empty()) waiting_.erase(it);
}

std::vector<StreamPool*> WaitingPools::of(StreamHandle stream) const {
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = waiting_.find(stream);
  return it == waiting_.end() ? std::vector<StreamPool*>{} : it->second;
}

bool WaitingPools::lists(StreamHandle stream, const StreamPool* pool) const {
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = waiting_.find(stream);
  return it != waiting_.end() &&
         std::find(it->second.begin(), it->second.end(), pool) != it->second.end();
}

std::size_t WaitingPools::pairs() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return pairs_;
}

}  // namespace reservoir::detail
