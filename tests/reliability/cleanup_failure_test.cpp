// When a call that gives memory back fails: the undo of a failed grow of an
// expandable segment, a page release on empty_cache, the address range of a failed
// first grow, peer access granted part way, a free whose using stream cannot be
// waited for. The allocator keeps on its books whatever the device still holds
// (counted as reserved), retries it, and never hands out memory it cannot vouch for.
// The call sweep in fault_sweep_test.cpp runs each of these over a whole workload.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "reliability/reliability_util.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

using testing_util::counted;
using testing_util::expect_empty;
using testing_util::MiB;
using testing_util::Rig;

constexpr const char* kExpandable = "expandable_segments:True";

// Runs body; returns the message of the DeviceError it threw ("" when none).
template <class Body>
std::string device_error(Body&& body) {
  try {
    body();
  } catch (const DeviceError& e) {
    return e.what();
  }
  return "";
}

// Device memory is never forgotten when a clean-up call fails (docs/reliability.md,
// "When a call that gives memory back fails"): a 64 MiB request maps four 20 MiB
// pages; the second map fails and the undo's unmap of the first page fails too. The
// new segment's release retries it at once; when that fails as well, the page stays
// counted as reserved and empty_cache gives it back once the device takes it.
TEST(HeldMemory, AFailedUndoKeepsThePageCountedUntilEmptyCache) {
  for (std::uint64_t unmap_failures : {1, 2}) {
    SCOPED_TRACE(std::to_string(unmap_failures) + " unmap failures");
    Rig rig(kExpandable);
    rig.sim->fail_operation_number(SimOp::map, 2, DeviceStatus::error);
    rig.sim->fail_after_fault(SimOp::unmap, unmap_failures, DeviceStatus::error);
    const std::string what = device_error([&] { rig.a->allocate(64 * MiB, 0, 0); });
    EXPECT_NE(what.find("mapping a page"), std::string::npos) << what;
    EXPECT_NE(what.find("undoing it failed too"), std::string::npos) << what;
    rig.a->validate();
    EXPECT_TRUE(counted(rig));
    EXPECT_EQ(rig.sim->used(0), unmap_failures == 1 ? 0 : 20 * MiB);
    EXPECT_EQ(rig.sim->live_reservations(0), unmap_failures == 1 ? 0u : 1u);
    rig.sim->clear_faults();
    rig.a->empty_cache();
    expect_empty(rig);
  }
}

// A held page that is still mapped blocks its address: the next grow retries
// giving it back first, and fails (naming it) while the device refuses.
TEST(HeldMemory, AHeldPageIsGivenBackBeforeItsAddressIsMappedAgain) {
  Rig rig(kExpandable);
  rig.sim->fail_operation_number(SimOp::map, 2, DeviceStatus::error);
  rig.sim->fail_operation(SimOp::unmap, DeviceStatus::error);
  EXPECT_NE(device_error([&] { rig.a->allocate(64 * MiB, 0, 0); }), "");
  const std::string what = device_error([&] { rig.a->allocate(64 * MiB, 0, 0); });
  EXPECT_NE(what.find("still mapped after an earlier failure"), std::string::npos) << what;
  rig.a->validate();
  EXPECT_TRUE(counted(rig));
  rig.sim->clear_faults();
  void* p = rig.a->allocate(64 * MiB, 0, 0);
  rig.a->validate();
  EXPECT_TRUE(counted(rig));
  EXPECT_EQ(rig.sim->used(0), 80 * MiB);
  rig.a->deallocate(p);
  rig.a->empty_cache();
  expect_empty(rig);
}

// The same during a capture (which forbids giving memory back): the grow fails, the
// message says why, nothing leaks, and once the capture ends the grow succeeds.
TEST(HeldMemory, DuringACaptureAHeldPageFailsAGrowAtItsAddressUntilTheCaptureEnds) {
  Rig rig(kExpandable);
  rig.sim->fail_operation_number(SimOp::map, 2, DeviceStatus::error);
  rig.sim->fail_operation(SimOp::unmap, DeviceStatus::error);
  EXPECT_NE(device_error([&] { rig.a->allocate(64 * MiB, 0, 0); }), "");
  rig.sim->clear_faults();
  const PoolId pool = rig.a->create_pool({}, 0);
  rig.a->begin_capture_to_pool(pool, 1, 0);
  // Stream 0's request goes to the default pools, whose segment holds the page.
  const std::string what = device_error([&] { rig.a->allocate(64 * MiB, 0, 0); });
  EXPECT_NE(what.find("still mapped after an earlier failure (a capture is under way)"),
            std::string::npos)
      << what;
  rig.a->validate();
  EXPECT_TRUE(counted(rig));
  rig.a->end_allocate_to_pool(pool, 0);
  rig.a->release_pool(pool, 0);
  void* p = rig.a->allocate(64 * MiB, 0, 0);
  rig.a->validate();
  EXPECT_TRUE(counted(rig));
  rig.a->deallocate(p);
  rig.a->empty_cache();
  expect_empty(rig);
}

