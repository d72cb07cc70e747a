// PrivatePool and PoolRegistry: ids, use counts and routes of a device's private
// pools. See private_pools.hpp for the invariants.
#include "engine/device/private_pools.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "reservoir/errors.hpp"
#include "util/checks.hpp"

namespace reservoir::detail {

StreamPool* PrivatePool::find(StreamHandle stream) const {
  std::lock_guard<std::mutex> guard(mutex_);
  for (StreamPool* p : streams_)
    if (p->stream() == stream) return p;
  return nullptr;
}

void PrivatePool::add(StreamPool* pool) {
  std::lock_guard<std::mutex> guard(mutex_);
  streams_.push_back(pool);
}

std::vector<StreamPool*> PrivatePool::streams() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return streams_;
}

// ---------------------------------------------------------------- pools

PoolRegistry::Pool PoolRegistry::find_locked(PoolId id) const {
  for (const Pool& p : pools_)
    if (p->id() == id) return p;
  return nullptr;
}

PoolRegistry::Pool PoolRegistry::retain(PoolId id, const PoolOptions& options,
                                        std::shared_ptr<SegmentSource> source, TagId tag) {
  std::lock_guard<std::mutex> guard(mutex_);
  return retain_locked(id, options, std::move(source), tag);
}

PoolRegistry::Pool PoolRegistry::retain_locked(PoolId id, const PoolOptions& options,
                                               std::shared_ptr<SegmentSource> source, TagId tag) {
  if (id.is_default())
    throw InvalidArgumentError(
        "reservoir: pool id (0, 0) names the default pools, not a private "
        "pool");
  if (Pool p = find_locked(id)) {
    if (p->use_count == 0)
      throw InvalidArgumentError("reservoir: private pool " + pool_name(id) +
                                 " was released; its memory is being returned (use a new id)");
    ++p->use_count;
    return p;
  }
  pools_.push_back(std::make_shared<PrivatePool>(id, options, std::move(source), tag));
  if (options.use_on_oom) use_on_oom_.store(true, std::memory_order_relaxed);
  return pools_.back();
}

void PoolRegistry::release(PoolId id) {
  std::lock_guard<std::mutex> guard(mutex_);
  Pool p = find_locked(id);
  if (!p)
    throw InvalidArgumentError("reservoir: cannot release private pool " + pool_name(id) +
                               ": no such pool");
  if (p->use_count == 0)
    throw InvalidArgumentError("reservoir: private pool " + pool_name(id) +
                               " was already released (more releases than uses)");
  --p->use_count;
}

int PoolRegistry::use_count(PoolId id) const {
  std::lock_guard<std::mutex> guard(mutex_);
  Pool p = find_locked(id);
  if (!p) throw InvalidArgumentError("reservoir: no private pool " + pool_name(id));
  return p->use_count;
}

PoolRegistry::Pool PoolRegistry::find(PoolId id) const {
  std::lock_guard<std::mutex> guard(mutex_);
  return find_locked(id);
}

std::optional<PoolFacts> PoolRegistry::facts(PoolId id) const {
  std::lock_guard<std::mutex> guard(mutex_);
  const Pool p = find_locked(id);
  if (!p) return std::nullopt;
  PoolFacts f;
  f.use_count = p->use_count;
  f.options = p->options();
  for (const Route& r : *routes_)
    if (r.pool == p) {
      f.routed = true;
      f.capture = r.capture;
    }
  return f;
}

std::vector<PoolRegistry::Pool> PoolRegistry::pools() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return pools_;
}

std::vector<PoolRegistry::Pool> PoolRegistry::released() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<Pool> out;
  for (const Pool& p : pools_)
    if (p->use_count == 0) out.push_back(p);
  return out;
}

std::vector<PoolRegistry::Pool> PoolRegistry::use_on_oom_pools() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<Pool> out;
  for (const Pool& p : pools_)
    if (p->options().use_on_oom) out.push_back(p);
  return out;
}

std::vector<PoolRegistry::Pool> PoolRegistry::take_dead() {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<Pool> dead;
  for (auto it = pools_.begin(); it != pools_.end();) {
    const Pool& p = *it;
    bool routed =
        std::any_of(routes_->begin(), routes_->end(), [&](const Route& r) { return r.pool == p; });
    bool holds = false;
    for (StreamPool* s : p->streams()) holds |= s->holds_segments();
    if (p->use_count == 0 && !routed && !holds) {
      dead.push_back(p);
      it = pools_.erase(it);
    } else {
      ++it;
    }
  }
  bool on_oom = false;
  for (const Pool& p : pools_) on_oom |= p->options().use_on_oom;
  use_on_oom_.store(on_oom, std::memory_order_relaxed);
  return dead;
}

// ---------------------------------------------------------------- routes

void PoolRegistry::publish(std::shared_ptr<const Routes> routes) {
  const bool on = !routes->empty();
  routing_.store(on, std::memory_order_release);
  if (on)
    flags_.fetch_or(bit_, std::memory_order_release);
  else
    flags_.fetch_and(static_cast<std::uint8_t>(~bit_), std::memory_order_release);
  routes_ = std::move(routes);
}

void PoolRegistry::begin(PoolId id, StreamFilter filter, bool capture, TagId tag) {
  if (!filter) throw InvalidArgumentError("reservoir: routing to a pool needs a stream filter");
  std::lock_guard<std::mutex> guard(mutex_);
  Pool existing = find_locked(id);
  if (existing && std::any_of(routes_->begin(), routes_->end(),
                              [&](const Route& r) { return r.pool == existing; }))
    throw InvalidArgumentError("reservoir: already routing allocations to private pool " +
                               pool_name(id) + " (end_allocate_to_pool first)");
  Pool p = retain_locked(id, PoolOptions{}, nullptr, tag);
  auto next = std::make_shared<Routes>(*routes_);
  next->push_back(Route{std::move(p), std::move(filter), capture});
  publish(std::move(next));
}

bool PoolRegistry::end(PoolId id) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto next = std::make_shared<Routes>(*routes_);
  auto it =
      std::find_if(next->begin(), next->end(), [&](const Route& r) { return r.pool->id() == id; });
  if (it == next->end())
    throw InvalidArgumentError("reservoir: not routing allocations to private pool " +
                               pool_name(id) + " (end_allocate_to_pool without begin)");
  const bool capture = it->capture;
  next->erase(it);
  publish(std::move(next));
  return capture;
}

PoolRegistry::Pool PoolRegistry::route(StreamHandle stream) const {
  std::shared_ptr<const Routes> routes;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    routes = routes_;
  }
  // Newest first: a route begun inside another (nested use_mem_pool) takes its requests.
  for (auto r = routes->rbegin(); r != routes->rend(); ++r)
    if (r->filter(stream)) return r->pool;
  return nullptr;
}

void PoolRegistry::validate() const {
  std::lock_guard<std::mutex> guard(mutex_);
  for (const Route& r : *routes_)
    RESERVOIR_CHECK(std::find(pools_.begin(), pools_.end(), r.pool) != pools_.end(),
                    "a route names private pool " + pool_name(r.pool->id()) + ", which is gone");
  RESERVOIR_CHECK(routing_.load() == !routes_->empty(), "routing flag disagrees with the routes");
  for (const Pool& p : pools_) {
    RESERVOIR_CHECK(p->use_count >= 0,
                    "private pool " + pool_name(p->id()) + " has a negative use");
    for (StreamPool* s : p->streams())
      RESERVOIR_CHECK(s->pool_id() == p->id(),
                      "a cache of private pool " + pool_name(p->id()) + " names another pool");
  }
}

}  // namespace reservoir::detail
