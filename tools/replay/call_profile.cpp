#include "call_profile.hpp"

#include <chrono>
#include <stdexcept>
#include <utility>

namespace reservoir::replay {

const char* to_string(CallKind kind) noexcept {
  switch (kind) {
    case CallKind::allocate:
      return "allocate";
    case CallKind::deallocate:
      return "deallocate";
    case CallKind::create_event:
      return "create_event";
    case CallKind::destroy_event:
      return "destroy_event";
    case CallKind::record_event:
      return "record_event";
    case CallKind::query_event:
      return "query_event";
    case CallKind::synchronize_event:
      return "synchronize_event";
    case CallKind::stream_wait_event:
      return "stream_wait_event";
    case CallKind::synchronize_stream:
      return "synchronize_stream";
    case CallKind::synchronize_device:
      return "synchronize_device";
    case CallKind::reserve_address_range:
      return "reserve_address_range";
    case CallKind::release_address_range:
      return "release_address_range";
    case CallKind::create_physical:
      return "create_physical";
    case CallKind::release_physical:
      return "release_physical";
    case CallKind::map:
      return "map";
    case CallKind::unmap:
      return "unmap";
    case CallKind::set_access:
      return "set_access";
    case CallKind::pool:
      return "pool";
    case CallKind::other:
      return "other";
    case CallKind::count_:
      break;
  }
  return "?";
}

CallProfile::CallProfile(std::shared_ptr<Backend> inner) : inner_(std::move(inner)) {
  if (!inner_) throw std::invalid_argument("CallProfile: no backend to profile");
}

std::vector<CallCount> CallProfile::counts() const {
  std::vector<CallCount> out;
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    const std::uint64_t n = slots_[k].count.load(std::memory_order_relaxed);
    if (n == 0) continue;
    out.push_back({static_cast<CallKind>(k), n, slots_[k].ns.load(std::memory_order_relaxed)});
  }
  return out;
}

template <class F>
DeviceStatus CallProfile::timed(CallKind kind, F&& call) {
  const auto start = std::chrono::steady_clock::now();
  const DeviceStatus status = call();
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  Slot& slot = slots_[static_cast<std::size_t>(kind)];
  slot.count.fetch_add(1, std::memory_order_relaxed);
  slot.ns.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
  return status;
}

// One forwarding body per function: the kind it counts under and the call.
#define RESERVOIR_FORWARD(kind, expr) return timed(CallKind::kind, [&] { return inner_->expr; })

