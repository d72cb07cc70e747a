// ForwardingBackend: a Backend that hands every call to another one, the base of
// decorators (a backend that counts, times or logs the calls it passes on:
// reservoir-replay's CallProfile, the placement probe's LoggingBackend). A decorator
// overrides only what it observes: single calls, calling ForwardingBackend's from
// there, or forward(), which every device call passes through.
//
//   class Counting final : public ForwardingBackend {
//    public:
//     using ForwardingBackend::ForwardingBackend;
//     DeviceStatus allocate(int device, std::size_t size, void** ptr) override {
//       ++allocs;
//       return ForwardingBackend::allocate(device, size, ptr);
//     }
//     std::atomic<int> allocs{0};
//   };
//
// Every virtual of Backend is forwarded, so a decorator advertises what the inner
// backend can do (capabilities()) and does it; last_error() needs no forwarding (it is
// the calling thread's, whichever backend failed). tests/backend/forwarding_backend_test.cpp
// checks every virtual that backend.hpp declares against this class and BackendCall, so
// a call added to Backend and not forwarded here fails the tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "reservoir/backend.hpp"
#include "reservoir/export.hpp"
#include "reservoir/types.hpp"

namespace reservoir {

// The calls of the seam that answer a DeviceStatus, one per virtual of Backend, in
// backend.hpp's order (name, capabilities and now_us are queries, not device calls).
enum class BackendCall : std::uint8_t {
  device_count,
  current_device,
  memory_info,
  allocate,
  deallocate,
  create_event,
  destroy_event,
  record_event,
  query_event,
  synchronize_event,
  stream_wait_event,
  synchronize_stream,
  create_stream,
  destroy_stream,
  synchronize_device,
  host_waited,
  capture_point,
  capture_follows,
  granularity,
  reserve_address_range,
  release_address_range,
  create_physical,
  release_physical,
  map,
  unmap,
  set_access,
  allocate_host,
  free_host,
  copy_to_host,
  copy_to_device,
  copy_to_device_async,
  export_ipc,
  open_ipc,
  close_ipc,
  export_shareable,
  import_shareable,
  create_pool,
  destroy_pool,
  allocate_from_pool,
  free_async,
  set_pool_release_threshold,
  trim_pool,
  pool_usage,
  reset_pool_peaks,
  set_pool_access,
  process_memory,
  can_access_peer,
  enable_peer_access,
  count_
};
// The Backend function's name ("allocate").
RESERVOIR_API const char* to_string(BackendCall call) noexcept;

// A call on its way to the inner backend; calling it makes the call (once).
class ForwardedCall {
 public:
  template <class F>
  explicit ForwardedCall(F& body) noexcept
      : body_(&body), run_([](void* b) { return (*static_cast<F*>(b))(); }) {}
  DeviceStatus operator()() const { return run_(body_); }

 private:
  void* body_;
  DeviceStatus (*run_)(void*);
};

class RESERVOIR_API ForwardingBackend : public Backend {
 public:
  // Borrows inner: the caller keeps it alive as long as this backend is used.
  explicit ForwardingBackend(Backend& inner) noexcept : inner_(inner) {}
  // Shares inner, keeping it alive (throws InvalidArgumentError when it is null).
  explicit ForwardingBackend(std::shared_ptr<Backend> inner);
  ~ForwardingBackend() override;
  ForwardingBackend(const ForwardingBackend&) = delete;
  ForwardingBackend& operator=(const ForwardingBackend&) = delete;

  Backend& inner() const noexcept { return inner_; }

  // ---- Backend: every virtual, forwarded as it is ----
  const char* name() const noexcept override;
  std::uint32_t capabilities() const noexcept override;
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
  DeviceStatus host_waited(int device, StreamHandle stream) override;
  DeviceStatus capture_point(int device, StreamHandle stream, CapturePoint* out) override;
  DeviceStatus capture_follows(int device, StreamHandle stream, const CapturePoint* points,
                               std::size_t count, bool* follows) override;
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
  DeviceStatus allocate_host(int device, std::size_t size, void** ptr) override;
  DeviceStatus free_host(int device, void* ptr) override;
  DeviceStatus copy_to_host(int device, void* dst, const void* src, std::size_t bytes) override;
  DeviceStatus copy_to_device(int device, void* dst, const void* src, std::size_t bytes) override;
  DeviceStatus copy_to_device_async(int device, void* dst, const void* src, std::size_t bytes,
                                    StreamHandle stream) override;
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
  std::uint64_t now_us() const override;

 protected:
  // Every call of BackendCall passes through here with the inner backend's call as
  // it; the default makes it. A decorator that observes every call (counts, times)
  // overrides this rather than each call; it must run it once and answer its status.
  virtual DeviceStatus forward(BackendCall call, const ForwardedCall& it);

 private:
  template <class F>
  DeviceStatus pass(BackendCall call, F&& body) {
    return forward(call, ForwardedCall(body));
  }

  std::shared_ptr<Backend> owner_;  // null when inner is borrowed
  Backend& inner_;
};

}  // namespace reservoir
