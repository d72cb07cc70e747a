// The out-of-memory ladder, rung by rung, and the memory fraction.
#include "conformance/fixture.hpp"

namespace reservoir::testing {
namespace {

TEST_P(Conformance, MemoryFractionCapsReservedMemory) {
  cap(64 * MiB);
  MemoryInfo info;
  ASSERT_EQ(backend_->memory_info(0, &info), DeviceStatus::ok);
  EXPECT_NEAR(a().memory_fraction(0) * static_cast<double>(info.total), 64.0 * MiB, 1.0 * MiB);
  void* p = alloc(40 * MiB);
  EXPECT_THROW(alloc(40 * MiB), OutOfMemoryError);
  free(p);
}

// PyTorch's gate for expandable segments under a memory fraction: a request needs room
// for the allocation size a regular segment would take, and the whole 20 MiB pages it
// then maps are not checked again. With 84 MiB mapped under a 100 MiB cap, a 12 MiB
// request passes the gate (96 MiB) and maps a page (104 MiB reserved); checking the page
// instead would refuse it.
TEST_P(Conformance, ExpandableSegmentsTakePyTorchsGateUnderAFraction) {
  if (!expandable()) GTEST_SKIP() << "expandable segments (the expandable mode)";
  cap(100 * MiB);
  void* large = alloc(80 * MiB);  // four 20 MiB pages
  std::vector<void*> small;
  for (int i = 0; i < 3; ++i) small.push_back(alloc(MiB));  // two 2 MiB pages, small pool
  ASSERT_EQ(reserved(), 84 * static_cast<std::int64_t>(MiB));
  void* p = alloc(12 * MiB);
  EXPECT_EQ(reserved(), 104 * static_cast<std::int64_t>(MiB));
  // The page's free 8 MiB serve a smaller request; a larger one has no room: past the
  // cap already, and nothing free to give back.
  void* q = alloc(8 * MiB);
  EXPECT_THROW(alloc(9 * MiB), OutOfMemoryError);
  free(q);
  a().validate();
  free(p);
  for (void* s : small) free(s);
  free(large);
}

TEST_P(Conformance, OutOfMemoryErrorIsActionableAndRecoverable) {
  cap(100 * MiB);
  std::vector<std::tuple<int, std::size_t, std::size_t>> seen;
  a().attach_oom_observer([&](int device, std::size_t size, std::size_t allowed, std::size_t) {
    seen.emplace_back(device, size, allowed);
  });
  void* p = alloc(60 * MiB);
  try {
    alloc(60 * MiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const std::bad_alloc& e) {  // OutOfMemoryError is a std::bad_alloc
    EXPECT_NE(dynamic_cast<const OutOfMemoryError*>(&e), nullptr);
    std::string m = e.what();
    // PyTorch's first sentences (tools match them), then Reservoir's facts and advice.
    EXPECT_EQ(m.rfind("CUDA out of memory. Tried to allocate 60.00 MiB. GPU 0 has a total "
                      "capacity of ",
                      0),
              0u)
        << m;
    // Then the processes using the device (PyTorch's place for them), the allowance
    // and what is allocated.
    const std::size_t free_at = m.find(" is free. ");
    const std::size_t process_at = m.find(" memory in use. ");
    const std::size_t allowed_at =
        m.find("100.00 MiB allowed; Of the allocated memory 60.00 MiB is allocated by Reservoir");
    ASSERT_NE(free_at, std::string::npos) << m;
    ASSERT_NE(allowed_at, std::string::npos) << m;
    if (sim()) {  // the simulated device lists this process
      EXPECT_NE(m.find("Including non-PyTorch memory, this process has "), std::string::npos) << m;
      EXPECT_LT(free_at, process_at) << m;
      EXPECT_LT(process_at, allowed_at) << m;
    }
    EXPECT_NE(m.find("beyond the memory fraction"), std::string::npos) << m;
    EXPECT_NE(m.find("is reserved by Reservoir but unallocated"), std::string::npos) << m;
    EXPECT_NE(m.find("expandable_segments:True"), std::string::npos) << m;
  }
  DeviceStats s = stats();
  EXPECT_EQ(s.num_ooms, 1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(std::get<0>(seen[0]), 0);
  EXPECT_EQ(std::get<1>(seen[0]), 60 * MiB);
  a().validate();
  free(p);
  void* q = alloc(60 * MiB);  // recovers once memory is back
  EXPECT_NE(q, nullptr);
  free(q);
}

TEST_P(Conformance, LadderRungFreeMemoryCallbacks) {
  PYTORCH_POLICY_ONLY();
  void* held = nullptr;
  int calls = 0;
  a().add_free_memory_callback([&] {
    ++calls;
    if (!held) return false;
    free(held);  // the callback frees through the allocator (no deadlock)
    held = nullptr;
    return true;
  });
  held = alloc(12 * MiB);
  calls = 0;
  void* p = alloc(12 * MiB);  // cache miss: callback frees `held`; its block is reused
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(stats().num_device_alloc, 1);
  free(p);
}

TEST_P(Conformance, LadderRungGarbageCollectionReleasesOldBlocksFirst) {
  REGULAR_SEGMENTS_ONLY();
  make("garbage_collection_threshold:0.5");
  cap(200 * MiB + MiB);
  // Three cached 40 MiB segments (120 MiB reserved, above half the cap); one is
  // reused again and again while the other two age.
  void* b1 = alloc(40 * MiB);
  void* b2 = alloc(40 * MiB);
  void* b3 = alloc(40 * MiB);
  free(b1), free(b2), free(b3);
  void* reused = nullptr;
  for (int i = 0; i < 20; ++i) {
    void* p = alloc(40 * MiB);
    reused = p;
    free(p);
  }
  void* big = alloc(60 * MiB);  // cache miss above the threshold: GC frees the old two
  DeviceStats s = stats();
  EXPECT_EQ(s.num_device_free, 2);
  EXPECT_EQ(s.num_alloc_retries, 0);  // no synchronize-and-release rung needed
  EXPECT_EQ(s.reserved_bytes.all().current, static_cast<std::int64_t>(100 * MiB));
  void* again = alloc(40 * MiB);  // the young block survived
  EXPECT_EQ(again, reused);
  free(again), free(big);
}

TEST_P(Conformance, LadderRungReleaseCachedOversizeBlocks) {
  REGULAR_SEGMENTS_ONLY();
  make("max_split_size_mb:100");
  cap(260 * MiB);
  void* big = alloc(200 * MiB);
  free(big);                   // cached, oversize
  void* p = alloc(150 * MiB);  // 200 + 150 > 260: release the cached oversize block
  DeviceStats s = stats();
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.num_sync_all_streams, 0);
  EXPECT_EQ(s.reserved_bytes.all().current, static_cast<std::int64_t>(150 * MiB));
  free(p);
}

// Sizes in whole 20 MiB pages, so that regular and expandable segments (which PyTorch
// gates by the request's allocation size, then maps whole pages) meet the cap alike.
TEST_P(Conformance, LadderRungReleaseAllCachedBlocksAndRetry) {
  PYTORCH_POLICY_ONLY();
  cap(50 * MiB);
  StreamHandle other = harness_->new_stream();
  void* a1 = alloc_on(40 * MiB, other);
  free(a1);                   // 40 MiB cached on another stream
  void* p = alloc(20 * MiB);  // needs the other stream's cache released
  void* q = alloc(20 * MiB);
  DeviceStats s = stats();
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_ooms, 0);
  free(p), free(q);
}

TEST_P(Conformance, EmptyCacheReturnsUnsplitSegmentsOnly) {
  REGULAR_SEGMENTS_ONLY();
  void* p = alloc(4096);  // keeps its 2 MiB segment split and alive
  void* q = alloc(30 * MiB);
  free(q);
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(32 * MiB));
  EXPECT_EQ(a().largest_cached_block(0), 30 * MiB);
  a().empty_cache();
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(a().largest_cached_block(0), 2 * MiB - 4096);
  free(p);
  a().empty_cache();
  EXPECT_EQ(reserved(), 0);
}

TEST_P(Conformance, BaseAllocationFindsTheSegment) {
  REGULAR_SEGMENTS_ONLY();
  void* p = alloc(4096);
  void* q = alloc(8192);
  BaseAllocation b = a().base_allocation(q);
  EXPECT_EQ(b.base, p);
  EXPECT_EQ(b.size, 2 * MiB);
  free(p), free(q);
}

}  // namespace
}  // namespace reservoir::testing
