// Allocator::Impl: what the C++ front keeps for one Allocator (the engines, the
// layers around the request path, the IPC service, the configuration), shared by the
// front's files (allocator.cpp, tags.cpp).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/allocators/caching_allocator.hpp"
#include "front/ipc_service.hpp"
#include "front/request_layers.hpp"
#include "reservoir/allocator.hpp"
#include "util/compiler.hpp"
#include "util/format.hpp"

namespace reservoir {

namespace front_detail {
inline constexpr std::size_t kOneEiB = std::size_t{1} << 60;

[[noreturn]] [[gnu::cold]] inline void too_large(std::size_t size, int device) {
  throw OutOfMemoryError(
      "CUDA out of memory. Tried to allocate more than 1EB memory. Reservoir: "
      "the request of " +
      detail::format_size(size) + " (" + std::to_string(size) + " bytes) on device " +
      std::to_string(device) +
      " is larger than any device (a negative size converted to unsigned?)");
}
}  // namespace front_detail

struct Allocator::Impl {
  std::shared_ptr<Backend> backend;
  int device_count = 0;
  // What device -1 ("the current device") means without asking the backend: 0 when
  // there is one device (the only device that can be current), else -1 (ask).
  int implicit_device = -1;
  // The caching engine, whose ledgers, peers and history every engine keeps: always there.
  std::unique_ptr<detail::CachingAllocator> core;
  // The engine in force when it is not core: the uncached mode (RESERVOIR_NO_CACHING=1)
  // or backend:cudaMallocAsync. What sets the engines apart, the front asks base.
  std::unique_ptr<detail::BlockResource> other;
  detail::BlockResource* base = nullptr;              // core or other
  std::atomic<detail::MemoryResource*> top{nullptr};  // base, or layers around it
  std::unique_ptr<detail::IpcService> ipc;            // share / open (docs/ipc.md)

  // The layers in force, and every layer ever made (a thread may still be inside a
  // layer that was just taken out of the chain, so none is destroyed before this).
  std::mutex layers_mutex;
  std::vector<std::unique_ptr<detail::MemoryResource>> layers;
  detail::TraceRecordingLayer* recording = nullptr;
  std::string oom_snapshot_path;
  Config config;  // what config() returns: updated with the engine's

  int resolve(int device) {
    if (device < -1)
      throw InvalidArgumentError("reservoir: device " + std::to_string(device) +
                                 " does not exist (use -1 for the current device)");
    if (device == -1) {
      int current = 0;
      if (backend->current_device(&current) != DeviceStatus::ok)
        throw DeviceError("reservoir: reading the current device failed: " + backend->last_error());
      device = current;
    }
    if (device >= device_count)
      throw InvalidArgumentError("reservoir: device " + std::to_string(device) +
                                 " does not exist (" + backend->name() + " backend has " +
                                 std::to_string(device_count) + " device(s))");
    return device;
  }
  detail::DeviceEngine& engine(int device) { return core->engine(resolve(device)); }
  // Allocator::allocate past its one test: size 0 or too large, device -1 or
  // invalid, or layers in the chain.
  RESERVOIR_COLD void* allocate_checked(std::size_t size, StreamHandle stream, int device) {
    if (size == 0) return nullptr;
    const int d = resolve(device);
    if (size >= front_detail::kOneEiB) front_detail::too_large(size, d);
    return top.load(std::memory_order_acquire)->allocate(size, stream, d);
  }
  detail::DeviceEngine& pool_engine(int device);  // throws where the engine has no pools
  // The recording layer's questions about pools; where the engine keeps no pools
  // there are none to route to.
  detail::PoolQueries pool_queries() {
    if (!base->traits().pool_refusal.empty())
      return {[](StreamHandle, int) { return PoolId{}; },
              [](PoolId, int) { return detail::PoolBefore{}; }};
    return {[this](StreamHandle stream, int device) { return engine(device).routed_pool(stream); },
            [this](PoolId pool, int device) { return engine(device).pool_facts(pool); }};
  }
  // Runs op (a sleep, a wake, an empty_cache); while a trace is recorded, in its place
  // among the requests, written by record (TraceRecordingLayer::run_recorded).
  void recorded(const std::function<void()>& op,
                const std::function<void(detail::TraceRecorder&)>& record) {
    detail::TraceRecordingLayer* layer;
    {
      std::lock_guard<std::mutex> guard(layers_mutex);
      layer = recording;  // layers are never destroyed before this
    }
    if (layer)
      layer->run_recorded(op, record);
    else
      op();
  }

  // A pool call (op on the pool's engine), recorded as recorded() does; record also
  // gets the pool's facts from just before op (what a recording that begins after
  // the pool was made must write first).
  template <class Op, class Record>
  void recorded_pool(int device, PoolId pool, Op op, Record record) {
    detail::DeviceEngine& e = pool_engine(device);
    detail::PoolBefore before;
    recorded(
        [&] {
          before = e.pool_facts(pool);
          op(e);
        },
        [&](detail::TraceRecorder& r) { record(r, before); });
  }

  // Rebuilds the chain above the recording layer (under layers_mutex).
  void relink(Allocator& owner) {
    detail::MemoryResource* next =
        recording ? static_cast<detail::MemoryResource*>(recording) : base;
    if (!oom_snapshot_path.empty()) {
      layers.push_back(std::make_unique<detail::OomSnapshotLayer>(
          *next, oom_snapshot_path, [&owner](const std::string& p) { owner.dump_snapshot(p); }));
      next = layers.back().get();
    }
    top.store(next, std::memory_order_release);
  }
  // Starts (path) or stops ("") trace recording; throws when path cannot be opened,
  // leaving a running recording as it was.
  void set_recording(Allocator& owner, const std::string& path) {
    std::lock_guard<std::mutex> guard(layers_mutex);
    std::unique_ptr<detail::TraceRecordingLayer> next;
    if (!path.empty())
      next = std::make_unique<detail::TraceRecordingLayer>(*base, path, &core->hooks(),
                                                           pool_queries());
    if (recording) recording->close();
    recording = next.get();
    if (next) layers.push_back(std::move(next));
    relink(owner);
  }
  void set_oom_snapshot(Allocator& owner, const std::string& path) {
    std::lock_guard<std::mutex> guard(layers_mutex);
    if (path == oom_snapshot_path) return;
    oom_snapshot_path = path;
    relink(owner);
  }
};

}  // namespace reservoir
