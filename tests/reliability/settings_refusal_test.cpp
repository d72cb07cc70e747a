// Rows of the bad-input table (docs/reliability.md) about settings and the C API's
// arguments: what the configuration text says, settings that cannot apply (together,
// or after the device is made), NULL buffers, an empty trace path, a forged
// checkpoint. Each refusal names what to do and changes nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "reliability/reliability_util.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/reservoir.h"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

using testing_util::c_config;
using testing_util::MiB;
using testing_util::stats_vector;

// An allocator on the simulated device with one live block, and the check that a
// refused call changed neither the configuration nor a statistic.
class Refused : public ::testing::Test {
 protected:
  explicit Refused(const std::string& config = "device:sim,sim_capacity:4GiB,max_split_size_mb:64")
      : a_(std::make_shared<SimBackend>(), Config::parse(config)) {
    live_ = a_.allocate(3 * MiB, 1, 0);
  }
  ~Refused() override { a_.deallocate(live_); }
  template <class Error>
  void expect_refused(const std::function<void()>& body, const std::vector<std::string>& named) {
    const std::string config = a_.config().to_string();
    const std::vector<std::int64_t> before = stats_vector(a_);
    testing_util::expect_error_naming<Error>(body, named);
    EXPECT_EQ(a_.config().to_string(), config) << "a refused call changed the configuration";
    EXPECT_EQ(stats_vector(a_), before) << "a refused call changed the statistics";
    a_.validate();
  }
  Allocator a_;
  void* live_ = nullptr;
};

class RefusedUnderExpandable : public Refused {
 protected:
  RefusedUnderExpandable() : Refused("expandable_segments:True") {}
};

// ---- settings ----

TEST_F(Refused, ConfigTextIsTheCanonicalSettingsNotTheirHistory) {
  for (const char* text : {"policy:compact", "policy:pytorch", "expandable_segments:True",
                           "expandable_segments:False", ",,", "max_split_size_mb:128"})
    a_.update_config(text);
  EXPECT_EQ(a_.config().to_string(), "max_split_size_mb:128,device:sim,sim_capacity:4GiB");
  EXPECT_EQ(Config::parse(a_.config().to_string()), a_.config());
}

// The simulated device, and the device itself, are made once: a change at run time
// would be taken and do nothing.
TEST_F(Refused, SettingsFixedWhenTheDeviceIsMade) {
  expect_refused<ConfigError>([&] { a_.update_config("sim_capacity:1G"); },
                              {"sim_capacity cannot be set at run time", "RESERVOIR_ALLOC_CONF",
                               "sim_capacity:4294967296"});
  expect_refused<ConfigError>([&] { a_.update_config("max_split_size_mb:256,device:cuda"); },
                              {"device cannot be set at run time", "device:sim"});
  expect_refused<ConfigError>([&] { a_.update_config("sim_completion:eager"); },
                              {"sim_completion cannot be set at run time", "host_waits"});
  expect_refused<ConfigError>([&] { a_.update_config("sim_pace:9"); },
                              {"sim_pace cannot be set at run time", "sim_pace:4"});
  a_.update_config("sim_capacity:4GiB,device:sim");  // the values in force: nothing to refuse
}

TEST_F(RefusedUnderExpandable, PolicyCompactWithExpandableSegments) {
  expect_refused<ConfigError>([&] { a_.update_config("policy:compact"); },
                              {"policy:compact and expandable_segments:True cannot be used "
                               "together",
                               "expandable_segments:False"});
  a_.update_config("policy:compact,expandable_segments:False");
  expect_refused<ConfigError>([&] { a_.update_config("expandable_segments:True"); },
                              {"cannot be used together"});
}

TEST(RefusedAtConstruction, SettingsThatCannotApplyTogether) {
  Config c;
  c.policy = Config::Policy::compact;
  c.expandable_segments = true;
  EXPECT_THROW(Allocator(std::make_shared<SimBackend>(), c), ConfigError);
  try {
    Config::parse("backend:cudaMallocAsync,policy:compact");
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use backend:native with policy:compact"),
              std::string::npos)
        << e.what();
  }
}

// ---- the C API (the process-wide allocator, on the simulated device) ----

