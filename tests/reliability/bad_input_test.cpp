// The bad-input table (docs/reliability.md), one test per row: each bad input gets
// a clear error (type or status code, and a message naming the offending value),
// leaves the allocator consistent (validate()) and changes no statistic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
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
using testing_util::c_stats;
using testing_util::pointer_text;
using testing_util::stats_vector;

// The C API's process-wide allocator reads its configuration on first use: make
// it the simulated device before any test runs.
const bool kSimDevice = [] {
  setenv("RESERVOIR_ALLOC_CONF", "device:sim,sim_capacity:4GiB", 1);
  return true;
}();

constexpr std::size_t MiB = std::size_t{1} << 20;

class BadInput : public ::testing::Test {
 protected:
  BadInput() : sim_(std::make_shared<SimBackend>()), a_(sim_, Config{}) {}
  void SetUp() override {
    live_ = a_.allocate(3 * MiB, 1, 0);  // something for the books to protect
    before_ = stats_vector(a_);
  }
  // The call must throw Error whose message contains every one of named.
  template <class Error, class Body>
  void expect_refused(Body&& body, const std::vector<std::string>& named) {
    testing_util::expect_error_naming<Error>(std::forward<Body>(body), named);
    a_.validate();
    EXPECT_EQ(stats_vector(a_), before_) << "a refused call changed the statistics";
  }
  std::shared_ptr<SimBackend> sim_;
  Allocator a_;
  void* live_ = nullptr;
  std::vector<std::int64_t> before_;
};

TEST_F(BadInput, FreeOfForeignPointer) {
  int on_stack = 0;
  auto on_heap = std::make_unique<int>(0);
  for (void* p : {static_cast<void*>(&on_stack), static_cast<void*>(on_heap.get()),
                  reinterpret_cast<void*>(0x1000), reinterpret_cast<void*>(~std::uintptr_t{0})})
    expect_refused<InvalidPointerError>([&] { a_.deallocate(p); }, {pointer_text(p)});
}

TEST_F(BadInput, DoubleFree) {
  void* p = a_.allocate(MiB, 1, 0);
  a_.deallocate(p);
  before_ = stats_vector(a_);
  expect_refused<InvalidPointerError>([&] { a_.deallocate(p); }, {pointer_text(p), "double free"});
}

TEST_F(BadInput, DoubleFreeOfABlockWaitingForAnotherStream) {
  void* p = a_.allocate(MiB, 1, 0);
  a_.record_stream(p, 2);
  a_.deallocate(p);
  before_ = stats_vector(a_);
  expect_refused<InvalidPointerError>([&] { a_.deallocate(p); }, {pointer_text(p), "double free"});
}

TEST_F(BadInput, FreeOfAnInteriorPointer) {
  void* inside = static_cast<char*>(live_) + 4096;
  expect_refused<InvalidPointerError>([&] { a_.deallocate(inside); },
                                      {pointer_text(inside), "4096 bytes inside"});
}

TEST_F(BadInput, RecordStreamOnAFreedBlock) {
  void* p = a_.allocate(MiB, 1, 0);
  a_.deallocate(p);
  before_ = stats_vector(a_);
  expect_refused<InvalidPointerError>([&] { a_.record_stream(p, 2); }, {pointer_text(p)});
}

TEST_F(BadInput, SizeZeroReturnsNullAndChangesNothing) {
  EXPECT_EQ(a_.allocate(0, 1, 0), nullptr);
  a_.deallocate(nullptr);
  a_.validate();
  EXPECT_EQ(stats_vector(a_), before_);
}

TEST_F(BadInput, SizeOfOneEiBOrMoreFailsBeforeAnyDeviceCall) {
  const std::uint64_t device_allocs = sim_->counters().allocs;
  for (std::size_t size : {std::size_t{1} << 60, ~std::size_t{0}, ~std::size_t{0} - 511})
    expect_refused<OutOfMemoryError>([&] { a_.allocate(size, 1, 0); }, {"EiB"});
  EXPECT_EQ(sim_->counters().allocs, device_allocs);
}

TEST_F(BadInput, UnknownDeviceIndex) {
  for (int d : {1, 7, std::numeric_limits<int>::max()}) {
    const std::string named = "device " + std::to_string(d);
    expect_refused<InvalidArgumentError>([&] { a_.allocate(512, 0, d); }, {named});
    expect_refused<InvalidArgumentError>([&] { a_.stats(d); }, {named});
    expect_refused<InvalidArgumentError>([&] { a_.set_memory_fraction(0.5, d); }, {named});
    expect_refused<InvalidArgumentError>([&] { a_.empty_cache(d); }, {named});
  }
}

// Streams are opaque: every handle value is a stream of its own, including the ones
// an empty-slot encoding could confuse (0, UINTPTR_MAX = (uintptr_t)-1).
TEST_F(BadInput, EveryStreamHandleIsServed) {
  const StreamHandle handles[] = {0, 1, ~StreamHandle{0}, ~StreamHandle{0} - 1,
                                  StreamHandle{1} << 63};
  std::vector<void*> blocks;
  for (StreamHandle s : handles) blocks.push_back(a_.allocate(4 * MiB, s, 0));
  for (std::size_t i = 0; i < blocks.size(); ++i)
    for (std::size_t j = i + 1; j < blocks.size(); ++j) EXPECT_NE(blocks[i], blocks[j]);
  for (void* p : blocks) a_.deallocate(p);
  // Each stream kept its own cache: a second round is served from it.
  const std::int64_t device_allocs = a_.stats(0).num_device_alloc;
  for (StreamHandle s : handles) a_.deallocate(a_.allocate(4 * MiB, s, 0));
  EXPECT_EQ(a_.stats(0).num_device_alloc, device_allocs);
  a_.validate();
}

