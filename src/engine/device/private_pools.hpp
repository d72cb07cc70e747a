// Private pools of one device (the spec's PrivatePool, graph_pools and
// captures_underway): CUDA graph capture and MemPool keep memory apart from the
// default pools in them.
//
// A PrivatePool is a set of StreamPools, one per stream that allocated in it (blocks
// still belong to one stream, as in c10), owned by the DeviceEngine; the PoolRegistry
// keeps the pools by id, their use counts, and the routes: while begin..end routing
// to a pool is on, requests whose stream its filter accepts go to the pool (the
// route begun last that accepts wins, so nested routing takes the innermost pool).
//
// Invariants (under the registry mutex):
//   use_count >= 0; a pool with use_count == 0 is released ("freeable"): its cached
//     segments go back to the device when the device's caches are released, and the
//     pool is forgotten once it holds no segment and no route names it;
//   every route names a registered pool; at most one route per pool;
//   routing() == !routes.empty(); capture routes are counted in CaptureState.
// Lock order: registry mutex -> a StreamPool's lock (never the other way round).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/pool/stream_pool.hpp"
#include "engine/tags/tags.hpp"
#include "reservoir/pools.hpp"

namespace reservoir::detail {

// What the trace recorder needs of a pool it meets for the first time.
struct PoolFacts {
  int use_count = 0;
  PoolOptions options;
  bool routed = false;   // a route to it is on
  bool capture = false;  // that route is a capture's
};
// A pool's facts just before a call (nullopt: it did not exist).
using PoolBefore = std::optional<PoolFacts>;

class PrivatePool {
 public:
  PrivatePool(PoolId id, const PoolOptions& options, std::shared_ptr<SegmentSource> source,
              TagId tag = kNoTag)
      : id_(id), options_(options), source_(std::move(source)), tag_(tag) {}
  PoolId id() const noexcept { return id_; }
  // The tag its memory carries (the creating thread's; kNoTag: none). A tagged pool's
  // segments are expandable, so that it can sleep with its tag.
  TagId tag() const noexcept { return tag_; }
  const PoolOptions& options() const noexcept { return options_; }
  // Where its segments come from (null: the device).
  const std::shared_ptr<SegmentSource>& source() const noexcept { return source_; }
  // The pool's cache for stream, or nullptr.
  StreamPool* find(StreamHandle stream) const;
  void add(StreamPool* pool);
  std::vector<StreamPool*> streams() const;

  std::atomic<int> use_count{1};  // changed under the registry mutex

 private:
  const PoolId id_;
  const PoolOptions options_;
  const std::shared_ptr<SegmentSource> source_;
  const TagId tag_;
  mutable std::mutex mutex_;
  std::vector<StreamPool*> streams_;
};

class PoolRegistry {
 public:
  using Pool = std::shared_ptr<PrivatePool>;

  // flags gets bit set while any routing is on (the engine's one hot-path check).
  PoolRegistry(std::atomic<std::uint8_t>& flags, std::uint8_t bit) : flags_(flags), bit_(bit) {}

  // Cheap check for the allocation path: is any routing on?
  bool routing() const noexcept { return routing_.load(std::memory_order_relaxed); }
  bool any_use_on_oom() const noexcept { return use_on_oom_.load(std::memory_order_relaxed); }

  // Creates the pool (use count 1) or adds a use (createOrIncrefPool); options and
  // source (and tag) apply when it is created. Throws InvalidArgumentError for a
  // released pool that is not yet forgotten, or {0, 0}.
  Pool retain(PoolId id, const PoolOptions& options,
              std::shared_ptr<SegmentSource> source = nullptr, TagId tag = kNoTag);
  // Drops a use; at 0 the pool is released. Throws InvalidArgumentError for an
  // unknown or already released pool.
  void release(PoolId id);
  // Throws InvalidArgumentError for an unknown pool.
  int use_count(PoolId id) const;
  // The pool, or nullptr.
  Pool find(PoolId id) const;
  // Its use count, options and route now; nullopt for a pool not registered.
  std::optional<PoolFacts> facts(PoolId id) const;
  std::vector<Pool> pools() const;
  std::vector<Pool> released() const;
  std::vector<Pool> use_on_oom_pools() const;

  // Routing. begin retains the pool (creating it) and adds a route; throws
  // InvalidArgumentError when routing to it is already on. end removes the route
  // and returns whether it was a capture route; throws when there was none.
  void begin(PoolId id, StreamFilter filter, bool capture, TagId tag = kNoTag);
  bool end(PoolId id);
  // The pool of the route begun last whose filter accepts stream, or nullptr. Filters run
  // outside the registry mutex.
  Pool route(StreamHandle stream) const;

  // Forgets released pools that hold no segment and no route; returns them.
  std::vector<Pool> take_dead();
  // Walks the registry (for the validator): throws InvariantError on a violation.
  void validate() const;

 private:
  struct Route {
    Pool pool;
    StreamFilter filter;
    bool capture;
  };
  using Routes = std::vector<Route>;
  Pool find_locked(PoolId id) const;
  Pool retain_locked(PoolId id, const PoolOptions& options,
                     std::shared_ptr<SegmentSource> source = nullptr, TagId tag = kNoTag);
  void publish(std::shared_ptr<const Routes> routes);

  mutable std::mutex mutex_;
  std::vector<Pool> pools_;                                            // few: searched linearly
  std::shared_ptr<const Routes> routes_ = std::make_shared<Routes>();  // copied on write
  std::atomic<bool> routing_{false};
  std::atomic<std::uint8_t>& flags_;
  const std::uint8_t bit_;
  std::atomic<bool> use_on_oom_{false};
};

}  // namespace reservoir::detail
