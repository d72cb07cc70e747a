// CallProfile: a Backend that counts and times every call it forwards to another.
//
// reservoir-replay --calls puts it between the allocator and the device, so a report
// can say which device calls a setting makes and where the host time goes (on a GPU
// each driver call costs microseconds, far more than the engine's own work).
//
//   auto profile = std::make_shared<CallProfile>(backend);
//   Allocator alloc(profile, config);
//   ... ;
//   for (const CallCount& c : profile->counts()) ...
//
// Invariant: for every kind k, counts()[k].count == calls of k forwarded so far and
// counts()[k].ns == the host time spent inside them (steady clock), both
// monotonic. The clock reads add ~40 ns to each call timed; now_us() is forwarded
// without being timed (history timestamps; not a device call).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "reservoir/backend.hpp"

namespace reservoir::replay {

enum class CallKind : std::uint8_t {
  allocate,
  deallocate,
  create_event,
  destroy_event,
  record_event,
  query_event,
  synchronize_event,
  stream_wait_event,
  synchronize_stream,
  synchronize_device,
  reserve_address_range,
  release_address_range,
  create_physical,
  release_physical,
  map,
  unmap,
  set_access,
  pool,   // stream-ordered pool calls (create, allocate, free, trim, ...)
  other,  // device queries, IPC, peers, streams
  count_
};

// The backend function names a kind stands for, as reports print them.
const char* to_string(CallKind kind) noexcept;

struct CallCount {
  CallKind kind = CallKind::other;
  std::uint64_t count = 0;
  std::uint64_t ns = 0;  // host time inside the calls
};

class CallProfile final : public Backend {
 public:
  explicit CallProfile(std::shared_ptr<Backend> inner);

  // The kinds called at least once, in CallKind order.
  std::vector<CallCount> counts() const;

  const char* name() const noexcept override { return inner_->name(); }
  std::uint32_t capabilities() const noexcept override { return inner_->capabilities(); }
  DeviceStatus device_count(int* count) override;
  DeviceStatus current_device(int* device) override;
  DeviceStatus memory_info(int device, MemoryInfo* info) override;
  DeviceStatus allocate(int device, std::size_t size, void** ptr) override;
  DeviceStatus deallocate(int device, void* ptr, std::size_t size) override;
  DeviceStatus create_event(int device, EventHandle* event) override;
  DeviceStatus destroy_event(int device, EventHandle event) override;
  DeviceStatus record_event(int device, EventHandle event, StreamHandle stream) override;
  DeviceStatus query_event(int device, EventHandle event) override;
  DeviceStatus synchronize_event(int device, EventHandle event) override;
  DeviceStatus stream_wait_event(int device, StreamHandle stream, EventHandle event) override;
  DeviceStatus synchronize_stream(int device, StreamHandle stream) override;
  DeviceStatus create_stream(int device, StreamHandle* stream) override;
  DeviceStatus destroy_stream(int device, StreamHandle stream) override;
  DeviceStatus synchronize_device(int device) override;
  DeviceStatus granularity(int device, std::size_t* bytes) override;
  DeviceStatus reserve_address_range(int device, std::size_t size, std::size_t alignment,
                                     void** ptr) override;
  DeviceStatus release_address_range(int device, void* ptr, std::size_t size) override;
  DeviceStatus create_physical(int device, std::size_t size, PhysicalHandle* handle) override;
  DeviceStatus release_physical(int device, PhysicalHandle handle) override;
  DeviceStatus map(int device, void* ptr, std::size_t size, PhysicalHandle handle) override;
  DeviceStatus unmap(int device, void* ptr, std::size_t size) override;
  DeviceStatus set_access(int device, void* ptr, std::size_t size, const int* devices,
                          int count) override;
  DeviceStatus export_ipc(int device, void* base, IpcHandle* handle) override;
  DeviceStatus open_ipc(int device, const IpcHandle& handle, void** ptr) override;
  DeviceStatus close_ipc(int device, void* ptr) override;
  DeviceStatus export_shareable(int device, PhysicalHandle handle, ShareableHandle::Kind kind,
                                ShareableHandle* out) override;
  DeviceStatus import_shareable(int device, const ShareableHandle& shared,
                                PhysicalHandle* handle) override;
  DeviceStatus create_pool(int device, PoolHandle* pool) override;
  DeviceStatus destroy_pool(int device, PoolHandle pool) override;
  DeviceStatus allocate_from_pool(int device, PoolHandle pool, std::size_t size,
                                  StreamHandle stream, void** ptr) override;
  DeviceStatus free_async(int device, void* ptr, StreamHandle stream) override;
  DeviceStatus set_pool_release_threshold(int device, PoolHandle pool,
                                          std::uint64_t bytes) override;
  DeviceStatus trim_pool(int device, PoolHandle pool, std::size_t keep) override;
  DeviceStatus pool_usage(int device, PoolHandle pool, PoolUsage* out) override;
  DeviceStatus reset_pool_peaks(int device, PoolHandle pool) override;
  DeviceStatus set_pool_access(int device, PoolHandle pool, const int* devices, int count) override;
  DeviceStatus process_memory(int device, std::vector<ProcessMemory>* out) override;
  DeviceStatus can_access_peer(int device, int peer, bool* can) override;
  DeviceStatus enable_peer_access(int device, int peer) override;
  std::uint64_t now_us() const override { return inner_->now_us(); }

 private:
  template <class F>
  DeviceStatus timed(CallKind kind, F&& call);

  struct Slot {
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::uint64_t> ns{0};
  };
  std::shared_ptr<Backend> inner_;
  std::array<Slot, static_cast<std::size_t>(CallKind::count_)> slots_;
};

}  // namespace reservoir::replay
