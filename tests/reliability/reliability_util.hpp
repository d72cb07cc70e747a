// Helpers shared by the reliability suites.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/reservoir.h"
#include "reservoir/sim_backend.hpp"

namespace reservoir::testing_util {

constexpr std::size_t MiB = std::size_t{1} << 20;

// An allocator on its own simulated device (2 GiB, so that only injected failures
// refuse memory).
struct Rig {
  explicit Rig(const std::string& config = "", int devices = 1,
               std::size_t capacity = std::size_t{2} << 30) {
    SimOptions o;
    o.capacity = capacity;
    o.device_count = devices;
    sim = std::make_shared<SimBackend>(o);
    a = std::make_unique<Allocator>(sim, Config::parse(config));
  }
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> a;
};

// body must throw Error, its message naming every one of named.
template <class Error, class Body>
void expect_error_naming(Body&& body, const std::vector<std::string>& named) {
  try {
    body();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    for (const std::string& n : named)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message does not name '" << n << "': " << e.what();
  }
}

// One block of size from pool on device 0 (the calling thread routed to it meanwhile).
inline void* allocate_in_pool(Allocator& a, PoolId pool, std::size_t size) {
  a.begin_allocate_current_thread_to_pool(pool, 0);
  void* p = a.allocate(size, 1, 0);
  a.end_allocate_to_pool(pool, 0);
  return p;
}

// Everything went back to device 0: memory, segments and address ranges.
inline void expect_empty(Rig& rig) {
  const DeviceStats s = rig.a->stats(0);
  EXPECT_EQ(s.allocated_bytes.all().current, 0);
  EXPECT_EQ(s.active_bytes.all().current, 0);
  EXPECT_EQ(s.reserved_bytes.all().current, 0);
  EXPECT_EQ(s.segment.all().current, 0);
  EXPECT_EQ(rig.sim->used(0), 0u);
  EXPECT_EQ(rig.sim->live_segments(0), 0u);
  EXPECT_EQ(rig.sim->live_reservations(0), 0u);
}

// The device holds exactly the memory device 0's statistics count as reserved.
inline bool counted(Rig& rig) {
  return static_cast<std::size_t>(rig.a->stats(0).reserved_bytes.all().current) == rig.sim->used(0);
}

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