// -1 means the current device; other negative indices are not devices.
TEST_F(BadInput, NegativeDeviceIndexOtherThanMinusOne) {
  for (int d : {-2, std::numeric_limits<int>::min()}) {
    const std::string named = "device " + std::to_string(d);
    expect_refused<InvalidArgumentError>([&] { a_.allocate(512, 0, d); }, {named});
    expect_refused<InvalidArgumentError>([&] { a_.stats(d); }, {named});
  }
}

TEST_F(BadInput, MemoryFractionOutsideZeroToOne) {
  for (double f : {-0.5, 1.5, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()})
    expect_refused<InvalidArgumentError>([&] { a_.set_memory_fraction(f, 0); }, {"fraction"});
  EXPECT_EQ(a_.memory_fraction(0), 1.0);
}

// Operations after everything was freed and the cache emptied: the allocator is
// empty but fully usable; stale pointers are refused.
TEST_F(BadInput, CallsAfterShutdown) {
  a_.deallocate(live_);
  a_.empty_cache();
  EXPECT_EQ(a_.stats(0).reserved_bytes.all().current, 0);
  EXPECT_EQ(sim_->used(0), 0u);
  before_ = stats_vector(a_);
  expect_refused<InvalidPointerError>([&] { a_.deallocate(live_); },
                                      {pointer_text(live_), "no Reservoir segment"});
  a_.empty_cache();
  EXPECT_FALSE(a_.summary(0).empty());
  void* p = a_.allocate(MiB, 1, 0);
  EXPECT_NE(p, nullptr);
  a_.deallocate(p);
  a_.validate();
}

// policy:compact records the event that reuse of a stream's memory waits for on the
// stream itself, lazily: a stream destroyed without release_stream while one is owed
// there is named again when another stream reuses that memory. Undefined in CUDA; the
// simulated device refuses the call, and the request fails with a DeviceError naming
// the event record, consistent, its statistics unchanged.
TEST(BadInputCompact, AStreamDestroyedWithoutReleaseStream) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(sim, Config::parse("policy:compact"));
  void* p = a.allocate(8 * MiB, 1, 0);
  sim->submit_work(1);
  a.deallocate(p);
  sim->destroy_stream(1);
  const std::vector<std::int64_t> before = stats_vector(a);
  try {
    void* q = a.allocate(8 * MiB, 2, 0);
    ADD_FAILURE() << "served " << q << " after naming a destroyed stream";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("recording an event"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("destroyed"), std::string::npos) << e.what();
  }
  a.validate();
  EXPECT_EQ(stats_vector(a), before);
}

// ---- malformed configuration: every key with a bad value ----

struct BadConfig {
  const char* text;
  const char* key;    // named in the message
  const char* value;  // named in the message (nullptr: the row names the entry)
};

const BadConfig kBadConfigs[] = {
    {"backend:async", "backend", "async"},
    {"backend:other", "backend", "other"},
    {"max_split_size_mb:20", "max_split_size_mb", "20"},
    {"max_split_size_mb:abc", "max_split_size_mb", "abc"},
    {"max_split_size_mb:-64", "max_split_size_mb", "-64"},
    {"max_split_size_mb:1.5", "max_split_size_mb", "1.5"},
    {"max_split_size_mb:", "max_split_size_mb", ""},
    {"max_split_size_mb:99999999999999999999999", "max_split_size_mb", "99999999999999999999999"},
    {"max_non_split_rounding_mb:x", "max_non_split_rounding_mb", "x"},
    {"max_non_split_rounding_mb:-1", "max_non_split_rounding_mb", "-1"},
    {"max_non_split_rounding_mb:1099511627777", "max_non_split_rounding_mb", "1099511627777"},
    {"roundup_power2_divisions:3", "roundup_power2_divisions", "3"},
    {"roundup_power2_divisions:[256:1", "roundup_power2_divisions", "[256:1"},
    {"roundup_power2_divisions:[3:4]", "roundup_power2_divisions", "[3:4]"},
    {"roundup_power2_divisions:[256:3]", "roundup_power2_divisions", "[256:3]"},
    {"roundup_power2_divisions:[256]", "roundup_power2_divisions", "[256]"},
    {"roundup_power2_divisions:", "roundup_power2_divisions", ""},
    {"garbage_collection_threshold:0", "garbage_collection_threshold", "0"},
    {"garbage_collection_threshold:1.0", "garbage_collection_threshold", "1.0"},
    {"garbage_collection_threshold:nan", "garbage_collection_threshold", "nan"},
    {"garbage_collection_threshold:inf", "garbage_collection_threshold", "inf"},
    {"garbage_collection_threshold:0.5x", "garbage_collection_threshold", "0.5x"},
    {"expandable_segments:yes", "expandable_segments", "yes"},
    {"expandable_segments:2", "expandable_segments", "2"},
    {"expandable_segments_reserve:0", "expandable_segments_reserve", "0"},
    {"expandable_segments_reserve:abc", "expandable_segments_reserve", "abc"},
    {"expandable_segments_reserve:5.5", "expandable_segments_reserve", "5.5"},
    {"expandable_segments_reserve:12XB", "expandable_segments_reserve", "12XB"},
    {"release_lock_on_cudamalloc:maybe", "release_lock_on_cudamalloc", "maybe"},
    {"per_process_memory_fraction:2", "per_process_memory_fraction", "2"},
    {"per_process_memory_fraction:-0.1", "per_process_memory_fraction", "-0.1"},
    {"per_process_memory_fraction:nan", "per_process_memory_fraction", "nan"},
    {"device:gpu", "device", "gpu"},
    {"device:", "device", ""},
    {"sim_capacity:0", "sim_capacity", "0"},
    {"sim_capacity:12XB", "sim_capacity", "12XB"},
    {"sim_capacity:-5", "sim_capacity", "-5"},
    {"sim_capacity:99999999999T", "sim_capacity", "99999999999T"},
    {"no_such_key:1", "no_such_key", nullptr},
    {"max_split_size_mb", "max_split_size_mb", nullptr},
    // A bad second entry: the first must not be applied either.
    {"max_split_size_mb:64,garbage_collection_threshold:2", "garbage_collection_threshold", "2"},
};

