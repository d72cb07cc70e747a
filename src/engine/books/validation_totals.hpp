// ValidationTotals: what a validation pass sums across the pools of a device (every
// StreamPool and the CompactPool add theirs; DeviceEngine checks the sums against the
// device's statistics and segment map). Here, below both pools, so that neither
// includes the other.
#pragma once

#include <cstddef>
#include <cstdint>

namespace reservoir::detail {

// reserved == sum over the pools of the bytes of device memory each holds;
// segments == sum over the pools of their segments (arenas for the compact pool);
// use_queues == sum over the stream pools of their use queues (one per stream their
//   pending frees wait on): the device's list of waiting pools holds as many pairs;
// counted[k][p] == sum over the pools of what their blocks make of statistic kind k
//   (StatKind's order, stat_ledger.hpp) in pool p (0 small, 1 large): what the
//   device's statistics shards must add up to.
struct ValidationTotals {
  static constexpr int kKinds = 11;
  std::size_t reserved = 0;
  std::size_t segments = 0;
  std::size_t use_queues = 0;
  std::int64_t counted[kKinds][2] = {};
};

}  // namespace reservoir::detail
