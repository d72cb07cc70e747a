// Private pools under injected device failures: a workload of graph-capture rounds
// (routing to a pool, frees deferred past the capture and their events recorded at
// its end, a checkpoint, a restore, the pool released) runs with every call of one
// kind failing in turn, with regular segments and with expandable ones. After each operation the books validate and count exactly
// what the device holds; every DeviceError names the injected fault; and once the
// faults clear, empty_cache gives everything back.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "reliability/reliability_util.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

using testing_util::expect_empty;
using testing_util::MiB;
using testing_util::Rig;

struct Result {
  int device_errors = 0;
  bool named = true;    // every DeviceError carries the device's reason
  bool counted = true;  // reserved_bytes == the device's memory after every step
};

Result run_rounds(Rig& rig, bool errors_allowed) {
  Result out;
  Allocator& a = *rig.a;
  auto step = [&](auto&& call) {
    try {
      call();
    } catch (const DeviceError& e) {
      if (!errors_allowed) throw;
      ++out.device_errors;
      out.named &= std::string(e.what()).find("injected") != std::string::npos;
    }
    a.validate();
    out.counted &= testing_util::counted(rig);
  };
  constexpr StreamHandle kCapture = 1, kSide = 2;
  for (int round = 0; round < 8; ++round) {
    const PoolId pool = a.create_pool({}, 0);
    std::vector<void*> live;
    // A default block used on the side stream, freed during the capture: its event
    // is recorded when the capture ends.
    void* before = nullptr;
    step([&] { before = a.allocate(2 * MiB, kCapture, 0); });  // may query events
    if (before) {
      a.record_stream(before, kSide);
      rig.sim->submit_work(kSide);
    }
    a.begin_capture_to_pool(pool, kCapture, 0);
    step([&] {
      for (std::size_t size : {std::size_t{1024}, 3 * MiB, 12 * MiB + 512 * round})
        live.push_back(a.allocate(size, kCapture, 0));
    });
    if (before) step([&] { a.deallocate(before); });  // deferred past the capture
    step([&] { a.end_allocate_to_pool(pool, 0); });   // records the deferred event
    a.release_pool(pool, 0);                          // the route's use
    // A pool block used on the side stream: its free waits for an event.
    a.begin_allocate_current_thread_to_pool(pool, 0);
    void* used = nullptr;
    step([&] { used = a.allocate(MiB, kCapture, 0); });
    a.end_allocate_to_pool(pool, 0);
    a.release_pool(pool, 0);
    if (used) {
      a.record_stream(used, kSide);
      rig.sim->submit_work(kSide);
      step([&] { a.deallocate(used); });
    }
    if (!live.empty()) a.record_stream(live[0], kSide);  // the restore frees it: an event
    rig.sim->submit_work(kSide);
    std::optional<PoolCheckpoint> checkpoint;
    step([&] { checkpoint = a.checkpoint_pool(pool, 0); });  // waits for the pool's events
    if (checkpoint) {
      step([&] {
        live.clear();  // a restore frees them, even when it fails on the device
        live = a.restore_pool(*checkpoint).allocated;
      });
    }
    for (void* p : live) step([&] { a.deallocate(p); });
    a.release_pool(pool, 0);  // the pool's own use
    if (round % 3 == 2) step([&] { a.empty_cache(); });
  }
  rig.sim->advance_all();
  step([&] { a.empty_cache(); });
  return out;
}

struct Plan {
  const char* name;
  SimOp op;
  const char* config = "";
};
// Under expandable_segments:True the pools' segments are mapped page by page, and
// their checkpoints list mapped blocks (a restore carves the allocated ones out).
const Plan kPlans[] = {
    {"Allocate", SimOp::allocate},
    {"RecordEvent", SimOp::record_event},
    {"CreateEvent", SimOp::create_event},
    {"SynchronizeEvent", SimOp::synchronize_event},
    {"QueryEvent", SimOp::query_event},
    {"Deallocate", SimOp::deallocate},
    {"ExpandableCreatePhysical", SimOp::create_physical, "expandable_segments:True"},
    {"ExpandableMap", SimOp::map, "expandable_segments:True"},
    {"ExpandableUnmap", SimOp::unmap, "expandable_segments:True"},
    {"ExpandableReserve", SimOp::reserve_address_range, "expandable_segments:True"},
    {"ExpandableRecordEvent", SimOp::record_event, "expandable_segments:True"},
    {"ExpandableSynchronizeEvent", SimOp::synchronize_event, "expandable_segments:True"}};

void PrintTo(const Plan& plan, std::ostream* os) {
  *os << plan.name;
}

class PoolCallSweep : public ::testing::TestWithParam<Plan> {};

TEST_P(PoolCallSweep, EveryCallFailingKeepsThePoolsBooks) {
  const Plan& plan = GetParam();
  std::uint64_t calls;
  {
    Rig clean(plan.config);
    const Result r = run_rounds(clean, false);
    EXPECT_TRUE(r.counted);
    expect_empty(clean);
    calls = clean.sim->calls(plan.op);
  }
  ASSERT_GT(calls, 0u) << "the workload never calls " << to_string(plan.op);
  for (std::uint64_t n = 1; n <= calls; ++n) {
    SCOPED_TRACE(std::string(to_string(plan.op)) + " call " + std::to_string(n));
    Rig rig(plan.config);
    rig.sim->fail_operation_number(plan.op, n, DeviceStatus::error);
    const Result r = run_rounds(rig, true);
    EXPECT_TRUE(r.counted);
    EXPECT_TRUE(r.named);
    rig.sim->clear_faults();
    rig.a->empty_cache();
    expect_empty(rig);
    rig.a->validate();
  }
}

INSTANTIATE_TEST_SUITE_P(Calls, PoolCallSweep, ::testing::ValuesIn(kPlans),
                         [](const ::testing::TestParamInfo<Plan>& plan_info) {
                           return std::string(plan_info.param.name);
                         });

}  // namespace
}  // namespace reservoir