// empty_cache unmaps a page whose physical memory the device will not release: the
// error names the call, the page stays counted, and the next empty_cache retries.
TEST(HeldMemory, AFailedPageReleaseIsRetriedByTheNextEmptyCache) {
  Rig rig(kExpandable);
  rig.a->deallocate(rig.a->allocate(30 * MiB, 0, 0));  // two pages, cached
  rig.sim->fail_operation_number(SimOp::release_physical, 1, DeviceStatus::error);
  const std::string what = device_error([&] { rig.a->empty_cache(); });
  EXPECT_NE(what.find("release_physical"), std::string::npos) << what;
  rig.a->validate();
  EXPECT_EQ(rig.a->stats(0).reserved_bytes.all().current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_TRUE(counted(rig));
  EXPECT_EQ(rig.sim->live_reservations(0), 1u);  // the range stays while a page is held
  rig.a->empty_cache();
  expect_empty(rig);
}

// A new segment whose first grow fails gives its address range back at once.
TEST(HeldMemory, AFailedFirstGrowGivesBackTheAddressRange) {
  Rig rig(kExpandable);
  rig.sim->fail_operation(SimOp::set_access, DeviceStatus::error);
  EXPECT_NE(device_error([&] { rig.a->allocate(30 * MiB, 0, 0); }), "");
  rig.a->validate();
  EXPECT_EQ(rig.sim->live_reservations(0), 0u);
  EXPECT_EQ(rig.a->stats(0).segment.all().current, 0);
  EXPECT_EQ(rig.sim->used(0), 0u);
  rig.sim->clear_faults();
  rig.a->deallocate(rig.a->allocate(30 * MiB, 0, 0));
  rig.a->empty_cache();
  expect_empty(rig);
}

// Granting a peer access stops part way: the peer is not recorded, so a retry
// grants every mapped page (before the fix the retry returned at once).
TEST(PeerAccess, AGrantThatFailsPartWayCanBeRetried) {
  Rig rig(kExpandable, 2);
  void* p = rig.a->allocate(20 * MiB, 0, 0);  // one page each
  void* q = rig.a->allocate(20 * MiB, 0, 0);
  void* r = rig.a->allocate(20 * MiB, 0, 0);
  ASSERT_EQ(static_cast<char*>(r) - static_cast<char*>(p), 40 * static_cast<std::ptrdiff_t>(MiB));
  rig.a->deallocate(q);
  rig.a->empty_cache();  // the mapped pages are now two runs: p's and r's
  rig.sim->fail_operation_number(SimOp::set_access, 2, DeviceStatus::error);  // r's run
  EXPECT_NE(device_error([&] { rig.a->enable_peer_access(1, 0); }).find("granting device 1"),
            std::string::npos);
  rig.sim->clear_faults();
  rig.a->enable_peer_access(1, 0);
  EXPECT_EQ(rig.sim->access(p), (std::vector<int>{0, 1}));
  EXPECT_EQ(rig.sim->access(r), (std::vector<int>{0, 1}));
  void* s = rig.a->allocate(20 * MiB, 0, 0);  // a page mapped later includes the peer
  EXPECT_EQ(rig.sim->access(s), (std::vector<int>{0, 1}));
  rig.a->deallocate(p);
  rig.a->deallocate(r);
  rig.a->deallocate(s);
  rig.a->validate();
}

// A block used on streams 2 and 3 is freed; stream 2's event is recorded, stream
// 3's is not and stream 3 cannot be waited for either: the block is kept out of
// circulation for good, even once stream 2's event completes.
TEST(EventRecord, AFreeThatCannotBeProvenSafeIsNeverHandedOutAgain) {
  Rig rig;
  void* p = rig.a->allocate(4 * MiB, 1, 0);
  rig.a->record_stream(p, 2);
  rig.a->record_stream(p, 3);
  rig.sim->fail_operation_number(SimOp::record_event, 2, DeviceStatus::error);
  rig.sim->fail_after_fault(SimOp::synchronize_stream, 1, DeviceStatus::error);
  const std::string what = device_error([&] { rig.a->deallocate(p); });
  EXPECT_NE(what.find("kept unused"), std::string::npos) << what;
  rig.a->validate();
  rig.sim->clear_faults();
  rig.sim->advance_all();
  void* q = rig.a->allocate(4 * MiB, 1, 0);
  EXPECT_NE(q, p);
  rig.a->validate();
  EXPECT_EQ(rig.a->stats(0).active_bytes.all().current, static_cast<std::int64_t>(8 * MiB));
  rig.a->deallocate(q);
  rig.a->empty_cache();
  rig.a->validate();
  EXPECT_TRUE(counted(rig));
}

}  // namespace
}  // namespace reservoir
