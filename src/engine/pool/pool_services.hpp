// PoolServices: everything a cache shard (StreamPool) uses that is not its own — the
// narrow, one-way interface between a shard and its device. The DeviceEngine owns
// each piece and hands the shard this bundle; the shard never calls the engine.
//
// settings changes only while every shard of the device is locked (a configuration
// update), so a shard reads it freely under its own lock.
#pragma once

#include <cstddef>

#include "engine/books/segment_registry.hpp"
#include "engine/books/size_policy.hpp"
#include "engine/pool/device_state.hpp"
#include "engine/pool/host_stash.hpp"
#include "engine/stats/history.hpp"
#include "engine/stats/stat_ledger.hpp"
#include "engine/streams/event_pool.hpp"
#include "engine/streams/waiting_pools.hpp"
#include "reservoir/backend.hpp"
#include "reservoir/config.hpp"

namespace reservoir::detail {

// The configuration as the shards use it.
struct PoolSettings {
  explicit PoolSettings(const Config& config)
      : policy(config),
        release_lock_on_device_alloc(config.release_lock_on_cudamalloc),
        capture_reuse(config.graph_capture_record_stream_reuse),
        expandable_reserve(config.expandable_segments_reserve),
        expandable_reserve_fraction(config.expandable_segments_reserve_fraction) {}
  SizePolicy policy;
  bool release_lock_on_device_alloc;
  bool capture_reuse;                  // graph_capture_record_stream_reuse
  std::size_t expandable_reserve;      // bytes per expandable segment (0: see below)
  double expandable_reserve_fraction;  // of device memory when > 0 (else memory + 1/8)
};

struct PoolServices {
  Backend& backend;
  const int device;
  EventPool& events;
  StatLedger& ledger;
  SegmentRegistry& segments;
  DeviceBudget& budget;
  DeviceCounters& counters;
  GcClock& gc;
  PeerSet& peers;
  History& history;
  const PoolSettings& settings;
  CaptureState& capture;
  WaitingPools& waiting;  // which pools wait on which stream (host waits visit those)
  HostStash& host_stash;  // pinned host buffers of offloads (sleep)

  const SizePolicy& policy() const noexcept { return settings.policy; }
  // A history entry (call only when history.active()).
  void trace(TraceAction action, std::uintptr_t address, std::size_t size, StreamHandle stream,
             const Context& context, PoolId pool = {}) const {
    history.record(
        TraceEntry{action, device, address, size, stream, backend.now_us(), context, pool});
  }
};

}  // namespace reservoir::detail