class BadConfigRow : public ::testing::TestWithParam<BadConfig> {};

std::vector<std::string> named(const BadConfig& row) {
  if (!row.value) return {std::string("'") + row.key};
  return {std::string("'") + row.key + "'", std::string("'") + row.value + "'"};
}

TEST_P(BadConfigRow, IsRefusedByUpdateConfig) {
  Allocator a(std::make_shared<SimBackend>(), Config::parse("roundup_power2_divisions:2"));
  a.deallocate(a.allocate(MiB, 1, 0));
  const std::string config = a.config().to_string();
  const std::vector<std::int64_t> before = stats_vector(a);
  try {
    a.update_config(GetParam().text);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    for (const std::string& n : named(GetParam()))
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " not in: " << e.what();
  }
  EXPECT_EQ(a.config().to_string(), config);
  EXPECT_EQ(a.config().max_split_size, Config{}.max_split_size);
  EXPECT_EQ(stats_vector(a), before);
  a.validate();
}

// set_allocator_settings refuses the same rows, and a refused one resets nothing.
TEST_P(BadConfigRow, IsRefusedBySetAllocatorSettings) {
  Allocator a(std::make_shared<SimBackend>(), Config::parse("roundup_power2_divisions:2"));
  const std::string config = a.config().to_string();
  EXPECT_THROW(a.set_allocator_settings(GetParam().text), ConfigError);
  EXPECT_EQ(a.config().to_string(), config);
  EXPECT_EQ(a.config().roundup_power2_divisions[0], 2u);
  a.validate();
}

