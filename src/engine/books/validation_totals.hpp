// ValidationTotals: what a validation pass sums across the pools of a device (every
// StreamPool and the CompactPool add theirs; DeviceEngine checks the sums against the
// device's statistics and segment map). Here, below both pools, so that neither
// includes the other.
#pragma once

#include <cstddef>

namespace reservoir::detail {

// reserved == sum over the pools of the bytes of device memory each holds;
// segments == sum over the pools of their segments (arenas for the compact pool).
struct ValidationTotals {
  std::size_t reserved = 0;
  std::size_t segments = 0;
};

}  // namespace reservoir::detail