DeviceStatus CallProfile::device_count(int* count) {
  RESERVOIR_FORWARD(other, device_count(count));
}
DeviceStatus CallProfile::current_device(int* device) {
  RESERVOIR_FORWARD(other, current_device(device));
}
DeviceStatus CallProfile::memory_info(int device, MemoryInfo* info) {
  RESERVOIR_FORWARD(other, memory_info(device, info));
}
DeviceStatus CallProfile::allocate(int device, std::size_t size, void** ptr) {
  RESERVOIR_FORWARD(allocate, allocate(device, size, ptr));
}
DeviceStatus CallProfile::deallocate(int device, void* ptr, std::size_t size) {
  RESERVOIR_FORWARD(deallocate, deallocate(device, ptr, size));
}
DeviceStatus CallProfile::create_event(int device, EventHandle* event) {
  RESERVOIR_FORWARD(create_event, create_event(device, event));
}
DeviceStatus CallProfile::destroy_event(int device, EventHandle event) {
  RESERVOIR_FORWARD(destroy_event, destroy_event(device, event));
}
DeviceStatus CallProfile::record_event(int device, EventHandle event, StreamHandle stream) {
  RESERVOIR_FORWARD(record_event, record_event(device, event, stream));
}
DeviceStatus CallProfile::query_event(int device, EventHandle event) {
  RESERVOIR_FORWARD(query_event, query_event(device, event));
}
DeviceStatus CallProfile::synchronize_event(int device, EventHandle event) {
  RESERVOIR_FORWARD(synchronize_event, synchronize_event(device, event));
}
DeviceStatus CallProfile::stream_wait_event(int device, StreamHandle stream, EventHandle event) {
  RESERVOIR_FORWARD(stream_wait_event, stream_wait_event(device, stream, event));
}
DeviceStatus CallProfile::synchronize_stream(int device, StreamHandle stream) {
  RESERVOIR_FORWARD(synchronize_stream, synchronize_stream(device, stream));
}
DeviceStatus CallProfile::create_stream(int device, StreamHandle* stream) {
  RESERVOIR_FORWARD(other, create_stream(device, stream));
}
DeviceStatus CallProfile::destroy_stream(int device, StreamHandle stream) {
  RESERVOIR_FORWARD(other, destroy_stream(device, stream));
}
DeviceStatus CallProfile::synchronize_device(int device) {
  RESERVOIR_FORWARD(synchronize_device, synchronize_device(device));
}
DeviceStatus CallProfile::granularity(int device, std::size_t* bytes) {
  RESERVOIR_FORWARD(other, granularity(device, bytes));
}
DeviceStatus CallProfile::reserve_address_range(int device, std::size_t size, std::size_t alignment,
                                                void** ptr) {
  RESERVOIR_FORWARD(reserve_address_range, reserve_address_range(device, size, alignment, ptr));
}
DeviceStatus CallProfile::release_address_range(int device, void* ptr, std::size_t size) {
  RESERVOIR_FORWARD(release_address_range, release_address_range(device, ptr, size));
}
DeviceStatus CallProfile::create_physical(int device, std::size_t size, PhysicalHandle* handle) {
  RESERVOIR_FORWARD(create_physical, create_physical(device, size, handle));
}
DeviceStatus CallProfile::release_physical(int device, PhysicalHandle handle) {
  RESERVOIR_FORWARD(release_physical, release_physical(device, handle));
}
DeviceStatus CallProfile::map(int device, void* ptr, std::size_t size, PhysicalHandle handle) {
  RESERVOIR_FORWARD(map, map(device, ptr, size, handle));
}
DeviceStatus CallProfile::unmap(int device, void* ptr, std::size_t size) {
  RESERVOIR_FORWARD(unmap, unmap(device, ptr, size));
}
DeviceStatus CallProfile::set_access(int device, void* ptr, std::size_t size, const int* devices,
                                     int count) {
  RESERVOIR_FORWARD(set_access, set_access(device, ptr, size, devices, count));
}
DeviceStatus CallProfile::export_ipc(int device, void* base, IpcHandle* handle) {
  RESERVOIR_FORWARD(other, export_ipc(device, base, handle));
}
DeviceStatus CallProfile::open_ipc(int device, const IpcHandle& handle, void** ptr) {
  RESERVOIR_FORWARD(other, open_ipc(device, handle, ptr));
}
DeviceStatus CallProfile::close_ipc(int device, void* ptr) {
  RESERVOIR_FORWARD(other, close_ipc(device, ptr));
}
DeviceStatus CallProfile::export_shareable(int device, PhysicalHandle handle,
                                           ShareableHandle::Kind kind, ShareableHandle* out) {
  RESERVOIR_FORWARD(other, export_shareable(device, handle, kind, out));
}
DeviceStatus CallProfile::import_shareable(int device, const ShareableHandle& shared,
                                           PhysicalHandle* handle) {
  RESERVOIR_FORWARD(other, import_shareable(device, shared, handle));
}
DeviceStatus CallProfile::create_pool(int device, PoolHandle* pool) {
  RESERVOIR_FORWARD(pool, create_pool(device, pool));
}
DeviceStatus CallProfile::destroy_pool(int device, PoolHandle pool) {
  RESERVOIR_FORWARD(pool, destroy_pool(device, pool));
}
DeviceStatus CallProfile::allocate_from_pool(int device, PoolHandle pool, std::size_t size,
                                             StreamHandle stream, void** ptr) {
  RESERVOIR_FORWARD(pool, allocate_from_pool(device, pool, size, stream, ptr));
}
DeviceStatus CallProfile::free_async(int device, void* ptr, StreamHandle stream) {
  RESERVOIR_FORWARD(pool, free_async(device, ptr, stream));
}
DeviceStatus CallProfile::set_pool_release_threshold(int device, PoolHandle pool,
                                                     std::uint64_t bytes) {
  RESERVOIR_FORWARD(pool, set_pool_release_threshold(device, pool, bytes));
}
DeviceStatus CallProfile::trim_pool(int device, PoolHandle pool, std::size_t keep) {
  RESERVOIR_FORWARD(pool, trim_pool(device, pool, keep));
}
DeviceStatus CallProfile::pool_usage(int device, PoolHandle pool, PoolUsage* out) {
  RESERVOIR_FORWARD(pool, pool_usage(device, pool, out));
}
DeviceStatus CallProfile::reset_pool_peaks(int device, PoolHandle pool) {
  RESERVOIR_FORWARD(pool, reset_pool_peaks(device, pool));
}
DeviceStatus CallProfile::set_pool_access(int device, PoolHandle pool, const int* devices,
                                          int count) {
  RESERVOIR_FORWARD(pool, set_pool_access(device, pool, devices, count));
}
DeviceStatus CallProfile::process_memory(int device, std::vector<ProcessMemory>* out) {
  RESERVOIR_FORWARD(other, process_memory(device, out));
}
DeviceStatus CallProfile::can_access_peer(int device, int peer, bool* can) {
  RESERVOIR_FORWARD(other, can_access_peer(device, peer, can));
}
DeviceStatus CallProfile::enable_peer_access(int device, int peer) {
  RESERVOIR_FORWARD(other, enable_peer_access(device, peer));
}

#undef RESERVOIR_FORWARD

}  // namespace reservoir::replay
