// LoggingBackend: a Backend adaptor that forwards every call to an inner backend and
// keeps, in order, the calls that place memory (allocate, deallocate, address
// reservations, physical maps) with the addresses the inner backend gave.
//
// Wrapped around SimBackend it records the device calls Reservoir's engine makes for a
// trace (the op lists of reservoir_placement_ops); around CudaBackend, where the
// driver put them (the placement probe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "op_list.hpp"
#include "reservoir/backend.hpp"

namespace reservoir_bench::placement {

using reservoir::Backend;
using reservoir::DeviceStatus;

struct PlacementCall {
  enum Kind : std::uint8_t { alloc, free, reserve, release, map, unmap };
  Kind kind = alloc;
  std::uint64_t size = 0;      // bytes asked for (free, release, unmap: of that range)
  std::uintptr_t address = 0;  // what the call returned (alloc, reserve) or was given
  DeviceStatus status = DeviceStatus::ok;
};

class LoggingBackend final : public Backend {
 public:
  explicit LoggingBackend(std::shared_ptr<Backend> inner);

  std::vector<PlacementCall> calls() const;
  void clear();
  Backend& inner() { return *inner_; }

  // ---- Backend: everything forwarded ----
  const char* name() const noexcept override { return inner_->name(); }
  std::uint32_t capabilities() const noexcept override { return inner_->capabilities(); }
  DeviceStatus device_count(int* count) override;
  DeviceStatus current_device(int* device) override;
  DeviceStatus memory_info(int device, reservoir::MemoryInfo* info) override;
  DeviceStatus allocate(int device, std::size_t size, void** ptr) override;
  DeviceStatus deallocate(int device, void* ptr, std::size_t size) override;
  DeviceStatus create_event(int device, reservoir::EventHandle* event) override;
  DeviceStatus destroy_event(int device, reservoir::EventHandle event) override;
  DeviceStatus record_event(int device, reservoir::EventHandle event,
                            reservoir::StreamHandle stream) override;
  DeviceStatus query_event(int device, reservoir::EventHandle event) override;
  DeviceStatus synchronize_event(int device, reservoir::EventHandle event) override;
  DeviceStatus stream_wait_event(int device, reservoir::StreamHandle stream,
                                 reservoir::EventHandle event) override;
  DeviceStatus synchronize_stream(int device, reservoir::StreamHandle stream) override;
  DeviceStatus create_stream(int device, reservoir::StreamHandle* stream) override;
  DeviceStatus destroy_stream(int device, reservoir::StreamHandle stream) override;
  DeviceStatus synchronize_device(int device) override;
  DeviceStatus granularity(int device, std::size_t* bytes) override;
  DeviceStatus reserve_address_range(int device, std::size_t size, std::size_t alignment,
                                     void** ptr) override;
  DeviceStatus release_address_range(int device, void* ptr, std::size_t size) override;
  DeviceStatus create_physical(int device, std::size_t size,
                               reservoir::PhysicalHandle* handle) override;
  DeviceStatus release_physical(int device, reservoir::PhysicalHandle handle) override;
  DeviceStatus map(int device, void* ptr, std::size_t size,
                   reservoir::PhysicalHandle handle) override;
  DeviceStatus unmap(int device, void* ptr, std::size_t size) override;
  DeviceStatus set_access(int device, void* ptr, std::size_t size, const int* devices,
                          int count) override;
  DeviceStatus export_ipc(int device, void* base, reservoir::IpcHandle* handle) override;
  DeviceStatus open_ipc(int device, const reservoir::IpcHandle& handle, void** ptr) override;
  DeviceStatus close_ipc(int device, void* ptr) override;
  DeviceStatus can_access_peer(int device, int peer, bool* can) override;
  DeviceStatus enable_peer_access(int device, int peer) override;
  std::uint64_t now_us() const override { return inner_->now_us(); }

 private:
  DeviceStatus log(PlacementCall::Kind kind, std::uint64_t size, std::uintptr_t address,
                   DeviceStatus status);

  std::shared_ptr<Backend> inner_;
  mutable std::mutex mutex_;
  std::vector<PlacementCall> calls_;
};

// The probe's log lines, one per call:
//   alloc SIZE 0xADDR | alloc SIZE failed STATUS | free 0xADDR |
//   reserve SIZE 0xADDR | reserve SIZE failed STATUS | release 0xADDR |
//   map SIZE 0xADDR | unmap SIZE 0xADDR
std::string format_calls(const std::vector<PlacementCall>& calls);
// Reads those lines back (a probe log: "#" lines and blank lines are skipped; free and
// release get size 0, failed calls address 0). Throws OpError "name:LINE: reason".
std::vector<PlacementCall> parse_calls(std::string_view text, const std::string& name);

// The op list that replays calls' successful allocations, frees (by index) and
// reservations on another device. Frees of addresses that no logged alloc returned
// are dropped (the list stays valid); maps are not ops.
OpList ops_from_calls(const std::vector<PlacementCall>& calls, std::string name);

// What the lead reads first about a log: how many allocations landed below the one
// before ("down") and how many inside a range freed earlier ("reuse").
struct PlacementSummary {
  std::size_t allocs = 0, failed = 0, down = 0, reuse = 0, reserves = 0;
};
PlacementSummary summarize(const std::vector<PlacementCall>& calls);

}  // namespace reservoir_bench::placement
