// Statistics after each operation, peaks, resets, run-time configuration.
#include "conformance/fixture.hpp"

namespace reservoir::testing {
namespace {

struct Expect {
  std::int64_t allocated, active, requested, reserved, segments, allocations, inactive_split,
      inactive_split_bytes;
};

void check(const DeviceStats& s, const Expect& e, PoolKind pool, const char* step) {
  int q = static_cast<int>(pool);
  SCOPED_TRACE(step);
  EXPECT_EQ(s.allocated_bytes.pool[q].current, e.allocated);
  EXPECT_EQ(s.active_bytes.pool[q].current, e.active);
  EXPECT_EQ(s.requested_bytes.pool[q].current, e.requested);
  EXPECT_EQ(s.reserved_bytes.pool[q].current, e.reserved);
  EXPECT_EQ(s.segment.pool[q].current, e.segments);
  EXPECT_EQ(s.allocation.pool[q].current, e.allocations);
  EXPECT_EQ(s.inactive_split.pool[q].current, e.inactive_split);
  EXPECT_EQ(s.inactive_split_bytes.pool[q].current, e.inactive_split_bytes);
}

TEST_P(Conformance, StatisticsAfterEachOperation) {
  REGULAR_SEGMENTS_ONLY();
  const std::int64_t M = MiB;
  void* s1 = alloc(1000);  // small: 1024 in a 2 MiB segment
  check(stats(), {1024, 1024, 1000, 2 * M, 1, 1, 1, 2 * M - 1024}, PoolKind::small, "s1");
  check(stats(), {0, 0, 0, 0, 0, 0, 0, 0}, PoolKind::large, "s1 large");
  void* l1 = alloc(3 * M);  // large: 3 MiB in a 20 MiB segment
  check(stats(), {3 * M, 3 * M, 3 * M, 20 * M, 1, 1, 1, 17 * M}, PoolKind::large, "l1");
  check(stats(), {3 * M + 1024, 3 * M + 1024, 3 * M + 1000, 22 * M, 2, 2, 2, 19 * M - 1024},
        PoolKind::all, "l1 all");
  void* l2 = alloc(17 * M);  // takes the whole remainder (nothing left to split)
  check(stats(), {20 * M, 20 * M, 20 * M, 20 * M, 1, 2, 0, 0}, PoolKind::large, "l2");
  free(l1);
  check(stats(), {17 * M, 17 * M, 17 * M, 20 * M, 1, 1, 1, 3 * M}, PoolKind::large, "free l1");
  free(l2);
  check(stats(), {0, 0, 0, 20 * M, 1, 0, 0, 0}, PoolKind::large, "free l2");
  free(s1);
  check(stats(), {0, 0, 0, 22 * M, 2, 0, 0, 0}, PoolKind::all, "free s1");
  DeviceStats s = stats();
  EXPECT_EQ(s.allocated_bytes.all().peak, 20 * M + 1024);
  EXPECT_EQ(s.allocated_bytes.all().allocated, 20 * M + 1024);
  EXPECT_EQ(s.allocated_bytes.all().freed, 20 * M + 1024);
  EXPECT_EQ(s.requested_bytes.all().peak, 20 * M + 1000);
  EXPECT_EQ(s.allocation.all().allocated, 3);
  EXPECT_EQ(s.num_device_alloc, 2);
  EXPECT_EQ(s.num_device_free, 0);
  a().empty_cache();
  s = stats();
  EXPECT_EQ(s.reserved_bytes.all().current, 0);
  EXPECT_EQ(s.reserved_bytes.all().peak, 22 * M);
  EXPECT_EQ(s.num_device_free, 2);
  EXPECT_EQ(s.segment.all().freed, 2);
}

TEST_P(Conformance, PeaksAndResets) {
  void* p = alloc(12 * MiB);
  void* q = alloc(12 * MiB);
  free(p);
  DeviceStats s = stats();
  EXPECT_EQ(s.allocated_bytes.all().peak, static_cast<std::int64_t>(24 * MiB));
  EXPECT_EQ(s.allocated_bytes.all().current, static_cast<std::int64_t>(12 * MiB));
  a().reset_peak_stats(0);
  s = stats();
  EXPECT_EQ(s.allocated_bytes.all().peak, static_cast<std::int64_t>(12 * MiB));
  EXPECT_EQ(s.allocated_bytes.all().allocated, static_cast<std::int64_t>(24 * MiB));
  a().reset_accumulated_stats(0);
  s = stats();
  EXPECT_EQ(s.allocated_bytes.all().allocated, 0);
  EXPECT_EQ(s.allocated_bytes.all().freed, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
  EXPECT_EQ(s.allocated_bytes.all().current, static_cast<std::int64_t>(12 * MiB));
  free(q);
  EXPECT_EQ(stats().allocated_bytes.all().freed, static_cast<std::int64_t>(12 * MiB));
}

TEST_P(Conformance, PeakSeesConcurrentStreamsTogether) {
  StreamHandle other = harness_->new_stream();
  void* p = alloc(12 * MiB);
  void* q = alloc_on(12 * MiB, other);  // the device-wide peak spans both streams
  free(p);
  free(q);
  void* r = alloc_on(12 * MiB, other);
  free(r);
  EXPECT_EQ(stats().allocated_bytes.all().peak, static_cast<std::int64_t>(24 * MiB));
}

TEST_P(Conformance, ConfigurationChangesAtRunTime) {
  NATIVE_ENGINE_ONLY();
  void* p = alloc(5000);
  EXPECT_EQ(a().block_size(p), 5120u);  // 512-byte rounding
  a().update_config("roundup_power2_divisions:2");
  void* q = alloc(5000);
  EXPECT_EQ(a().block_size(q), 6144u);  // between 4096 and 8192 in 2 steps
  EXPECT_THROW(a().update_config("roundup_power2_divisions:3"), ConfigError);
  void* r = alloc(5000);
  EXPECT_EQ(a().block_size(r), 6144u);  // unchanged by the rejected update
  free(p), free(q), free(r);
}

// set_allocator_settings (torch.cuda.memory._set_allocator_settings under
// reservoir.torch) as PyTorch's: the rounding, split and collection settings it does not
// name go back to their defaults; update_config keeps them.
TEST_P(Conformance, TorchSettingsResetTheRoundingTheyDoNotName) {
  NATIVE_ENGINE_ONLY();
  a().set_allocator_settings("roundup_power2_divisions:4");
  void* p = alloc(84 * MiB);  // between 64 and 128 MiB in 4 steps: 96 MiB
  EXPECT_EQ(a().block_size(p), 96 * MiB);
  a().set_allocator_settings("garbage_collection_threshold:0.5,max_split_size_mb:40");
  EXPECT_EQ(a().config().max_split_size, 40 * MiB);
  EXPECT_EQ(a().config().garbage_collection_threshold, 0.5);
  void* q = alloc(5000);
  EXPECT_EQ(a().block_size(q), 5120u);  // the divisions went back to 0: 512-byte rounding
  a().set_allocator_settings("roundup_power2_divisions:2");
  EXPECT_EQ(a().config().max_split_size, ~std::size_t{0});
  EXPECT_EQ(a().config().garbage_collection_threshold, 0.0);
  a().update_config("garbage_collection_threshold:0.5");  // keeps the divisions
  void* r = alloc(5000);
  EXPECT_EQ(a().block_size(r), 6144u);
  EXPECT_THROW(a().set_allocator_settings("roundup_power2_divisions:3"), ConfigError);
  EXPECT_EQ(a().config().roundup_power2_divisions[0], 2u);  // a refusal changes nothing
  EXPECT_EQ(a().config().garbage_collection_threshold, 0.5);
  a().set_allocator_settings("");
  EXPECT_EQ(a().config().roundup_power2_divisions[0], 0u);
  free(p), free(q), free(r);
}

// The table's rows carry the statistics' values (current, peak, allocated, freed),
// not only their labels.
TEST_P(Conformance, SummaryTableShowsTheStatistics) {
  PYTORCH_POLICY_ONLY();
  void* big = alloc(3 * MiB);  // large pool: a 20 MiB segment
  void* small = alloc(1000);   // small pool: 1024 bytes in a 2 MiB segment
  free(big);
  std::string table = a().summary(0);
  auto row = [&](const std::string& label) {
    std::size_t at = table.find("| " + label);
    EXPECT_NE(at, std::string::npos) << label << "\n" << table;
    return at == std::string::npos ? std::string() : table.substr(at, table.find('\n', at) - at);
  };
  // Allocated memory: 1024 B now, peak 3 MiB + 1024 B, 3 MiB + 1024 B allocated, 3 MiB freed.
  const std::string allocated = row("Allocated memory");
  EXPECT_NE(allocated.find("1.00 KiB"), std::string::npos) << allocated;
  EXPECT_NE(allocated.find("3.00 MiB"), std::string::npos) << allocated;
  const std::string reserved = row("Reserved memory");
  EXPECT_NE(reserved.find("22.00 MiB"), std::string::npos) << reserved;
  const std::string requested = row("Requested memory");
  EXPECT_NE(requested.find("1000 bytes"), std::string::npos) << requested;
  const std::string allocations = row("Allocations");
  EXPECT_NE(allocations.find("|            1 |            2 |            2 |            1 |"),
            std::string::npos)
      << allocations;
  EXPECT_NE(table.find("from large pool"), std::string::npos) << table;
  free(small);
}

// The options: abbreviated drops the per-pool rows, sync_and_split adds the line
// with num_sync_all_streams and max_split_size; the rest is summary(device)'s table.
TEST_P(Conformance, SummaryOptions) {
  void* p = alloc(3 * MiB);
  const std::string plain = a().summary(0);
  EXPECT_EQ(a().summary(0, SummaryOptions{}), plain);
  SummaryOptions brief;
  brief.abbreviated = true;
  const std::string abbreviated = a().summary(0, brief);
  EXPECT_EQ(abbreviated.find("from large pool"), std::string::npos) << abbreviated;
  EXPECT_EQ(abbreviated.find("from small pool"), std::string::npos) << abbreviated;
  EXPECT_NE(abbreviated.find("| Allocated memory "), std::string::npos) << abbreviated;
  SummaryOptions more;
  more.sync_and_split = true;
  const std::string full = a().summary(0, more);
  const std::string line =
      "synchronizations of all streams: " + std::to_string(a().stats(0).num_sync_all_streams) +
      "   max split size: ";
  const std::size_t at = full.find(line);
  ASSERT_NE(at, std::string::npos) << full;
  const std::size_t end = full.find('\n', at);
  const std::string rest = full.substr(0, full.rfind('\n', at) + 1) + full.substr(end + 1);
  EXPECT_EQ(rest, plain);
  const std::int64_t split = a().stats(0).max_split_size;
  const bool unlimited = split <= 0 || split >= (std::int64_t{1} << 62);
  EXPECT_EQ(full.find("max split size: unlimited") != std::string::npos, unlimited) << full;
  free(p);
}

}  // namespace
}  // namespace reservoir::testing
