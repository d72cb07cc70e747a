// ForwardingBackend: every virtual of the device seam handed to the inner backend.
#include "reservoir/forwarding_backend.hpp"

#include <iterator>
#include <utility>

#include "reservoir/errors.hpp"

namespace reservoir {

namespace {
Backend& checked(const std::shared_ptr<Backend>& inner) {
  if (!inner)
    throw InvalidArgumentError("reservoir: ForwardingBackend needs a backend to forward to");
  return *inner;
}
// Indexed by BackendCall.
constexpr const char* kCallNames[] = {"device_count",
                                      "current_device",
                                      "memory_info",
                                      "allocate",
                                      "deallocate",
                                      "create_event",
                                      "destroy_event",
                                      "record_event",
                                      "query_event",
                                      "synchronize_event",
                                      "stream_wait_event",
                                      "synchronize_stream",
                                      "create_stream",
                                      "destroy_stream",
                                      "synchronize_device",
                                      "host_waited",
                                      "capture_point",
                                      "capture_follows",
                                      "granularity",
                                      "reserve_address_range",
                                      "release_address_range",
                                      "create_physical",
                                      "release_physical",
                                      "map",
                                      "unmap",
                                      "set_access",
                                      "allocate_host",
                                      "free_host",
                                      "copy_to_host",
                                      "copy_to_device",
                                      "copy_to_device_async",
                                      "export_ipc",
                                      "open_ipc",
                                      "close_ipc",
                                      "export_shareable",
                                      "import_shareable",
                                      "create_pool",
                                      "destroy_pool",
                                      "allocate_from_pool",
                                      "free_async",
                                      "set_pool_release_threshold",
                                      "trim_pool",
                                      "pool_usage",
                                      "reset_pool_peaks",
                                      "set_pool_access",
                                      "process_memory",
                                      "can_access_peer",
                                      "enable_peer_access"};
static_assert(std::size(kCallNames) == static_cast<std::size_t>(BackendCall::count_),
              "a name for every BackendCall");
}  // namespace

const char* to_string(BackendCall call) noexcept {
  const auto k = static_cast<std::size_t>(call);
  return k < std::size(kCallNames) ? kCallNames[k] : "?";
}

ForwardingBackend::ForwardingBackend(std::shared_ptr<Backend> inner)
    : owner_(std::move(inner)), inner_(checked(owner_)) {}

ForwardingBackend::~ForwardingBackend() = default;

DeviceStatus ForwardingBackend::forward(BackendCall, const ForwardedCall& it) {
  return it();
}

const char* ForwardingBackend::name() const noexcept {
  return inner_.name();
}
std::uint32_t ForwardingBackend::capabilities() const noexcept {
  return inner_.capabilities();
}
DeviceStatus ForwardingBackend::device_count(int* count) {
  return pass(BackendCall::device_count, [&] { return inner_.device_count(count); });
}
DeviceStatus ForwardingBackend::current_device(int* device) {
  return pass(BackendCall::current_device, [&] { return inner_.current_device(device); });
}
DeviceStatus ForwardingBackend::memory_info(int device, MemoryInfo* info) {
  return pass(BackendCall::memory_info, [&] { return inner_.memory_info(device, info); });
}
DeviceStatus ForwardingBackend::allocate(int device, std::size_t size, void** ptr) {
  return pass(BackendCall::allocate, [&] { return inner_.allocate(device, size, ptr); });
}
DeviceStatus ForwardingBackend::deallocate(int device, void* ptr, std::size_t size) {
  return pass(BackendCall::deallocate, [&] { return inner_.deallocate(device, ptr, size); });
}
DeviceStatus ForwardingBackend::create_event(int device, EventHandle* event) {
  return pass(BackendCall::create_event, [&] { return inner_.create_event(device, event); });
}
DeviceStatus ForwardingBackend::destroy_event(int device, EventHandle event) {
  return pass(BackendCall::destroy_event, [&] { return inner_.destroy_event(device, event); });
}
DeviceStatus ForwardingBackend::record_event(int device, EventHandle event, StreamHandle stream) {
  return pass(BackendCall::record_event,
              [&] { return inner_.record_event(device, event, stream); });
}
DeviceStatus ForwardingBackend::query_event(int device, EventHandle event) {
  return pass(BackendCall::query_event, [&] { return inner_.query_event(device, event); });
}
DeviceStatus ForwardingBackend::synchronize_event(int device, EventHandle event) {
  return pass(BackendCall::synchronize_event,
              [&] { return inner_.synchronize_event(device, event); });
}
DeviceStatus ForwardingBackend::stream_wait_event(int device, StreamHandle stream,
                                                  EventHandle event) {
  return pass(BackendCall::stream_wait_event,
              [&] { return inner_.stream_wait_event(device, stream, event); });
}
DeviceStatus ForwardingBackend::synchronize_stream(int device, StreamHandle stream) {
  return pass(BackendCall::synchronize_stream,
              [&] { return inner_.synchronize_stream(device, stream); });
}
DeviceStatus ForwardingBackend::create_stream(int device, StreamHandle* stream) {
  return pass(BackendCall::create_stream, [&] { return inner_.create_stream(device, stream); });
}
DeviceStatus ForwardingBackend::destroy_stream(int device, StreamHandle stream) {
  return pass(BackendCall::destroy_stream, [&] { return inner_.destroy_stream(device, stream); });
}
DeviceStatus ForwardingBackend::synchronize_device(int device) {
  return pass(BackendCall::synchronize_device, [&] { return inner_.synchronize_device(device); });
}
DeviceStatus ForwardingBackend::host_waited(int device, StreamHandle stream) {
  return pass(BackendCall::host_waited, [&] { return inner_.host_waited(device, stream); });
}
DeviceStatus ForwardingBackend::capture_point(int device, StreamHandle stream, CapturePoint* out) {
  return pass(BackendCall::capture_point,
              [&] { return inner_.capture_point(device, stream, out); });
}
DeviceStatus ForwardingBackend::capture_follows(int device, StreamHandle stream,
                                                const CapturePoint* points, std::size_t count,
                                                bool* follows) {
  return pass(BackendCall::capture_follows,
              [&] { return inner_.capture_follows(device, stream, points, count, follows); });
}
DeviceStatus ForwardingBackend::granularity(int device, std::size_t* bytes) {
  return pass(BackendCall::granularity, [&] { return inner_.granularity(device, bytes); });
}
DeviceStatus ForwardingBackend::reserve_address_range(int device, std::size_t size,
                                                      std::size_t alignment, void** ptr) {
  return pass(BackendCall::reserve_address_range,
              [&] { return inner_.reserve_address_range(device, size, alignment, ptr); });
}
DeviceStatus ForwardingBackend::release_address_range(int device, void* ptr, std::size_t size) {
  return pass(BackendCall::release_address_range,
              [&] { return inner_.release_address_range(device, ptr, size); });
}
DeviceStatus ForwardingBackend::create_physical(int device, std::size_t size,
                                                PhysicalHandle* handle) {
  return pass(BackendCall::create_physical,
              [&] { return inner_.create_physical(device, size, handle); });
}
DeviceStatus ForwardingBackend::release_physical(int device, PhysicalHandle handle) {
  return pass(BackendCall::release_physical,
              [&] { return inner_.release_physical(device, handle); });
}
DeviceStatus ForwardingBackend::map(int device, void* ptr, std::size_t size,
                                    PhysicalHandle handle) {
  return pass(BackendCall::map, [&] { return inner_.map(device, ptr, size, handle); });
}
DeviceStatus ForwardingBackend::unmap(int device, void* ptr, std::size_t size) {
  return pass(BackendCall::unmap, [&] { return inner_.unmap(device, ptr, size); });
}
DeviceStatus ForwardingBackend::set_access(int device, void* ptr, std::size_t size,
                                           const int* devices, int count) {
  return pass(BackendCall::set_access,
              [&] { return inner_.set_access(device, ptr, size, devices, count); });
}
DeviceStatus ForwardingBackend::allocate_host(int device, std::size_t size, void** ptr) {
  return pass(BackendCall::allocate_host, [&] { return inner_.allocate_host(device, size, ptr); });
}
DeviceStatus ForwardingBackend::free_host(int device, void* ptr) {
  return pass(BackendCall::free_host, [&] { return inner_.free_host(device, ptr); });
}
DeviceStatus ForwardingBackend::copy_to_host(int device, void* dst, const void* src,
                                             std::size_t bytes) {
  return pass(BackendCall::copy_to_host,
              [&] { return inner_.copy_to_host(device, dst, src, bytes); });
}
DeviceStatus ForwardingBackend::copy_to_device(int device, void* dst, const void* src,
                                               std::size_t bytes) {
  return pass(BackendCall::copy_to_device,
              [&] { return inner_.copy_to_device(device, dst, src, bytes); });
}

DeviceStatus ForwardingBackend::copy_to_device_async(int device, void* dst, const void* src,
                                                     std::size_t bytes, StreamHandle stream) {
  return pass(BackendCall::copy_to_device_async,
              [&] { return inner_.copy_to_device_async(device, dst, src, bytes, stream); });
}
DeviceStatus ForwardingBackend::export_ipc(int device, void* base, IpcHandle* handle) {
  return pass(BackendCall::export_ipc, [&] { return inner_.export_ipc(device, base, handle); });
}
DeviceStatus ForwardingBackend::open_ipc(int device, const IpcHandle& handle, void** ptr) {
  return pass(BackendCall::open_ipc, [&] { return inner_.open_ipc(device, handle, ptr); });
}
DeviceStatus ForwardingBackend::close_ipc(int device, void* ptr) {
  return pass(BackendCall::close_ipc, [&] { return inner_.close_ipc(device, ptr); });
}
DeviceStatus ForwardingBackend::export_shareable(int device, PhysicalHandle handle,
                                                 ShareableHandle::Kind kind, ShareableHandle* out) {
  return pass(BackendCall::export_shareable,
              [&] { return inner_.export_shareable(device, handle, kind, out); });
}
DeviceStatus ForwardingBackend::import_shareable(int device, const ShareableHandle& shared,
                                                 PhysicalHandle* handle) {
  return pass(BackendCall::import_shareable,
              [&] { return inner_.import_shareable(device, shared, handle); });
}
DeviceStatus ForwardingBackend::create_pool(int device, PoolHandle* pool) {
  return pass(BackendCall::create_pool, [&] { return inner_.create_pool(device, pool); });
}
DeviceStatus ForwardingBackend::destroy_pool(int device, PoolHandle pool) {
  return pass(BackendCall::destroy_pool, [&] { return inner_.destroy_pool(device, pool); });
}
DeviceStatus ForwardingBackend::allocate_from_pool(int device, PoolHandle pool, std::size_t size,
                                                   StreamHandle stream, void** ptr) {
  return pass(BackendCall::allocate_from_pool,
              [&] { return inner_.allocate_from_pool(device, pool, size, stream, ptr); });
}
DeviceStatus ForwardingBackend::free_async(int device, void* ptr, StreamHandle stream) {
  return pass(BackendCall::free_async, [&] { return inner_.free_async(device, ptr, stream); });
}
DeviceStatus ForwardingBackend::set_pool_release_threshold(int device, PoolHandle pool,
                                                           std::uint64_t bytes) {
  return pass(BackendCall::set_pool_release_threshold,
              [&] { return inner_.set_pool_release_threshold(device, pool, bytes); });
}
DeviceStatus ForwardingBackend::trim_pool(int device, PoolHandle pool, std::size_t keep) {
  return pass(BackendCall::trim_pool, [&] { return inner_.trim_pool(device, pool, keep); });
}
DeviceStatus ForwardingBackend::pool_usage(int device, PoolHandle pool, PoolUsage* out) {
  return pass(BackendCall::pool_usage, [&] { return inner_.pool_usage(device, pool, out); });
}
DeviceStatus ForwardingBackend::reset_pool_peaks(int device, PoolHandle pool) {
  return pass(BackendCall::reset_pool_peaks, [&] { return inner_.reset_pool_peaks(device, pool); });
}
DeviceStatus ForwardingBackend::set_pool_access(int device, PoolHandle pool, const int* devices,
                                                int count) {
  return pass(BackendCall::set_pool_access,
              [&] { return inner_.set_pool_access(device, pool, devices, count); });
}
DeviceStatus ForwardingBackend::process_memory(int device, std::vector<ProcessMemory>* out) {
  return pass(BackendCall::process_memory, [&] { return inner_.process_memory(device, out); });
}
DeviceStatus ForwardingBackend::can_access_peer(int device, int peer, bool* can) {
  return pass(BackendCall::can_access_peer,
              [&] { return inner_.can_access_peer(device, peer, can); });
}
DeviceStatus ForwardingBackend::enable_peer_access(int device, int peer) {
  return pass(BackendCall::enable_peer_access,
              [&] { return inner_.enable_peer_access(device, peer); });
}
std::uint64_t ForwardingBackend::now_us() const {
  return inner_.now_us();
}

}  // namespace reservoir
