// WaitingPools: which of a device's pools wait for events on which stream, so that a
// host wait on one stream visits only the pools with frees pending there (a program
// with thousands of streams synchronizing each in turn would otherwise pay for every
// pool at every wait).
// Invariant: (stream, pool) is listed iff the pool has a use queue for stream (empty or
//   not; StreamPool keeps it in step under its own lock); each pair at most once; no
//   stream maps to an empty list.
// Locking: one mutex, a leaf: taken under a pool's lock, never held while taking one.
#pragma once

#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "reservoir/types.hpp"

namespace reservoir::detail {

class StreamPool;

class WaitingPools {
 public:
  void add(StreamHandle stream, StreamPool* pool);
  void remove(StreamHandle stream, StreamPool* pool);
  // The pools waiting on stream now (they may stop waiting once the lock is dropped).
  std::vector<StreamPool*> of(StreamHandle stream) const;
  // For the validator.
  bool lists(StreamHandle stream, const StreamPool* pool) const;
  std::size_t pairs() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<StreamHandle, std::vector<StreamPool*>> waiting_;
  std::size_t pairs_ = 0;
};

}  // namespace reservoir::detail
