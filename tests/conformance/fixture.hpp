// The parameterized fixture of the conformance suite: one Allocator per test over
// the harness's backend, with helpers to read statistics.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "conformance/harness.hpp"
#include "reservoir/allocator.hpp"

// Skips a test of the regular segments' exact layout in the expandable mode (and in
// the async mode, which has no segments of its own, and the compact mode, whose
// arenas are mapped page by page).
#define REGULAR_SEGMENTS_ONLY()                                                           \
  if (expandable())                                                                       \
    GTEST_SKIP() << "regular-segment layout (sizes, splits, inactive-split statistics); " \
                    "expandable segments have their own layout tests (Expandable*)";      \
  PYTORCH_POLICY_ONLY()

// Skips a test of PyTorch's caching policy (per-stream caches, its segments, its
// ladder) in the compact mode: policy:compact shares one cache across streams over
// pages mapped where blocks live, with tests of its own (Compact*, CompactStreamCache*).
#define PYTORCH_POLICY_ONLY()                                                           \
  if (compact())                                                                        \
    GTEST_SKIP() << "PyTorch's caching policy; policy:compact has its own tests (unit " \
                    "tests Compact*, CompactStreamCache*)";                             \
  NATIVE_ENGINE_ONLY()

// Skips a test of Reservoir's own caching engine (its cache, rounding and ladder) in
// the async mode (backend:cudaMallocAsync: the driver's pool caches, with rules of its
// own; async_test.cpp has its tests).
#define NATIVE_ENGINE_ONLY() \
  if (async())               \
  GTEST_SKIP() << "the caching engine's behaviour; backend:cudaMallocAsync has Async* tests"

// Runs a test in the async mode only.
#define ASYNC_ONLY() \
  if (!async()) GTEST_SKIP() << "backend:cudaMallocAsync only (the suite's async mode)"

namespace reservoir::testing {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string param = GetParam();
    auto plus = param.find('+');
    backend_name_ = param.substr(0, plus);
    const std::string mode = plus == std::string::npos ? "" : param.substr(plus + 1);
    expandable_ = mode == "expandable";
    async_ = mode == "async";
    compact_ = mode == "compact";
    for (auto& [name, factory] : harness_registry())
      if (name == backend_name_) harness_ = factory();
    ASSERT_TRUE(harness_) << "no harness " << GetParam();
    std::string why = harness_->unavailable();
    if (!why.empty()) GTEST_SKIP() << GetParam() << " backend unavailable: " << why;
    backend_ = harness_->make_backend();
    stream_ = harness_->new_stream();
  }
  void TearDown() override {
    if (alloc_) {
      alloc_->validate();
      alloc_.reset();
    }
  }
  // The allocator under test, made on first use with config (plus
  // expandable_segments:True in the suite's expandable mode, backend:cudaMallocAsync in
  // its async mode).
  Allocator& make(const std::string& config = "") {
    std::string full = expandable_ ? "expandable_segments:True," + config
                       : async_    ? "backend:cudaMallocAsync," + config
                       : compact_  ? "policy:compact," + config
                                   : config;
    alloc_ = std::make_unique<Allocator>(backend_, Config::parse(full));
    return *alloc_;
  }
  // Tests of the regular segments' exact layout (segment sizes, split rules,
  // inactive-split statistics) do not apply to expandable segments, whose own layout
  // tests are in expandable_test.cpp.
  bool expandable() const { return expandable_; }
  bool async() const { return async_; }
  bool compact() const { return compact_; }
  Allocator& a() {
    if (!alloc_) make();
    return *alloc_;
  }
  DeviceStats stats() { return a().stats(0); }
  std::int64_t allocated() { return stats().allocated_bytes.all().current; }
  std::int64_t reserved() { return stats().reserved_bytes.all().current; }
  void* alloc(std::size_t size) { return a().allocate(size, stream_, 0); }
  void* alloc_on(std::size_t size, StreamHandle s) { return a().allocate(size, s, 0); }
  void free(void* p) { a().deallocate(p); }
  // Caps the allocator at about bytes of reserved memory via the memory fraction
  // (works the same on every backend).
  void cap(std::size_t bytes) {
    MemoryInfo info;
    ASSERT_EQ(backend_->memory_info(0, &info), DeviceStatus::ok);
    a().set_memory_fraction(static_cast<double>(bytes) / static_cast<double>(info.total), 0);
  }
  SimBackend* sim() { return harness_->sim(); }

  std::string backend_name_;
  bool expandable_ = false;
  bool async_ = false;
  bool compact_ = false;
  std::unique_ptr<Harness> harness_;
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<Allocator> alloc_;
  StreamHandle stream_ = 0;
};

std::vector<std::string> harness_names();
// A test name for a harness name ("sim+expandable" -> "sim_expandable").
std::string harness_test_name(const ::testing::TestParamInfo<std::string>& param);

}  // namespace reservoir::testing
