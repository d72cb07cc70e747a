// What the sleep tests share: a simulated device with real host memory behind its
// addresses (so offloads copy real bytes), a tag name per test and policy, and a
// pattern written into a block and checked after a wake.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "reservoir/sim_backend.hpp"

namespace reservoir::test {

inline SimOptions host_backed(std::size_t capacity = std::size_t{1024} << 20) {
  SimOptions o;
  o.capacity = capacity;
  o.host_backed = true;
  return o;
}

// A tag name of its own for each test and policy (tags are process-wide names).
inline std::string tag_for(const std::string& test, const std::string& config) {
  std::string t = test + "." + (config.empty() ? std::string("default") : config);
  for (char& c : t)
    if (c == ',') c = '.';
  return t;
}

inline void fill(void* p, std::size_t bytes, unsigned seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
}

inline bool holds(const void* p, std::size_t bytes, unsigned seed) {
  std::vector<unsigned char> want(bytes);
  fill(want.data(), bytes, seed);
  return std::memcmp(p, want.data(), bytes) == 0;
}

// The policies every sleep test runs under (tagged memory is pages under each).
inline const auto kSleepPolicies =
    ::testing::Values("", "policy:compact", "expandable_segments:True");

inline std::string sleep_policy_name(const ::testing::TestParamInfo<std::string>& p) {
  return p.param.empty()               ? std::string("Default")
         : p.param == "policy:compact" ? std::string("Compact")
                                       : std::string("Expandable");
}

}  // namespace reservoir::test