TEST(RefusedC, ConfigTextIsCanonical) {
  const std::string before = c_config();
  ASSERT_NE(before, "<error>");
  for (const char* text : {"max_split_size_mb:64", "max_split_size_mb:128",
                           "expandable_segments:True", "expandable_segments:False", ",,"})
    ASSERT_EQ(reservoir_update_config(text), RESERVOIR_OK) << reservoir_last_error();
  const std::string after = c_config();
  EXPECT_EQ(after.find("max_split_size_mb:64"), std::string::npos) << after;
  EXPECT_EQ(after.find("expandable"), std::string::npos) << after;
  EXPECT_EQ(after.find(",,"), std::string::npos) << after;
  EXPECT_NE(after.find("max_split_size_mb:128"), std::string::npos) << after;
  ASSERT_EQ(reservoir_update_config("max_split_size_mb:99999999999999"), RESERVOIR_OK);
  EXPECT_EQ(c_config(), before);
}

TEST(RefusedC, SettingsThatCannotApply) {
  const std::string before = c_config();
  struct Row {
    const char* text;
    const char* named;
  } rows[] = {
      {"backend:cudaMallocAsync,policy:compact", "cannot be used together"},
      {"policy:compact,expandable_segments:True", "cannot be used together"},
      {"sim_capacity:1G", "sim_capacity cannot be set at run time"},
  };
  for (const Row& row : rows) {
    EXPECT_EQ(reservoir_update_config(row.text), RESERVOIR_ERROR_CONFIG) << row.text;
    EXPECT_NE(std::string(reservoir_last_error()).find(row.named), std::string::npos)
        << reservoir_last_error();
    EXPECT_EQ(c_config(), before);
  }
}

// NULL with capacity 0 asks for the size; NULL with a capacity is the caller's bug.
TEST(RefusedC, NullBufferWithACapacity) {
  using TextCall = std::function<reservoir_status(char*, size_t, size_t*)>;
  const std::pair<const char*, TextCall> calls[] = {
      {"reservoir_config_text", reservoir_config_text},
      {"reservoir_stats_text",
       [](char* b, size_t c, size_t* n) { return reservoir_stats_text(0, b, c, n); }},
      {"reservoir_summary",
       [](char* b, size_t c, size_t* n) { return reservoir_summary(0, b, c, n); }},
      {"reservoir_summary_with_options",
       [](char* b, size_t c, size_t* n) { return reservoir_summary_with_options(0, 1, b, c, n); }},
      {"reservoir_metrics_prometheus", reservoir_metrics_prometheus},
      {"reservoir_metrics_json", reservoir_metrics_json},
  };
  for (const auto& [name, call] : calls) {
    std::size_t needed = 7;
    EXPECT_EQ(call(nullptr, 100, &needed), RESERVOIR_ERROR_INVALID_ARGUMENT) << name;
    const std::string message = reservoir_last_error();
    EXPECT_NE(message.find(name), std::string::npos) << message;
    EXPECT_NE(message.find("buffer is NULL but capacity is 100"), std::string::npos) << message;
    EXPECT_EQ(needed, 7u) << name << ": a refused call wrote *needed";
    EXPECT_EQ(call(nullptr, 0, &needed), RESERVOIR_OK) << name;  // the size query
    EXPECT_GT(needed, 1u) << name;
  }
}

TEST(RefusedC, EmptyTracePath) {
  EXPECT_EQ(reservoir_start_trace_recording(""), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("needs a file path"), std::string::npos)
      << reservoir_last_error();
  EXPECT_EQ(reservoir_stop_trace_recording(), RESERVOIR_OK);
}

TEST_F(Refused, EmptyTracePath) {
  expect_refused<InvalidArgumentError>([&] { a_.start_trace_recording(""); },
                                       {"needs a file path", "stop_trace_recording"});
}

// ---- private pools: a checkpoint that lists a segment twice, or overlapping ones ----

TEST_F(Refused, ForgedCheckpointWithARepeatedOrOverlappingSegment) {
  const PoolId pool = a_.create_pool({}, 0);
  void* p = testing_util::allocate_in_pool(a_, pool, MiB);
  PoolCheckpoint twice = a_.checkpoint_pool(pool, 0);
  twice.segments.push_back(twice.segments[0]);
  expect_refused<InvalidArgumentError>([&] { a_.restore_pool(twice); }, {"is listed twice"});
  EXPECT_TRUE(a_.pool_live_allocations_are(pool, {p}, 0)) << "a refused restore freed blocks";
  PoolCheckpoint overlapping = a_.checkpoint_pool(pool, 0);
  overlapping.segments.push_back(overlapping.segments[0]);
  overlapping.segments.back().base += 512;
  expect_refused<InvalidArgumentError>([&] { a_.restore_pool(overlapping); }, {"overlap"});
  EXPECT_TRUE(a_.pool_live_allocations_are(pool, {p}, 0)) << "a refused restore freed blocks";
  a_.deallocate(p);
  a_.release_pool(pool, 0);
}

}  // namespace
}  // namespace reservoir
