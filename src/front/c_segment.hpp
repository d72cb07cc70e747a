// A segment of the C++ API as the C API's reservoir_segment: what reservoir_segments
// lists, and the PyTorch integration's snapshot hook passes on.
#pragma once

#include <cstdint>

#include "reservoir/history.hpp"
#include "reservoir/reservoir.h"

namespace reservoir::detail {

inline reservoir_segment to_c(const SegmentInfo& s) {
  return reservoir_segment{s.device,
                           s.address,
                           s.total_size,
                           s.allocated_size,
                           s.active_size,
                           s.requested_size,
                           static_cast<uintptr_t>(s.stream),
                           s.is_large ? 1 : 0,
                           s.is_expandable ? 1 : 0,
                           reservoir_pool_id{s.pool.first, s.pool.second}};
}

}  // namespace reservoir::detail
