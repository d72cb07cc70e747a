// CallProfile: a Backend that counts and times every call it forwards to another
// (every call ForwardingBackend passes through forward()).
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

#include "reservoir/forwarding_backend.hpp"

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

// The kind a device call is counted under.
CallKind kind_of(BackendCall call) noexcept;

class CallProfile final : public ForwardingBackend {
 public:
  // Throws std::invalid_argument (InvalidArgumentError) when inner is null.
  explicit CallProfile(std::shared_ptr<Backend> inner);

  // The kinds called at least once, in CallKind order.
  std::vector<CallCount> counts() const;

 protected:
  DeviceStatus forward(BackendCall call, const ForwardedCall& it) override;

 private:
  struct Slot {
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::uint64_t> ns{0};
  };
  std::array<Slot, static_cast<std::size_t>(CallKind::count_)> slots_;
};

}  // namespace reservoir::replay
