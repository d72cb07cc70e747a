// Helpers shared by the reliability suites.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/reservoir.h"

namespace reservoir::testing_util {

// How the allocator's messages print a pointer ("%p").
inline std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// Every statistic of device 0 (current, peak, allocated, freed of each array, and
// the event counters), for "nothing changed" comparisons.
inline std::vector<std::int64_t> stats_vector(Allocator& a, int device = 0) {
  const DeviceStats s = a.stats(device);
  std::vector<std::int64_t> out;
  for (const StatArray* arr :
       {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
        &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes})
    for (const Stat& st : arr->pool)
      out.insert(out.end(), {st.current, st.peak, st.allocated, st.freed});
  out.insert(out.end(), {s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams,
                         s.num_device_alloc, s.num_device_free, s.max_split_size});
  return out;
}

// The C API's statistics text of the current device ("" if it fails).
inline std::string c_stats() {
  std::size_t needed = 0;
  if (reservoir_stats_text(-1, nullptr, 0, &needed) != RESERVOIR_OK) return "";
  std::string text(needed, '\0');
  if (reservoir_stats_text(-1, text.data(), text.size(), &needed) != RESERVOIR_OK) return "";
  text.resize(needed - 1);
  return text;
}

// The C API's configuration text.
inline std::string c_config() {
  std::size_t needed = 0;
  if (reservoir_config_text(nullptr, 0, &needed) != RESERVOIR_OK) return "<error>";
  std::string text(needed, '\0');
  if (reservoir_config_text(text.data(), text.size(), &needed) != RESERVOIR_OK) return "<error>";
  text.resize(needed - 1);
  return text;
}

}  // namespace reservoir::testing_util