TEST_P(BadConfigRow, IsRefusedByTheCApi) {
  const std::string config = c_config();
  ASSERT_NE(config, "<error>");
  EXPECT_EQ(reservoir_update_config(GetParam().text), RESERVOIR_ERROR_CONFIG);
  for (const std::string& n : named(GetParam()))
    EXPECT_NE(std::string(reservoir_last_error()).find(n), std::string::npos)
        << n << " not in: " << reservoir_last_error();
  EXPECT_EQ(c_config(), config);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

std::string row_name(const ::testing::TestParamInfo<BadConfig>& row) {
  return "Row" + std::to_string(row.index) + "_" + row.param.key;
}

INSTANTIATE_TEST_SUITE_P(Keys, BadConfigRow, ::testing::ValuesIn(kBadConfigs), row_name);

TEST(BadInputC, NullConfigText) {
  EXPECT_EQ(reservoir_update_config(nullptr), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("text"), std::string::npos);
  EXPECT_EQ(reservoir_set_allocator_settings(nullptr), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("reservoir_set_allocator_settings"),
            std::string::npos);
  const std::string config = c_config();
  EXPECT_EQ(reservoir_set_allocator_settings("roundup_power2_divisions:3"), RESERVOIR_ERROR_CONFIG);
  EXPECT_NE(std::string(reservoir_last_error()).find("'3'"), std::string::npos);
  EXPECT_EQ(c_config(), config);
}

// ---- the C API (process-wide allocator on the simulated device) ----

// Every tag call with a NULL tag or out-pointer, or a tag never made; and emptying a
// host cache that holds nothing.
TEST(BadInputC, NullAndUnknownTags) {
  auto refused = [](reservoir_status status, const char* words) {
    EXPECT_EQ(status, RESERVOIR_ERROR_INVALID_ARGUMENT) << words;
    EXPECT_NE(std::string(reservoir_last_error()).find(words), std::string::npos)
        << reservoir_last_error();
  };
  refused(reservoir_push_tag(nullptr), "reservoir_push_tag: tag is NULL");
  refused(reservoir_sleep(nullptr, RESERVOIR_SLEEP_OFFLOAD, 0), "reservoir_sleep: tag is NULL");
  refused(reservoir_wake(nullptr, 0), "reservoir_wake: tag is NULL");
  refused(reservoir_wake_async(nullptr, 1, 0), "reservoir_wake_async: tag is NULL");
  reservoir_tag_state state{};
  refused(reservoir_get_tag_state(nullptr, 0, &state), "tag");
  refused(reservoir_get_tag_state("c.never-tagged", 0, nullptr), "out");
  refused(reservoir_wake_async("c.never-tagged", 1, 0), "no memory was ever tagged");
  refused(reservoir_sleep("c.never-tagged", 9, 0), "mode 9");
  const std::string before = c_stats();
  EXPECT_EQ(reservoir_empty_host_cache(), RESERVOIR_OK);
  EXPECT_EQ(c_stats(), before);
}

TEST(BadInputC, NegativeAndOverflowingSizes) {
  const std::string before = c_stats();
  struct Row {
    std::int64_t size;
    reservoir_status status;
    std::string named;
  } rows[] = {{-1, RESERVOIR_ERROR_INVALID_ARGUMENT, "-1"},
              {INT64_MIN, RESERVOIR_ERROR_INVALID_ARGUMENT, std::to_string(INT64_MIN)},
              {INT64_MAX, RESERVOIR_ERROR_OUT_OF_MEMORY, std::to_string(INT64_MAX)},
              {std::int64_t{1} << 60, RESERVOIR_ERROR_OUT_OF_MEMORY, "1152921504606846976"}};
  for (const Row& row : rows) {
    void* p = reinterpret_cast<void*>(0x1);
    EXPECT_EQ(reservoir_allocate(&p, row.size, -1, 0), row.status) << row.size;
    EXPECT_EQ(p, nullptr);
    EXPECT_NE(std::string(reservoir_last_error()).find(row.named), std::string::npos)
        << reservoir_last_error();
  }
  EXPECT_EQ(reservoir_allocate(nullptr, 512, -1, 0), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
  EXPECT_EQ(c_stats(), before);
}

TEST(BadInputC, SizeZeroGivesNull) {
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(reservoir_allocate(&p, 0, -1, 0), RESERVOIR_OK);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(reservoir_free(nullptr), RESERVOIR_OK);
}

TEST(BadInputC, NegativeDeviceIndexOtherThanMinusOne) {
  for (int d : {-2, std::numeric_limits<int>::min()}) {
    void* p = nullptr;
    EXPECT_EQ(reservoir_allocate(&p, 512, d, 0), RESERVOIR_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(p, nullptr);
    EXPECT_NE(std::string(reservoir_last_error()).find("device " + std::to_string(d)),
              std::string::npos)
        << reservoir_last_error();
    if (p) reservoir_free(p);
  }
}

TEST(BadInputC, UnknownDeviceIndex) {
  const std::string before = c_stats();
  void* p = nullptr;
  double fraction = 0;
  EXPECT_EQ(reservoir_allocate(&p, 512, 7, 0), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("device 7"), std::string::npos);
  EXPECT_EQ(reservoir_get_memory_fraction(7, &fraction), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_set_memory_fraction(0.5, 7), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_reset_peak_stats(7), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
  EXPECT_EQ(c_stats(), before);
}

// reservoir_summary_with_options: 0 is reservoir_summary's table; an unknown bit is
// refused (a newer caller's option is never silently dropped).
TEST(BadInputC, SummaryOptions) {
  auto summary = [](unsigned options, reservoir_status expected) {
    size_t needed = 0;
    EXPECT_EQ(reservoir_summary_with_options(0, options, nullptr, 0, &needed), expected);
    std::string text(needed, '\0');
    if (expected == RESERVOIR_OK) {
      EXPECT_EQ(reservoir_summary_with_options(0, options, text.data(), needed, &needed),
                RESERVOIR_OK);
    }
    return std::string(text.c_str());
  };
  size_t needed = 0;
  EXPECT_EQ(reservoir_summary(0, nullptr, 0, &needed), RESERVOIR_OK);
  std::string plain(needed, '\0');
  EXPECT_EQ(reservoir_summary(0, plain.data(), needed, &needed), RESERVOIR_OK);
  EXPECT_EQ(summary(0, RESERVOIR_OK), plain.c_str());
  EXPECT_EQ(summary(RESERVOIR_SUMMARY_ABBREVIATED, RESERVOIR_OK).find("from large pool"),
            std::string::npos);
  const std::string full = summary(RESERVOIR_SUMMARY_SYNC_AND_SPLIT, RESERVOIR_OK);
  EXPECT_NE(full.find("max split size: unlimited"), std::string::npos) << full;
  for (unsigned bad : {4u, 0x80000000u, ~0u}) {
    summary(bad, RESERVOIR_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(reservoir_last_error()).find("unknown option bits"), std::string::npos)
        << reservoir_last_error();
  }
  EXPECT_EQ(reservoir_summary_with_options(7, 0, nullptr, 0, &needed),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
}

TEST(BadInputC, ForeignDoubleAndInteriorFrees) {
  void* p = nullptr;
  ASSERT_EQ(reservoir_allocate(&p, 3 * MiB, -1, 1), RESERVOIR_OK);
  const std::string before = c_stats();
  int on_stack = 0;
  for (void* bad :
       {static_cast<void*>(&on_stack), static_cast<void*>(static_cast<char*>(p) + 512)}) {
    EXPECT_EQ(reservoir_free(bad), RESERVOIR_ERROR_INVALID_POINTER);
    EXPECT_NE(std::string(reservoir_last_error()).find(pointer_text(bad)), std::string::npos);
    EXPECT_EQ(reservoir_record_stream(bad, 2), RESERVOIR_ERROR_INVALID_POINTER);
  }
  EXPECT_EQ(c_stats(), before);
  ASSERT_EQ(reservoir_free(p), RESERVOIR_OK);
  EXPECT_EQ(reservoir_free(p), RESERVOIR_ERROR_INVALID_POINTER);
  EXPECT_EQ(reservoir_record_stream(nullptr, 2), RESERVOIR_ERROR_INVALID_POINTER);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

TEST(BadInputC, MemoryFractionOutsideZeroToOne) {
  for (double f : {-0.5, 1.5, std::nan("")}) {
    EXPECT_EQ(reservoir_set_memory_fraction(f, -1), RESERVOIR_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(reservoir_last_error()).find("fraction"), std::string::npos);
  }
  double fraction = 0;
  ASSERT_EQ(reservoir_get_memory_fraction(-1, &fraction), RESERVOIR_OK);
  EXPECT_EQ(fraction, 1.0);
}

// After reservoir_empty_cache the allocator is empty but usable.
TEST(BadInputC, CallsAfterEmptyCache) {
  void* p = nullptr;
  ASSERT_EQ(reservoir_allocate(&p, MiB, -1, 0), RESERVOIR_OK);
  ASSERT_EQ(reservoir_free(p), RESERVOIR_OK);
  ASSERT_EQ(reservoir_empty_cache(), RESERVOIR_OK);
  EXPECT_NE(c_stats().find("reserved_bytes.all.current 0\n"), std::string::npos);
  EXPECT_EQ(reservoir_free(p), RESERVOIR_ERROR_INVALID_POINTER);
  EXPECT_EQ(reservoir_empty_cache(), RESERVOIR_OK);
  ASSERT_EQ(reservoir_allocate(&p, MiB, -1, 0), RESERVOIR_OK);
  EXPECT_EQ(reservoir_free(p), RESERVOIR_OK);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

// The process-wide allocator is never destroyed, so the C API keeps working from
// static destructors, also after an error message was stored for the thread.
struct UsesTheCApiOnExit {
  ~UsesTheCApiOnExit() {
    void* p = nullptr;
    if (reservoir_allocate(&p, 4096, -1, 0) != RESERVOIR_OK || reservoir_free(p) != RESERVOIR_OK ||
        reservoir_validate() != RESERVOIR_OK)
      std::_Exit(3);
    std::_Exit(0);
  }
};

TEST(BadInputCDeathTest, CallsFromStaticDestructorsWork) {
  EXPECT_EXIT(
      {
        static UsesTheCApiOnExit guard;
        int on_stack = 0;
        (void)reservoir_free(&on_stack);  // leaves a long last-error message
        std::exit(1);                     // the destructor exits 0 if all went well
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
// ---- private pools (docs/pools.md) ----

TEST_F(BadInput, PoolCallsOnAnUnknownOrReleasedPool) {
  const PoolId unknown{0, 424242};
  expect_refused<InvalidArgumentError>([&] { a_.release_pool(unknown, 0); },
                                       {"(0, 424242)", "no such pool"});
  expect_refused<InvalidArgumentError>([&] { a_.pool_use_count(unknown, 0); }, {"(0, 424242)"});
  expect_refused<InvalidArgumentError>([&] { a_.checkpoint_pool(unknown, 0); },
                                       {"checkpoint", "no such pool"});
  expect_refused<InvalidArgumentError>([&] { a_.end_allocate_to_pool(unknown, 0); },
                                       {"without begin"});
  expect_refused<InvalidArgumentError>([&] { a_.retain_pool(PoolId{}, {}, 0); },
                                       {"(0, 0) names the default pools"});
  const PoolId held = a_.create_pool({}, 0);
  a_.begin_allocate_current_thread_to_pool(held, 0);
  void* in_pool = a_.allocate(MiB, 1, 0);
  a_.end_allocate_to_pool(held, 0);
  a_.release_pool(held, 0);
  a_.release_pool(held, 0);  // released, with a live block: not yet forgotten
  before_ = stats_vector(a_);
  expect_refused<InvalidArgumentError>([&] { a_.release_pool(held, 0); }, {"already released"});
  expect_refused<InvalidArgumentError>([&] { a_.retain_pool(held, {}, 0); }, {"was released"});
  expect_refused<InvalidArgumentError>([&] { a_.checkpoint_pool(held, 0); }, {"released"});
  a_.deallocate(in_pool);
}

TEST_F(BadInput, RoutingTwiceToOnePool) {
  const PoolId pool = a_.create_pool({}, 0);
  a_.begin_capture_to_pool(pool, 1, 0);
  before_ = stats_vector(a_);
  expect_refused<InvalidArgumentError>([&] { a_.begin_capture_to_pool(pool, 2, 0); },
                                       {"already routing"});
  expect_refused<InvalidArgumentError>([&] { a_.begin_allocate_to_pool(pool, nullptr, 0); },
                                       {"stream filter"});
  a_.end_allocate_to_pool(pool, 0);
  a_.release_pool(pool, 0);
  a_.release_pool(pool, 0);
}

TEST_F(BadInput, RestoreOfACheckpointThatNoLongerFits) {
  const PoolId pool = a_.create_pool({}, 0);
  void* p = testing_util::allocate_in_pool(a_, pool, MiB);
  PoolCheckpoint bad = a_.checkpoint_pool(pool, 0);
  before_ = stats_vector(a_);
  bad.segments[0].blocks[0].size -= 512;
  expect_refused<InvalidArgumentError>([&] { a_.restore_pool(bad); }, {"do not tile"});
  bad = a_.checkpoint_pool(pool, 0);
  bad.segments[0].stream = 9;
  expect_refused<InvalidArgumentError>([&] { a_.restore_pool(bad); }, {"no memory on stream 9"});
  bad = a_.checkpoint_pool(pool, 0);
  bad.device = 3;
  expect_refused<InvalidArgumentError>([&] { a_.restore_pool(bad); }, {"device 3"});
  a_.begin_capture_to_pool(pool, 1, 0);
  bad = a_.checkpoint_pool(pool, 0);
  expect_refused<InvalidArgumentError>([&] { a_.restore_pool(bad); }, {"capture is under way"});
  a_.end_allocate_to_pool(pool, 0);
  a_.deallocate(p);
  for (int i = 0; i < 3; ++i) a_.release_pool(pool, 0);
}

TEST_F(BadInput, RestoreOfACheckpointOfAnotherPool) {
  const PoolId a = a_.create_pool({}, 0), b = a_.create_pool({}, 0);
  std::vector<void*> blocks;
  for (PoolId id : {a, b}) {
    a_.begin_allocate_current_thread_to_pool(id, 0);
    blocks.push_back(a_.allocate(MiB, 1, 0));
    a_.end_allocate_to_pool(id, 0);
  }
  PoolCheckpoint of_a = a_.checkpoint_pool(a, 0);
  of_a.pool = b;  // b has memory on the same stream, but not a's segment
  before_ = stats_vector(a_);
  expect_refused<InvalidArgumentError>([&] { a_.restore_pool(of_a); },
                                       {"is not a segment of the pool any more"});
  EXPECT_TRUE(a_.pool_live_allocations_are(b, {blocks[1]}, 0)) << "b's block was freed";
  for (void* p : blocks) a_.deallocate(p);
  a_.release_pool(a, 0);
  a_.release_pool(b, 0);
}

// Not refused, but deferred: a pool released while routing to it is on, or while it
// holds blocks, keeps serving and keeps its memory until both are over.
TEST_F(BadInput, ReleaseOfAPoolInUseOrWithLiveBlocksIsDeferred) {
  const PoolId pool = a_.create_pool({}, 0);
  a_.begin_capture_to_pool(pool, 1, 0);
  a_.release_pool(pool, 0);  // the route still holds a use
  EXPECT_EQ(a_.pool_use_count(pool, 0), 1);
  void* p = a_.allocate(MiB, 1, 0);
  EXPECT_TRUE(a_.pool_live_allocations_are(pool, {p}, 0)) << "the route stopped at release";
  a_.end_allocate_to_pool(pool, 0);  // the route's use stays until released (a graph's)
  EXPECT_EQ(a_.pool_use_count(pool, 0), 1);
  a_.release_pool(pool, 0);
  EXPECT_EQ(a_.pool_use_count(pool, 0), 0);
  const std::int64_t held = a_.stats(0).private_pool_reserved_bytes;
  EXPECT_GT(held, 0);
  a_.empty_cache(0);
  EXPECT_EQ(a_.stats(0).private_pool_reserved_bytes, held) << "a live block's segment went back";
  a_.deallocate(p);
  a_.empty_cache(0);
  EXPECT_EQ(a_.stats(0).private_pool_reserved_bytes, 0);
  before_ = stats_vector(a_);  // forgotten now
  expect_refused<InvalidArgumentError>([&] { a_.pool_use_count(pool, 0); }, {"no private pool"});
}

// During a capture, requests on a stream the route does not accept stay in the
// default pools (PyTorch's capture filter), and the pool gets nothing of them.
TEST_F(BadInput, RequestsOnAnotherStreamDuringACaptureStayInTheDefaultPools) {
  const PoolId pool = a_.create_pool({}, 0);
  a_.begin_capture_to_pool(pool, 1, 0);
  void* other = a_.allocate(MiB, 2, 0);
  EXPECT_TRUE(a_.pool_live_allocations_are(pool, {}, 0));
  EXPECT_EQ(a_.stats(0).private_pool_reserved_bytes, 0);
  a_.deallocate(other);
  a_.end_allocate_to_pool(pool, 0);
  a_.release_pool(pool, 0);
  a_.validate();
}

// A checkpoint of expandable segments naming an allocated block where the segment maps
// nothing (forged): refused before anything changes.
TEST_F(BadInput, RestoreOfExpandableBlocksThatAreNotMapped) {
  Allocator expandable(sim_, Config::parse("expandable_segments:True"));
  const PoolId pool = expandable.create_pool({}, 0);
  expandable.begin_allocate_current_thread_to_pool(pool, 0);
  void* p = expandable.allocate(MiB, 1, 0);
  expandable.end_allocate_to_pool(pool, 0);
  PoolCheckpoint checkpoint = expandable.checkpoint_pool(pool, 0);
  ASSERT_EQ(checkpoint.segments.size(), 1u);
  ASSERT_TRUE(checkpoint.segments[0].expandable);
  checkpoint.segments[0].blocks[0].address += 64 * MiB;  // inside the range, unmapped
  EXPECT_THROW(
      {
        try {
          expandable.restore_pool(checkpoint);
        } catch (const InvalidArgumentError& e) {
          EXPECT_NE(std::string(e.what()).find("of the checkpoint is not mapped memory of it"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      InvalidArgumentError);
  EXPECT_TRUE(expandable.pool_live_allocations_are(pool, {p}, 0)) << "a refused restore freed";
  expandable.deallocate(p);
  expandable.release_pool(pool, 0);
  expandable.release_pool(pool, 0);
  expandable.validate();
}

// The C API's pool over the program's segment source: null callbacks or id are
// refused (status codes, no pool made); the callbacks serve the pool's segments, and
// its release gives them back through them; a callback's out-of-memory status is an
// out-of-memory status, any other a device error.
struct CSource {
  int allocs = 0, frees = 0;
  reservoir_status answer = RESERVOIR_OK;
};
reservoir_status c_source_alloc(void* ctx, int, size_t size, uintptr_t, void** ptr) {
  auto* s = static_cast<CSource*>(ctx);
  ++s->allocs;
  if (s->answer != RESERVOIR_OK) return s->answer;
  *ptr = std::aligned_alloc(4096, size);
  return *ptr ? RESERVOIR_OK : RESERVOIR_ERROR_OUT_OF_MEMORY;
}
reservoir_status c_source_free(void* ctx, int, void* ptr, size_t, uintptr_t) {
  ++static_cast<CSource*>(ctx)->frees;
  std::free(ptr);
  return RESERVOIR_OK;
}

TEST(BadInputC, PoolWithASegmentSource) {
  CSource source;
  reservoir_pool_id id{};
  EXPECT_EQ(reservoir_pool_create_with_source(0, 0, 0, nullptr, c_source_free, &source, &id),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_pool_create_with_source(0, 0, 0, c_source_alloc, nullptr, &source, &id),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(
      reservoir_pool_create_with_source(0, 0, 0, c_source_alloc, c_source_free, &source, nullptr),
      RESERVOIR_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(reservoir_pool_create_with_source(0, 0, 0, c_source_alloc, c_source_free, &source, &id),
            RESERVOIR_OK);
  ASSERT_EQ(reservoir_pool_begin_thread(0, id), RESERVOIR_OK);
  void* p = nullptr;
  ASSERT_EQ(reservoir_allocate(&p, 3 * MiB, 0, 7), RESERVOIR_OK);
  EXPECT_EQ(source.allocs, 1);
  source.answer = RESERVOIR_ERROR_OUT_OF_MEMORY;
  void* q = nullptr;
  EXPECT_EQ(reservoir_allocate(&q, 64 * MiB, 0, 7), RESERVOIR_ERROR_OUT_OF_MEMORY);
  source.answer = RESERVOIR_ERROR_INTERNAL;
  EXPECT_EQ(reservoir_allocate(&q, 64 * MiB, 0, 7), RESERVOIR_ERROR_DEVICE);
  source.answer = RESERVOIR_OK;
  EXPECT_EQ(reservoir_pool_end(0, id), RESERVOIR_OK);
  EXPECT_EQ(reservoir_free(p), RESERVOIR_OK);
  EXPECT_EQ(reservoir_pool_release(0, id), RESERVOIR_OK);  // the route's use
  EXPECT_EQ(reservoir_pool_release(0, id), RESERVOIR_OK);
  EXPECT_EQ(reservoir_empty_cache(), RESERVOIR_OK);
  EXPECT_EQ(source.frees, 1);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

// Out-of-memory observers through the C API: a NULL function is refused; an attached
// one sees every out-of-memory error (device, bytes needed, bytes allowed, bytes
// free) before the call returns, and may call Reservoir from inside (a dump-on-OOM
// tool reads statistics and empties the cache there). Its context lives as long as
// the process-wide allocator: static.
struct COomSeen {
  int calls = 0;
  int device = -1;
  std::size_t alloc_size = 0, allowed = 0, free_bytes = 0;
  reservoir_status stats = RESERVOIR_ERROR_INTERNAL, emptied = RESERVOIR_ERROR_INTERNAL;
};
COomSeen c_oom_seen;
void c_oom_observer(void* ctx, int device, size_t alloc_size, size_t allowed, size_t free_bytes) {
  auto* seen = static_cast<COomSeen*>(ctx);
  ++seen->calls;
  seen->device = device;
  seen->alloc_size = alloc_size;
  seen->allowed = allowed;
  seen->free_bytes = free_bytes;
  std::size_t needed = 0;
  seen->stats = reservoir_stats_text(device, nullptr, 0, &needed);
  seen->emptied = reservoir_empty_cache();
}

TEST(BadInputC, OomObserver) {
  EXPECT_EQ(reservoir_attach_oom_observer(nullptr, &c_oom_seen), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("fn must not be NULL"), std::string::npos);
  ASSERT_EQ(reservoir_attach_oom_observer(c_oom_observer, &c_oom_seen), RESERVOIR_OK);
  void* p = nullptr;
  ASSERT_EQ(reservoir_allocate(&p, 4 * MiB, 0, 0), RESERVOIR_OK);
  const int before = c_oom_seen.calls;
  const std::size_t huge = std::size_t{1} << 50;
  void* q = nullptr;
  ASSERT_EQ(reservoir_allocate(&q, huge, 0, 0), RESERVOIR_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(c_oom_seen.calls, before + 1);
  EXPECT_EQ(c_oom_seen.device, 0);
  EXPECT_GE(c_oom_seen.alloc_size, huge);
  EXPECT_GT(c_oom_seen.allowed, 0u);  // the device's total: no memory fraction is set
  EXPECT_LE(c_oom_seen.free_bytes, c_oom_seen.allowed);
  EXPECT_EQ(c_oom_seen.stats, RESERVOIR_OK);
  EXPECT_EQ(c_oom_seen.emptied, RESERVOIR_OK);
  // Requests after it are served as before.
  void* r = nullptr;
  EXPECT_EQ(reservoir_allocate(&r, 4 * MiB, 0, 0), RESERVOIR_OK);
  EXPECT_EQ(reservoir_free(r), RESERVOIR_OK);
  EXPECT_EQ(reservoir_free(p), RESERVOIR_OK);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

// Segments and trace trackers through the C API (what a communication library's
// registration uses): bad arguments are refused; a tracker sees the segment a
// request made and the one empty_cache gave back, with the listing's address and size.
struct CTracked {
  std::vector<reservoir_trace_entry> entries;
};
CTracked c_tracked;
void c_tracker(void* ctx, const reservoir_trace_entry* entry) {
  static_cast<CTracked*>(ctx)->entries.push_back(*entry);
}

TEST(BadInputC, SegmentsAndTraceTrackers) {
  std::size_t count = 0;
  reservoir_segment one{};
  EXPECT_EQ(reservoir_segments(0, nullptr, 0, nullptr), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_segments(0, nullptr, 3, &count), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("out is NULL but capacity is 3"),
            std::string::npos);
  EXPECT_EQ(reservoir_segments(5, &one, 1, &count), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_attach_trace_tracker(nullptr, &c_tracked), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("fn must not be NULL"), std::string::npos);

  ASSERT_EQ(reservoir_empty_cache(), RESERVOIR_OK);
  ASSERT_EQ(reservoir_attach_trace_tracker(c_tracker, &c_tracked), RESERVOIR_OK);
  void* p = nullptr;
  ASSERT_EQ(reservoir_allocate(&p, 30 * MiB, 0, 3), RESERVOIR_OK);
  ASSERT_EQ(reservoir_segments(-1, nullptr, 0, &count), RESERVOIR_OK);  // the count query
  std::vector<reservoir_segment> listed(count + 1);
  std::size_t again = 0;
  ASSERT_EQ(reservoir_segments(0, listed.data(), listed.size(), &again), RESERVOIR_OK);
  ASSERT_EQ(again, count);
  const reservoir_segment* mine = nullptr;
  for (std::size_t i = 0; i < count; ++i)
    if (listed[i].address <= reinterpret_cast<uintptr_t>(p) &&
        reinterpret_cast<uintptr_t>(p) < listed[i].address + listed[i].size)
      mine = &listed[i];
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->device, 0);
  EXPECT_GE(mine->allocated, 30 * MiB);
  EXPECT_EQ(mine->requested, 30 * MiB);
  EXPECT_EQ(mine->stream, 3u);
  EXPECT_EQ(mine->is_large, 1);
  EXPECT_EQ(mine->pool.first, 0u);
  auto seen = [&](int action) {
    for (const reservoir_trace_entry& e : c_tracked.entries)
      if (e.action == action && e.address == mine->address && e.size == mine->size) return true;
    return false;
  };
  EXPECT_TRUE(seen(RESERVOIR_TRACE_SEGMENT_ALLOC) || seen(RESERVOIR_TRACE_SEGMENT_MAP));
  bool alloc_seen = false;
  for (const reservoir_trace_entry& e : c_tracked.entries)
    alloc_seen |= e.action == RESERVOIR_TRACE_ALLOC &&
                  e.address == reinterpret_cast<uintptr_t>(p) && e.stream == 3u;
  EXPECT_TRUE(alloc_seen);
  const reservoir_segment gone = *mine;
  ASSERT_EQ(reservoir_free(p), RESERVOIR_OK);
  ASSERT_EQ(reservoir_empty_cache(), RESERVOIR_OK);
  mine = &gone;
  EXPECT_TRUE(seen(RESERVOIR_TRACE_SEGMENT_FREE) || seen(RESERVOIR_TRACE_SEGMENT_UNMAP));
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

// A pool over functions of PyTorch's pluggable shape (torch.cuda.MemPool(allocator=X)):
// NULL functions or id are refused; the functions serve and take back the segments;
// a NULL segment is out of memory.
int pluggable_allocs = 0, pluggable_frees = 0;
bool pluggable_refuses = false;
void* pluggable_alloc(size_t size, int, void*) {
  ++pluggable_allocs;
  return pluggable_refuses ? nullptr : std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
}
void pluggable_free(void* ptr, size_t, int, void*) {
  ++pluggable_frees;
  std::free(ptr);
}

TEST(BadInputC, PoolOverPluggableFunctions) {
  reservoir_pool_id id{};
  EXPECT_EQ(reservoir_pool_create_with_pluggable(0, 0, 0, nullptr, pluggable_free, &id),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("alloc must not be NULL"), std::string::npos);
  EXPECT_EQ(reservoir_pool_create_with_pluggable(0, 0, 0, pluggable_alloc, nullptr, &id),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_pool_create_with_pluggable(0, 0, 0, pluggable_alloc, pluggable_free, nullptr),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(reservoir_pool_create_with_pluggable(0, 0, 0, pluggable_alloc, pluggable_free, &id),
            RESERVOIR_OK);
  ASSERT_EQ(reservoir_pool_begin_thread(0, id), RESERVOIR_OK);
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(reservoir_allocate(&p, 3 * MiB, 0, 7), RESERVOIR_OK);
  ASSERT_EQ(reservoir_allocate(&q, 2 * MiB, 0, 7), RESERVOIR_OK);  // split off the same segment
  EXPECT_EQ(pluggable_allocs, 1);
  pluggable_refuses = true;
  void* r = nullptr;
  EXPECT_EQ(reservoir_allocate(&r, 64 * MiB, 0, 7), RESERVOIR_ERROR_OUT_OF_MEMORY);
  pluggable_refuses = false;
  EXPECT_EQ(reservoir_pool_end(0, id), RESERVOIR_OK);
  EXPECT_EQ(reservoir_free(p), RESERVOIR_OK);
  EXPECT_EQ(reservoir_free(q), RESERVOIR_OK);
  EXPECT_EQ(reservoir_pool_release(0, id), RESERVOIR_OK);  // the route's use
  EXPECT_EQ(reservoir_pool_release(0, id), RESERVOIR_OK);
  EXPECT_EQ(reservoir_empty_cache(), RESERVOIR_OK);
  EXPECT_EQ(pluggable_frees, 1);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

TEST_F(BadInput, CPoolCallsReturnStatusCodes) {
  reservoir_pool_id id{0, 0};
  EXPECT_EQ(reservoir_pool_create(0, 0, 0, nullptr), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_pool_release(0, reservoir_pool_id{0, 99999}),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("no such pool"), std::string::npos);
  EXPECT_EQ(reservoir_pool_release_and_empty(0, reservoir_pool_id{0, 99999}),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("no such pool"), std::string::npos);
  reservoir_pool_id once{0, 0};
  ASSERT_EQ(reservoir_pool_create(0, 0, 0, &once), RESERVOIR_OK);
  EXPECT_EQ(reservoir_pool_release_and_empty(0, once), RESERVOIR_OK);
  EXPECT_EQ(reservoir_pool_release_and_empty(0, once), RESERVOIR_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(reservoir_pool_create(0, 0, 0, &id), RESERVOIR_OK);
  int count = 0;
  EXPECT_EQ(reservoir_pool_use_count(0, id, &count), RESERVOIR_OK);
  EXPECT_EQ(count, 1);
  size_t reserved = 7, allocated = 7;
  EXPECT_EQ(reservoir_pool_usage(0, id, &reserved, &allocated), RESERVOIR_OK);
  EXPECT_EQ(reserved, 0u);
  EXPECT_EQ(allocated, 0u);
  EXPECT_EQ(reservoir_pool_usage(0, id, nullptr, nullptr), RESERVOIR_OK);
  EXPECT_EQ(reservoir_pool_usage(0, reservoir_pool_id{0, 99999}, &reserved, nullptr),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reservoir_last_error()).find("no such pool"), std::string::npos);
  EXPECT_EQ(reservoir_pool_end(0, id), RESERVOIR_ERROR_INVALID_ARGUMENT);
  reservoir_pool_checkpoint* checkpoint = nullptr;
  EXPECT_EQ(reservoir_pool_checkpoint_take(0, id, &checkpoint), RESERVOIR_OK);
  reservoir_pool_restore* restored = nullptr;
  EXPECT_EQ(reservoir_pool_checkpoint_restore(nullptr, &restored),
            RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reservoir_pool_checkpoint_restore(checkpoint, &restored), RESERVOIR_OK);
  EXPECT_EQ(reservoir_pool_restore_count(restored, 0), 0u);
  EXPECT_EQ(reservoir_pool_restore_pointer(restored, 1, 5), nullptr);
  reservoir_pool_restore_free(restored);
  reservoir_pool_checkpoint_free(checkpoint);
  EXPECT_EQ(reservoir_pool_release(0, id), RESERVOIR_OK);
  EXPECT_EQ(reservoir_validate(), RESERVOIR_OK);
}

}  // namespace reservoir
