// A model of the CUDA driver's stream-ordered memory pool (cudaMallocAsync), for
// SimBackend's create_pool ... free_async (internal). What the driver does inside is
// not documented; the model keeps to what is (docs/async.md, "The simulated pool"):
//
// - Reuse rules. Memory freed on stream s is reused at once by allocations on s;
//   by allocations on another stream t once the free is known to be complete: the
//   work s had when it freed has finished (cudaMemPoolReuseAllowOpportunistic), or t
//   waited for an event recorded on s after the free
//   (cudaMemPoolReuseFollowEventDependencies).
// - Growth. A request no free range serves maps a new chunk of max(chunk_min,
//   round_up(size, chunk_granularity)) bytes (reserved memory is always a multiple
//   of 32 MiB on an H200). Free ranges coalesce with their neighbours inside a chunk;
//   a request is placed by best fit (address order breaks ties) or first fit.
// - Before growing, chunks that are entirely free are given back when
//   reuse_free_chunks is set (their memory goes to the new chunk).
// - Release. trim(keep) gives entirely free chunks back until reserved <= keep; the
//   release threshold does the same at every synchronization.
//
// Invariants (outside a call):
//   chunks_ tile no address twice; every live allocation and every free range lies
//     inside one chunk; free ranges (settled and pending) and live allocations never
//     overlap and together cover every chunk exactly;
//   usage_.reserved == sum of chunk sizes; usage_.used == sum of live sizes;
//   no two settled free ranges of one chunk touch (they are coalesced).
// Not thread-safe: SimBackend calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "reservoir/backend.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir::sim {

// How far each stream's work has got, as the pool asks it.
struct StreamProgress {
  // Work items of stream completed so far (positions <= this have finished).
  std::function<std::uint64_t(StreamHandle)> completed;
  // The highest position of stream s that stream t waited for (an event).
  std::function<std::uint64_t(StreamHandle t, StreamHandle s)> waited;
};

class PoolModel {
 public:
  // Maps a chunk of size bytes; false when the device has no memory for it.
  using Grow = std::function<bool(std::size_t size, std::uintptr_t* address)>;
  // Gives a chunk back to the device.
  using Shrink = std::function<void(std::uintptr_t address, std::size_t size)>;

  explicit PoolModel(const SimPoolOptions& options);

  // A range of at least size bytes usable by stream, or 0 when the device has no
  // memory for a new chunk (nothing changed but entirely free chunks given back).
  std::uintptr_t allocate(std::size_t size, StreamHandle stream, const StreamProgress& progress,
                          const Grow& grow, const Shrink& shrink);
  // Work of other streams (stream, position) that the freeing stream waited for.
  using Dependencies = std::vector<std::pair<StreamHandle, std::uint64_t>>;
  // Frees the live allocation at address after position of stream, and after the
  // work of other streams it waited for (after). "" or why not.
  std::string free(std::uintptr_t address, StreamHandle stream, std::uint64_t position,
                   Dependencies after, const StreamProgress& progress);
  // Gives entirely free chunks back until reserved <= keep (frees whose work has
  // completed count as free). Returns the bytes given back.
  std::size_t trim(std::size_t keep, const StreamProgress& progress, const Shrink& shrink);
  // Gives every chunk back (destroy_pool; pre: nothing live).
  void release_all(const Shrink& shrink);

  std::uint64_t release_threshold = 0;
  const PoolUsage& usage() const noexcept { return usage_; }
  void reset_peaks() noexcept {
    usage_.reserved_high = usage_.reserved;
    usage_.used_high = usage_.used;
  }
  std::size_t live() const noexcept { return live_.size(); }
  bool owns(std::uintptr_t address) const { return live_.count(address) != 0; }
  std::size_t chunks() const noexcept { return chunks_.size(); }
  // Pending frees looked at so far (settling and best fit), for a test that bounds
  // the work per request when frees stay pending.
  std::uint64_t pending_steps() const noexcept { return steps_; }

 private:
  struct Pending {  // a free not known to be complete yet
    std::uintptr_t address;
    std::size_t size;
    std::uint64_t position;
    Dependencies after;
  };
  // One stream's pending frees, by position (unique per stream: a split keeps its
  // entry's) and by size then position: a best fit walks the shorter of the two orders
  // and a settle stops at the first position its stream has not reached. (A scan of
  // every pending free at each request made a program whose work never completes
  // quadratic.)
  struct PendingQueue {
    using Iterator = std::map<std::uint64_t, Pending>::iterator;
    std::map<std::uint64_t, Pending> by_position;
    std::set<std::pair<std::size_t, std::uint64_t>> by_size;
    void add(Pending p) {
      by_size.insert({p.size, p.position});
      by_position.emplace(p.position, std::move(p));
    }
    Iterator erase(Iterator it) {
      by_size.erase({it->second.size, it->first});
      return by_position.erase(it);
    }
    // The best fit for size among the frees at positions <= limit (smallest, then
    // lowest position), or by_position.end().
    Iterator fit(std::size_t size, std::uint64_t limit, std::uint64_t* steps);
  };
  static bool complete(const Pending& p, StreamHandle stream, const StreamProgress& progress);
  std::size_t rounded(std::size_t size) const;
  std::uintptr_t chunk_of(std::uintptr_t address) const;
  // Makes the frees whose work completed reusable by every stream.
  void settle(const StreamProgress& progress);
  void insert_free(std::uintptr_t address, std::size_t size);  // coalescing
  void erase_free(std::map<std::uintptr_t, std::size_t>::iterator it);
  // A settled range for size bytes by the placement rule, or free_.end().
  std::map<std::uintptr_t, std::size_t>::iterator find_free(std::size_t size);
  // A pending free stream may reuse (its own, or one it waited past), or 0.
  std::uintptr_t take_pending(std::size_t size, StreamHandle stream,
                              const StreamProgress& progress);
  void take(std::uintptr_t address, std::size_t range, std::size_t size);
  void give_back_free_chunks(std::size_t keep, const Shrink& shrink);

  const SimPoolOptions options_;
  std::map<std::uintptr_t, std::size_t> chunks_;  // start -> size
  std::map<std::uintptr_t, std::size_t> free_;    // settled free ranges
  std::set<std::pair<std::size_t, std::uintptr_t>> by_size_;
  std::unordered_map<StreamHandle, PendingQueue> pending_;
  std::unordered_map<std::uintptr_t, std::size_t> live_;  // address -> size
  PoolUsage usage_;
  std::uint64_t steps_ = 0;
};

}  // namespace reservoir::sim
