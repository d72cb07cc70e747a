// Defaults of the device seam: optional capabilities answer unsupported.
#include "reservoir/backend.hpp"

#include <atomic>
#include <chrono>
#include <cstring>

namespace reservoir {

namespace {
// A fixed buffer, not a std::string: thread-local objects with destructors are gone
// before static destructors run, which may still reach a backend.
thread_local char t_last_error[2048];

void set_last_error(const std::string& text) noexcept {
  std::size_t n = text.size() < sizeof t_last_error - 1 ? text.size() : sizeof t_last_error - 1;
  std::memcpy(t_last_error, text.data(), n);
  t_last_error[n] = '\0';
}

DeviceStatus unsupported(const char* what) {
  set_last_error(std::string(what) + ": not supported by this backend");
  return DeviceStatus::unsupported;
}
}  // namespace

const char* to_string(DeviceStatus status) noexcept {
  switch (status) {
    case DeviceStatus::ok:
      return "ok";
    case DeviceStatus::out_of_memory:
      return "out_of_memory";
    case DeviceStatus::not_ready:
      return "not_ready";
    case DeviceStatus::error:
      return "error";
    case DeviceStatus::unsupported:
      return "unsupported";
  }
  return "unknown";
}

Backend::~Backend() = default;

DeviceStatus Backend::fail(DeviceStatus status, const std::string& message) {
  set_last_error(message);
  return status;
}

std::string Backend::last_error() const {
  return t_last_error;
}

std::uint64_t Backend::now_us() const {
  using namespace std::chrono;
  return static_cast<std::uint64_t>(
      duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count());
}

DeviceStatus Backend::host_waited(int, StreamHandle) {
  return DeviceStatus::ok;
}

DeviceStatus Backend::capture_point(int, StreamHandle, CapturePoint*) {
  return unsupported("capture_point");
}

DeviceStatus Backend::capture_follows(int, StreamHandle, const CapturePoint*, std::size_t, bool*) {
  return unsupported("capture_follows");
}

DeviceStatus Backend::stream_wait_event(int, StreamHandle, EventHandle) {
  return unsupported("stream_wait_event");
}
DeviceStatus Backend::create_stream(int, StreamHandle* stream) {
  // Any distinct value is a stream for a backend that does not run work.
  static std::atomic<StreamHandle> next{0x10000};
  *stream = next.fetch_add(1);
  return DeviceStatus::ok;
}
DeviceStatus Backend::destroy_stream(int, StreamHandle) {
  return DeviceStatus::ok;
}
DeviceStatus Backend::granularity(int, std::size_t*) {
  return unsupported("granularity");
}
DeviceStatus Backend::reserve_address_range(int, std::size_t, std::size_t, void**) {
  return unsupported("reserve_address_range");
}
DeviceStatus Backend::release_address_range(int, void*, std::size_t) {
  return unsupported("release_address_range");
}
DeviceStatus Backend::create_physical(int, std::size_t, PhysicalHandle*) {
  return unsupported("create_physical");
}
DeviceStatus Backend::release_physical(int, PhysicalHandle) {
  return unsupported("release_physical");
}
DeviceStatus Backend::map(int, void*, std::size_t, PhysicalHandle) {
  return unsupported("map");
}
DeviceStatus Backend::unmap(int, void*, std::size_t) {
  return unsupported("unmap");
}
DeviceStatus Backend::set_access(int, void*, std::size_t, const int*, int) {
  return unsupported("set_access");
}
DeviceStatus Backend::allocate_host(int, std::size_t, void**) {
  return unsupported("allocate_host");
}
DeviceStatus Backend::free_host(int, void*) {
  return unsupported("free_host");
}
DeviceStatus Backend::copy_to_host(int, void*, const void*, std::size_t) {
  return unsupported("copy_to_host");
}
DeviceStatus Backend::copy_to_device(int, void*, const void*, std::size_t) {
  return unsupported("copy_to_device");
}
DeviceStatus Backend::copy_to_device_async(int, void*, const void*, std::size_t, StreamHandle) {
  return unsupported("copy_to_device_async");
}
DeviceStatus Backend::export_ipc(int, void*, IpcHandle*) {
  return unsupported("export_ipc");
}
DeviceStatus Backend::open_ipc(int, const IpcHandle&, void**) {
  return unsupported("open_ipc");
}
DeviceStatus Backend::close_ipc(int, void*) {
  return unsupported("close_ipc");
}
DeviceStatus Backend::export_shareable(int, PhysicalHandle, ShareableHandle::Kind,
                                       ShareableHandle*) {
  return unsupported("export_shareable");
}
DeviceStatus Backend::import_shareable(int, const ShareableHandle&, PhysicalHandle*) {
  return unsupported("import_shareable");
}
DeviceStatus Backend::create_pool(int, PoolHandle*) {
  return unsupported("create_pool");
}
DeviceStatus Backend::destroy_pool(int, PoolHandle) {
  return unsupported("destroy_pool");
}
DeviceStatus Backend::allocate_from_pool(int, PoolHandle, std::size_t, StreamHandle, void**) {
  return unsupported("allocate_from_pool");
}
DeviceStatus Backend::free_async(int, void*, StreamHandle) {
  return unsupported("free_async");
}
DeviceStatus Backend::set_pool_release_threshold(int, PoolHandle, std::uint64_t) {
  return unsupported("set_pool_release_threshold");
}
DeviceStatus Backend::trim_pool(int, PoolHandle, std::size_t) {
  return unsupported("trim_pool");
}
DeviceStatus Backend::pool_usage(int, PoolHandle, PoolUsage*) {
  return unsupported("pool_usage");
}
DeviceStatus Backend::reset_pool_peaks(int, PoolHandle) {
  return unsupported("reset_pool_peaks");
}
DeviceStatus Backend::set_pool_access(int, PoolHandle, const int*, int) {
  return unsupported("set_pool_access");
}
DeviceStatus Backend::process_memory(int, std::vector<ProcessMemory>*) {
  return unsupported("process_memory");
}
DeviceStatus Backend::can_access_peer(int, int, bool* can) {
  if (can) *can = false;
  return unsupported("can_access_peer");
}
DeviceStatus Backend::enable_peer_access(int, int) {
  return unsupported("enable_peer_access");
}

}  // namespace reservoir
