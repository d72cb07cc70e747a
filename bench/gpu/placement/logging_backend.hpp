// LoggingBackend: a ForwardingBackend (every call goes to an inner backend) that
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
#include "reservoir/forwarding_backend.hpp"

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

class LoggingBackend final : public reservoir::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;  // of a borrowed or a shared backend

  std::vector<PlacementCall> calls() const;
  void clear();

  // ---- Backend: the calls that place memory are logged, the rest forwarded ----
  DeviceStatus allocate(int device, std::size_t size, void** ptr) override;
  DeviceStatus deallocate(int device, void* ptr, std::size_t size) override;
  DeviceStatus reserve_address_range(int device, std::size_t size, std::size_t alignment,
                                     void** ptr) override;
  DeviceStatus release_address_range(int device, void* ptr, std::size_t size) override;
  DeviceStatus map(int device, void* ptr, std::size_t size,
                   reservoir::PhysicalHandle handle) override;
  DeviceStatus unmap(int device, void* ptr, std::size_t size) override;

 private:
  DeviceStatus log(PlacementCall::Kind kind, std::uint64_t size, std::uintptr_t address,
                   DeviceStatus status);

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
