#include "call_profile.hpp"

#include <chrono>
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

CallKind kind_of(BackendCall call) noexcept {
  switch (call) {
    case BackendCall::allocate:
      return CallKind::allocate;
    case BackendCall::deallocate:
      return CallKind::deallocate;
    case BackendCall::create_event:
      return CallKind::create_event;
    case BackendCall::destroy_event:
      return CallKind::destroy_event;
    case BackendCall::record_event:
      return CallKind::record_event;
    case BackendCall::query_event:
      return CallKind::query_event;
    case BackendCall::synchronize_event:
      return CallKind::synchronize_event;
    case BackendCall::stream_wait_event:
      return CallKind::stream_wait_event;
    case BackendCall::synchronize_stream:
      return CallKind::synchronize_stream;
    case BackendCall::synchronize_device:
      return CallKind::synchronize_device;
    case BackendCall::reserve_address_range:
      return CallKind::reserve_address_range;
    case BackendCall::release_address_range:
      return CallKind::release_address_range;
    case BackendCall::create_physical:
      return CallKind::create_physical;
    case BackendCall::release_physical:
      return CallKind::release_physical;
    case BackendCall::map:
      return CallKind::map;
    case BackendCall::unmap:
      return CallKind::unmap;
    case BackendCall::set_access:
      return CallKind::set_access;
    case BackendCall::create_pool:
    case BackendCall::destroy_pool:
    case BackendCall::allocate_from_pool:
    case BackendCall::free_async:
    case BackendCall::set_pool_release_threshold:
    case BackendCall::trim_pool:
    case BackendCall::pool_usage:
    case BackendCall::reset_pool_peaks:
    case BackendCall::set_pool_access:
      return CallKind::pool;
    case BackendCall::device_count:  // device queries, streams, captures, IPC, processes, peers
    case BackendCall::current_device:
    case BackendCall::memory_info:
    case BackendCall::create_stream:
    case BackendCall::host_waited:
    case BackendCall::capture_point:  // the order inside a graph capture
    case BackendCall::capture_follows:
    case BackendCall::destroy_stream:
    case BackendCall::granularity:
    case BackendCall::export_ipc:
    case BackendCall::open_ipc:
    case BackendCall::close_ipc:
    case BackendCall::export_shareable:
    case BackendCall::import_shareable:
    case BackendCall::process_memory:
    case BackendCall::can_access_peer:
    case BackendCall::enable_peer_access:
    case BackendCall::allocate_host:  // host memory and copies (putting memory to sleep)
    case BackendCall::free_host:
    case BackendCall::copy_to_host:
    case BackendCall::copy_to_device:
    case BackendCall::copy_to_device_async:
    case BackendCall::count_:
      break;
  }
  return CallKind::other;
}

CallProfile::CallProfile(std::shared_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {}

std::vector<CallCount> CallProfile::counts() const {
  std::vector<CallCount> out;
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    const std::uint64_t n = slots_[k].count.load(std::memory_order_relaxed);
    if (n == 0) continue;
    out.push_back({static_cast<CallKind>(k), n, slots_[k].ns.load(std::memory_order_relaxed)});
  }
  return out;
}

DeviceStatus CallProfile::forward(BackendCall call, const ForwardedCall& it) {
  const auto start = std::chrono::steady_clock::now();
  const DeviceStatus status = it();
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  Slot& slot = slots_[static_cast<std::size_t>(kind_of(call))];
  slot.count.fetch_add(1, std::memory_order_relaxed);
  slot.ns.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
  return status;
}

}  // namespace reservoir::replay
