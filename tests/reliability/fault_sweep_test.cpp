// Fault sweep: a fixed workload runs once to count its raw device allocations R;
// then, for every N in 1..R, a fresh allocator whose Nth raw allocation fails runs
// it again. The allocator must stay consistent after every operation, raise
// OutOfMemoryError only when the device really refused memory, and complete the
// workload once the fault is cleared. The call sweep does the same for every kind
// of device call (growing and shrinking expandable segments, segments, events),
// with the calls that undo or retry after the failure failing too: the books must
// count every byte the device holds after each operation, and everything must go
// back once the faults clear. Non-memory device errors must surface as DeviceError
// naming the failed call, with the books still consistent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "reliability/reliability_util.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

using testing_util::expect_empty;
using testing_util::MiB;
using testing_util::Rig;

struct Op {
  // capture: a CUDA graph capture on stream 3 begins (routed to a private pool) or,
  // when one is under way, ends. join: stream waits for `waited` on the device (an
  // event), as a program forks a stream into a capture and joins it back.
  // sleep / wake: the workload's tag (docs/sleep.md), size 1 for a discard; a wake
  // with a stream enqueues its copies back on it (wake_async).
  enum Kind { alloc, free, record, advance, empty_cache, release, capture, join, sleep, wake } kind;
  std::size_t size = 0;     // alloc; sleep: 1 discard, 0 offload
  StreamHandle stream = 0;  // alloc, record, advance, release, join, wake
  std::size_t slot = 0;     // alloc, free, record
  StreamHandle waited = 0;  // join
  bool tagged = false;      // alloc: under the workload's tag
};

constexpr const char* kSweepTag = "fault-sweep";

// A few hundred deterministic operations on streams 1-3: small, medium and large
// sizes, frees, record_stream across streams, stream progress, empty_cache, and
// release_stream (the stream stays in use: later calls may name it). Some requests
// repeat their slot's last size and stream right after its free (the engine's
// parked free). With captures, a capture on stream 3 begins and ends every few
// dozen operations (the others go on beside it); during one, a stream that records a
// use first joins the capture (waits for stream 3), and stream 3 joins streams back
// instead of their progress, so blocks freed in the capture can serve it again
// (graph_capture_record_stream_reuse). scale multiplies every size (a
// program of gigabytes: policy:compact's extents then have up to 16 pages). With
// sleeps, the first six slots' requests are tagged, and the tag sleeps (offload and
// discard in turn) and wakes every forty operations.
std::vector<Op> make_workload(bool captures = false, std::size_t scale = 1, bool sleeps = false) {
  std::mt19937_64 rng(7);
  std::vector<Op> ops;
  constexpr std::size_t kSlots = 16;
  std::vector<Op> last(kSlots, Op{Op::free});
  bool capturing = false;  // on stream 3, which is then not released (it is in use)
  for (int i = 0; i < 400; ++i) {
    const unsigned r = rng() % 100;
    const std::size_t slot = rng() % kSlots;
    const StreamHandle stream = 1 + rng() % 3;
    if (captures && i % 37 == 36) {
      ops.push_back({Op::capture});
      capturing = !capturing;
    } else if (sleeps && i % 40 == 39) {
      ops.push_back({Op::sleep, static_cast<std::size_t>((i / 40) % 2)});
    } else if (sleeps && i % 40 == 19 && i > 40) {
      ops.push_back({Op::wake, 0, (i / 80) % 2 ? StreamHandle{2} : StreamHandle{0}});
    } else if (i % 97 == 96) {
      ops.push_back({Op::empty_cache});
    } else if (i % 61 == 60) {
      ops.push_back({Op::release, 0, capturing && stream == 3 ? StreamHandle{1} : stream});
    } else if (r < 12 && last[slot].kind == Op::alloc) {
      ops.push_back(last[slot]);  // the free of the slot, then the same request
    } else if (r < 45) {
      static constexpr std::size_t kMax[] = {MiB, 10 * MiB, 48 * MiB};
      const std::size_t max = kMax[rng() % 3];
      ops.push_back({Op::alloc, (1 + rng() % max) * scale, stream, slot, 0, sleeps && slot < 6});
      last[slot] = ops.back();
    } else if (r < 80) {
      ops.push_back({Op::free, 0, 0, slot});
    } else if (r < 92) {
      if (capturing && stream != 3) ops.push_back({Op::join, 0, stream, 0, 3});
      ops.push_back({Op::record, 0, stream, slot});
    } else if (capturing && stream != 3) {
      ops.push_back({Op::join, 0, 3, 0, stream});
    } else {
      ops.push_back({Op::advance, 0, stream});
    }
  }
  return ops;
}

struct Outcome {
  int ooms = 0;
  int device_errors = 0;               // with device_errors_allowed only
  bool refused_on_every_oom = true;    // the device answered out_of_memory each time
  bool counted_after_every_op = true;  // reserved_bytes == the device's memory in use
  bool errors_name_the_fault = true;   // each DeviceError carries the device's reason
};

// Runs ops, validating after each; returns the OOMs seen. Frees everything at the end.
// device_errors_allowed: an injected fault may make an operation throw DeviceError.
Outcome run(Rig& rig, const std::vector<Op>& ops, bool device_errors_allowed = false) {
  Outcome out;
  std::vector<void*> slots(16, nullptr);
  std::vector<StreamHandle> owner(16, 0);
  auto guarded = [&](auto&& call) {
    if (!device_errors_allowed) return call();
    try {
      call();
    } catch (const DeviceError& e) {
      ++out.device_errors;
      out.errors_name_the_fault &= std::string(e.what()).find("injected") != std::string::npos;
    }
  };
  constexpr StreamHandle kCapturing = 3;
  bool capturing = false;
  const bool any_capture =
      std::any_of(ops.begin(), ops.end(), [](const Op& op) { return op.kind == Op::capture; });
  const PoolId pool = any_capture ? rig.a->create_pool({}, 0) : PoolId{};
  auto end_capture = [&] {
    capturing = false;
    rig.sim->end_capture(kCapturing);
    // The frees deferred meanwhile record their events now (a failure surfaces).
    guarded([&] { rig.a->end_allocate_to_pool(pool, 0); });
    rig.a->release_pool(pool, 0);  // the route's use
  };
  auto free_slot = [&](std::size_t slot) {
    void* p = std::exchange(slots[slot], nullptr);
    guarded([&] { rig.a->deallocate(p); });  // nullptr is a no-op
  };
  bool tagged_ever = false;
  auto asleep = [&] { return tagged_ever && rig.a->tag_state(kSweepTag, 0).asleep; };
  auto wake = [&](StreamHandle stream) {
    const std::uint64_t refused = rig.sim->counters().failed_allocs;
    try {
      guarded([&] {
        if (stream)
          rig.a->wake_async(kSweepTag, stream, 0);
        else
          rig.a->wake(kSweepTag, 0);
      });
    } catch (const OutOfMemoryError&) {
      ++out.ooms;
      out.refused_on_every_oom &= rig.sim->counters().failed_allocs > refused;
    }
  };
  for (const Op& op : ops) {
    switch (op.kind) {
      case Op::alloc: {
        free_slot(op.slot);
        if (op.tagged && asleep()) break;  // refused while the tag sleeps
        const std::uint64_t refused = rig.sim->counters().failed_allocs;
        try {
          guarded([&] {
            std::optional<TagScope> scope;
            if (op.tagged) scope.emplace(*rig.a, kSweepTag);
            tagged_ever |= op.tagged;
            slots[op.slot] = rig.a->allocate(op.size, op.stream, 0);
            owner[op.slot] = op.stream;
          });
        } catch (const OutOfMemoryError&) {
          ++out.ooms;
          out.refused_on_every_oom &= rig.sim->counters().failed_allocs > refused;
        }
        break;
      }
      case Op::sleep:
        if (tagged_ever && !asleep())
          guarded([&] {
            rig.a->sleep(kSweepTag, op.size ? SleepMode::discard : SleepMode::offload, 0);
          });
        break;
      case Op::wake:
        if (asleep()) wake(op.stream);
        break;
      case Op::free:
        free_slot(op.slot);
        break;
      case Op::record:
        if (slots[op.slot] && owner[op.slot] != op.stream)
          rig.a->record_stream(slots[op.slot], op.stream);
        break;
      case Op::advance:
        rig.sim->advance(op.stream);
        break;
      case Op::join: {
        // The program's own event: a plan failing these calls fails the join (the
        // streams then stay apart); the allocator never sees it.
        EventHandle e = 0;
        if (rig.sim->create_event(0, &e) != DeviceStatus::ok) break;
        if (rig.sim->record_event(0, e, op.waited) == DeviceStatus::ok)
          (void)rig.sim->stream_wait_event(0, op.stream, e);
        (void)rig.sim->destroy_event(0, e);
        break;
      }
      case Op::empty_cache:
        guarded([&] { rig.a->empty_cache(); });
        rig.a->empty_host_cache();  // the pinned host memory wakes keep (frees never throw)
        break;
      case Op::release:
        guarded([&] { rig.a->release_stream(op.stream, 0); });
        break;
      case Op::capture:
        if (capturing) {
          end_capture();
        } else {
          rig.a->begin_capture_to_pool(pool, kCapturing, 0);
          rig.sim->begin_capture(kCapturing);
          capturing = true;
        }
        break;
    }
    rig.a->validate();
    out.counted_after_every_op &= testing_util::counted(rig);
  }
  if (capturing) end_capture();
  // Awake again before the end (a wake failing for the plan's further calls retried).
  for (int tries = 0; tries < 5 && asleep(); ++tries) wake(0);
  for (std::size_t slot = 0; slot < slots.size(); ++slot) free_slot(slot);
  // Its cache back at once (torch.cuda.MemPool's destructor): those device calls swept too.
  if (any_capture) guarded([&] { rig.a->release_pool(pool, 0, /*empty_cache=*/true); });
  rig.sim->advance_all();
  guarded([&] { rig.a->empty_cache(); });
  rig.a->validate();
  return out;
}

class FaultSweep : public ::testing::TestWithParam<const char*> {};

// A single failed device allocation is absorbed by the ladder's retry (after it
// released the cache): no OutOfMemoryError, and the books stay consistent.
TEST_P(FaultSweep, EverySingleAllocationFailureIsAbsorbed) {
  const std::vector<Op> ops = make_workload();
  Rig clean(GetParam());
  ASSERT_EQ(run(clean, ops).ooms, 0);
  const std::uint64_t raw = clean.sim->counters().allocs;
  ASSERT_GT(raw, 20u) << "the workload should exercise the device";
  std::printf("[          ] the workload makes %llu raw device allocations\n",
              static_cast<unsigned long long>(raw));
  for (std::uint64_t n = 1; n <= raw; ++n) {
    SCOPED_TRACE("raw allocation " + std::to_string(n) + " of " + std::to_string(raw));
    Rig rig(GetParam());
    rig.sim->fail_allocation_number(n);
    const Outcome out = run(rig, ops);
    EXPECT_EQ(out.ooms, 0);
    EXPECT_EQ(rig.sim->counters().failed_allocs, 1u);
    expect_empty(rig);
    rig.sim->clear_faults();
    EXPECT_EQ(run(rig, ops).ooms, 0);  // recovers: the workload completes
    expect_empty(rig);
  }
}

// Two failures in a row defeat the retry: an OutOfMemoryError may be raised, but
// only for a request the device refused, and the workload completes afterwards.
TEST_P(FaultSweep, TwoFailuresInARowRaiseOnlyWhenTheDeviceRefused) {
  const std::vector<Op> ops = make_workload();
  Rig clean(GetParam());
  run(clean, ops);
  const std::uint64_t raw = clean.sim->counters().allocs;
  int total_ooms = 0;
  for (std::uint64_t n = 1; n <= raw; ++n) {
    SCOPED_TRACE("raw allocations " + std::to_string(n) + " and " + std::to_string(n + 1));
    Rig rig(GetParam());
    rig.sim->fail_allocation_number(n);
    rig.sim->fail_allocation_number(n + 1);
    const Outcome out = run(rig, ops);
    EXPECT_LE(out.ooms, 1);
    EXPECT_TRUE(out.refused_on_every_oom);
    EXPECT_EQ(rig.a->stats(0).num_ooms, out.ooms);
    total_ooms += out.ooms;
    expect_empty(rig);
    rig.sim->clear_faults();
    EXPECT_EQ(run(rig, ops).ooms, 0);
    expect_empty(rig);
  }
  EXPECT_GT(total_ooms, 0) << "some double failure should reach the caller";
}

std::string config_name(const ::testing::TestParamInfo<const char*>& info) {
  static const char* const kNames[] = {"Default", "MaxSplit32", "Roundup4"};
  return kNames[info.index];
}

INSTANTIATE_TEST_SUITE_P(Configs, FaultSweep,
                         ::testing::Values("", "max_split_size_mb:32",
                                           "roundup_power2_divisions:4"),
                         config_name);

// ---- every device call failing, with the calls that clean up after it ----

// The nth call of op answers status; then the next then_count calls of then fail
// too (the undo of a failed grow, the retry of a failed give-back). errors: whether
// a DeviceError reaches the program (1), never does (0, recovered by design), or
// either (-1).
struct Plan {
  const char* name;
  const char* config;
  SimOp op;
  DeviceStatus status;
  SimOp then;
  std::uint64_t then_count;
  int errors;
  bool captures = false;  // the workload with captures (make_workload)
  std::size_t scale = 1;  // its sizes multiplied (make_workload), on a device that much larger
  bool sleeps = false;    // the workload with a tag that sleeps and wakes (make_workload)
};

constexpr DeviceStatus kError = DeviceStatus::error;
constexpr const char* kExpandable = "expandable_segments:True";
constexpr const char* kCompact = "policy:compact";
constexpr const char* kAsync = "backend:cudaMallocAsync";
constexpr const char* kCaptureReuse = "graph_capture_record_stream_reuse:True";
const Plan kPlans[] = {
    // Growing an expandable segment: each step, and the undo failing as well.
    {"CreatePhysical", kExpandable, SimOp::create_physical, kError, SimOp::map, 0, 1},
    {"CreatePhysicalThenRelease", kExpandable, SimOp::create_physical, kError,
     SimOp::release_physical, 1, 1},
    {"CreatePhysicalOomThenRelease", kExpandable, SimOp::create_physical,
     DeviceStatus::out_of_memory, SimOp::release_physical, 1, -1},
    {"Map", kExpandable, SimOp::map, kError, SimOp::map, 0, 1},
    {"MapThenUnmap", kExpandable, SimOp::map, kError, SimOp::unmap, 1, 1},
    {"MapThenUnmapThrice", kExpandable, SimOp::map, kError, SimOp::unmap, 3, 1},
    {"MapThenRelease", kExpandable, SimOp::map, kError, SimOp::release_physical, 1, 1},
    {"SetAccessThenUnmap", kExpandable, SimOp::set_access, kError, SimOp::unmap, 1, 1},
    {"SetAccessThenRelease", kExpandable, SimOp::set_access, kError, SimOp::release_physical, 2, 1},
    {"Reserve", kExpandable, SimOp::reserve_address_range, kError, SimOp::map, 0, 1},
    // Giving pages and ranges back (empty_cache, the out-of-memory ladder).
    {"Unmap", kExpandable, SimOp::unmap, kError, SimOp::unmap, 0, 1},
    {"ReleasePhysicalThenRetry", kExpandable, SimOp::release_physical, kError,
     SimOp::release_physical, 2, 1},
    {"ReleaseRangeThenRetry", kExpandable, SimOp::release_address_range, kError,
     SimOp::release_address_range, 1, 1},
    {"SynchronizeStream", kExpandable, SimOp::synchronize_stream, kError, SimOp::unmap, 0, 1},
    // The same wait for the whole device, once release_stream named the pool's stream.
    {"SynchronizeDeviceAfterRelease", kExpandable, SimOp::synchronize_device, kError, SimOp::unmap,
     0, 1},
    // Ordinary segments and events.
    {"Allocate", "", SimOp::allocate, kError, SimOp::map, 0, 1},
    {"DeallocateThenRetry", "", SimOp::deallocate, kError, SimOp::deallocate, 2, 1},
    {"QueryEvent", "", SimOp::query_event, kError, SimOp::map, 0, 1},
    {"SynchronizeEvent", "", SimOp::synchronize_event, kError, SimOp::map, 0, 1},
    {"RecordEvent", "", SimOp::record_event, kError, SimOp::map, 0, 0},
    {"CreateEvent", "", SimOp::create_event, kError, SimOp::map, 0, 0},
    // policy:compact: backing pages, moving a free extent (its old place kept as a ghost),
    // fences, releases.
    {"CompactCreatePhysical", kCompact, SimOp::create_physical, kError, SimOp::map, 0, 1},
    {"CompactCreatePhysicalOom", kCompact, SimOp::create_physical, DeviceStatus::out_of_memory,
     SimOp::map, 0, -1},
    {"CompactMapThenUnmap", kCompact, SimOp::map, kError, SimOp::unmap, 1, 1},
    {"CompactSetAccessThenUnmap", kCompact, SimOp::set_access, kError, SimOp::unmap, 2, 1},
    {"CompactUnmap", kCompact, SimOp::unmap, kError, SimOp::unmap, 0, 1},
    // An extent's or a ghost's unmap failing, then the next ones too (a ghost in the way
    // of a map, the undo, the ladder's unmapping of ghosts).
    {"CompactUnmapThenUnmapTwice", kCompact, SimOp::unmap, kError, SimOp::unmap, 2, 1},
    {"CompactReleasePhysicalThenRetry", kCompact, SimOp::release_physical, kError,
     SimOp::release_physical, 1, 1},
    {"CompactReleaseRangeThenRetry", kCompact, SimOp::release_address_range, kError,
     SimOp::release_address_range, 1, 1},
    {"CompactReserve", kCompact, SimOp::reserve_address_range, kError, SimOp::map, 0, 1},
    // The same workload sixteen times larger: extents of several pages (at most a 128th
    // of the memory held), moved whole, given back and remade when they do not fit.
    {"CompactLargeCreatePhysical", kCompact, SimOp::create_physical, kError, SimOp::map, 0, 1,
     false, 16},
    {"CompactLargeMapThenUnmap", kCompact, SimOp::map, kError, SimOp::unmap, 1, 1, false, 16},
    {"CompactLargeSetAccessThenUnmap", kCompact, SimOp::set_access, kError, SimOp::unmap, 2, 1,
     false, 16},
    {"CompactLargeUnmapThenUnmapTwice", kCompact, SimOp::unmap, kError, SimOp::unmap, 2, 1, false,
     16},
    {"CompactLargeReleasePhysicalThenRetry", kCompact, SimOp::release_physical, kError,
     SimOp::release_physical, 1, 1, false, 16},
    {"CompactRecordEvent", kCompact, SimOp::record_event, kError, SimOp::map, 0, -1},
    {"CompactQueryEvent", kCompact, SimOp::query_event, kError, SimOp::map, 0, -1},
    {"CompactStreamWait", kCompact, SimOp::stream_wait_event, kError, SimOp::map, 0, 1},
    {"CompactSynchronizeDevice", kCompact, SimOp::synchronize_device, kError, SimOp::map, 0, -1},
    // policy:compact beside CUDA graph captures: the pool's paths until a capture and
    // after it, the default pools' segments that serve during one, the deferred frees'
    // events at its end.
    {"CompactCapturesCreatePhysical", kCompact, SimOp::create_physical, kError, SimOp::map, 0, 1,
     true},
    {"CompactCapturesAllocate", kCompact, SimOp::allocate, kError, SimOp::map, 0, 1, true},
    {"CompactCapturesAllocateOom", kCompact, SimOp::allocate, DeviceStatus::out_of_memory,
     SimOp::map, 0, -1, true},
    {"CompactCapturesUnmap", kCompact, SimOp::unmap, kError, SimOp::unmap, 1, 1, true},
    {"CompactCapturesRecordEvent", kCompact, SimOp::record_event, kError, SimOp::map, 0, -1, true},
    {"CompactCapturesQueryEvent", kCompact, SimOp::query_event, kError, SimOp::map, 0, -1, true},
    {"CompactCapturesDeallocate", kCompact, SimOp::deallocate, kError, SimOp::deallocate, 1, 1,
     true},
    // graph_capture_record_stream_reuse: where the capture stands (at a free during
    // it) and what a stream's work follows (at its next requests) failing: the block
    // waits for the capture's end instead, no error reaches the program.
    {"CaptureReusePoint", kCaptureReuse, SimOp::capture_point, kError, SimOp::capture_follows, 1, 0,
     true},
    {"CaptureReuseFollows", kCaptureReuse, SimOp::capture_follows, kError, SimOp::capture_follows,
     2, 0, true},
    // Sleep and wake of a tag (its own pool of expandable segments, under any policy):
    // pinned host memory and the copies out, the unmaps and give-backs, then the wake's
    // maps and copies back; a failure leaves the tag as it was.
    {"SleepAllocateHost", "", SimOp::allocate_host, kError, SimOp::map, 0, 1, false, 1, true},
    {"SleepCopyToHost", "", SimOp::copy_to_host, kError, SimOp::map, 0, 1, false, 1, true},
    // The host out of memory: the pinned memory kept from earlier wakes goes back and the
    // host is asked again (recovered when some was kept); a refused free is ignored.
    {"SleepAllocateHostOom", "", SimOp::allocate_host, DeviceStatus::out_of_memory, SimOp::map, 0,
     -1, false, 1, true},
    {"SleepAllocateHostOomTwice", "", SimOp::allocate_host, DeviceStatus::out_of_memory,
     SimOp::allocate_host, 1, 1, false, 1, true},
    {"EmptyHostCacheFreeHost", "", SimOp::free_host, kError, SimOp::free_host, 1, 0, false, 1,
     true},
    {"SleepSynchronizeStream", "", SimOp::synchronize_stream, kError, SimOp::map, 0, 1, false, 1,
     true},
    {"SleepUnmapThenUnmap", "", SimOp::unmap, kError, SimOp::unmap, 1, 1, false, 1, true},
    {"SleepReleasePhysicalThenRetry", "", SimOp::release_physical, kError, SimOp::release_physical,
     1, 1, false, 1, true},
    {"WakeCreatePhysicalThenRelease", "", SimOp::create_physical, kError, SimOp::release_physical,
     1, 1, false, 1, true},
    {"WakeCreatePhysicalOom", "", SimOp::create_physical, DeviceStatus::out_of_memory, SimOp::map,
     0, -1, false, 1, true},
    {"WakeMapThenUnmap", "", SimOp::map, kError, SimOp::unmap, 1, 1, false, 1, true},
    {"WakeSetAccessThenUnmap", "", SimOp::set_access, kError, SimOp::unmap, 1, 1, false, 1, true},
    {"WakeCopyToDeviceThenUnmap", "", SimOp::copy_to_device, kError, SimOp::unmap, 1, 1, false, 1,
     true},
    {"WakeCopyToDeviceAsyncThenUnmap", "", SimOp::copy_to_device_async, kError, SimOp::unmap, 1, 1,
     false, 1, true},
    {"CompactSleepCopyToHost", kCompact, SimOp::copy_to_host, kError, SimOp::map, 0, 1, false, 1,
     true},
    {"CompactWakeCopyToDevice", kCompact, SimOp::copy_to_device, kError, SimOp::unmap, 1, 1, false,
     1, true},
    {"CompactWakeCopyToDeviceAsync", kCompact, SimOp::copy_to_device_async, kError, SimOp::unmap, 1,
     1, false, 1, true},
    // backend:cudaMallocAsync: the pool's calls (its chunks are device memory).
    {"AsyncAllocateFromPool", kAsync, SimOp::allocate_from_pool, kError, SimOp::map, 0, 1},
    {"AsyncAllocateFromPoolOom", kAsync, SimOp::allocate_from_pool, DeviceStatus::out_of_memory,
     SimOp::map, 0, -1},
};

void PrintTo(const Plan& plan, std::ostream* os) {
  *os << plan.name;
}

class CallSweep : public ::testing::TestWithParam<Plan> {};

// Whatever call fails, and whatever fails while undoing it: after every operation
// the device holds exactly the memory counted as reserved, each DeviceError carries
// the device's reason, and once the faults clear, empty_cache gives everything back
// (memory, segments, address ranges) and the workload runs again without an error.
TEST_P(CallSweep, EveryCallFailingKeepsTheBooksAndGivesEverythingBack) {
  const Plan& plan = GetParam();
  const std::vector<Op> ops = make_workload(plan.captures, plan.scale, plan.sleeps);
  const std::size_t capacity = (std::size_t{2} << 30) * plan.scale;
  Rig clean(plan.config, 1, capacity);
  run(clean, ops);
  const std::uint64_t calls = clean.sim->calls(plan.op);
  ASSERT_GT(calls, 0u) << "the workload never calls " << to_string(plan.op);
  constexpr std::uint64_t kMaxRuns = 48;
  const std::uint64_t stride = (calls + kMaxRuns - 1) / kMaxRuns;
  std::printf("[          ] %s: %llu calls, failing one in %llu\n", to_string(plan.op),
              static_cast<unsigned long long>(calls), static_cast<unsigned long long>(stride));
  int errors = 0;
  for (std::uint64_t n = 1; n <= calls; n += stride) {
    SCOPED_TRACE(std::string(to_string(plan.op)) + " call " + std::to_string(n) + " of " +
                 std::to_string(calls));
    Rig rig(plan.config, 1, capacity);
    rig.sim->fail_operation_number(plan.op, n, plan.status);
    rig.sim->fail_after_fault(plan.then, plan.then_count, kError);
    const Outcome out = run(rig, ops, true);
    EXPECT_TRUE(out.counted_after_every_op);
    EXPECT_TRUE(out.refused_on_every_oom);
    EXPECT_TRUE(out.errors_name_the_fault);
    errors += out.device_errors;
    rig.sim->clear_faults();
    rig.a->empty_cache();
    expect_empty(rig);
    EXPECT_EQ(run(rig, ops).ooms, 0);  // recovers: a DeviceError would escape here
    expect_empty(rig);
    EXPECT_EQ(rig.sim->capture_violations(), 0u);
  }
  if (plan.errors == 0) {
    EXPECT_EQ(errors, 0) << "these failures are recovered from by design";
  }
  if (plan.errors == 1) {
    EXPECT_GT(errors, 0) << "no failure reached the program";
  }
}

INSTANTIATE_TEST_SUITE_P(Calls, CallSweep, ::testing::ValuesIn(kPlans),
                         [](const ::testing::TestParamInfo<Plan>& plan_info) {
                           return std::string(plan_info.param.name);
                         });

// ---- non-memory device errors ----

template <class Body>
void expect_device_error(Rig& rig, const char* op_name, Body&& body) {
  try {
    body();
    ADD_FAILURE() << "no DeviceError for a failing " << op_name;
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find(op_name), std::string::npos) << e.what();
  }
  rig.a->validate();
}

TEST(DeviceErrors, AllocateNamesTheCall) {
  Rig rig;
  rig.sim->fail_operation(SimOp::allocate, DeviceStatus::error);
  expect_device_error(rig, "allocate", [&] { rig.a->allocate(MiB, 1, 0); });
  EXPECT_EQ(rig.a->stats(0).reserved_bytes.all().current, 0);
  rig.sim->clear_faults();
  rig.a->deallocate(rig.a->allocate(MiB, 1, 0));
  rig.a->validate();
}

TEST(DeviceErrors, QueryEventNamesTheCallAndKeepsThePendingBlock) {
  Rig rig;
  void* p = rig.a->allocate(4 * MiB, 1, 0);
  rig.a->record_stream(p, 2);
  rig.a->deallocate(p);  // pending on stream 2
  rig.sim->fail_operation(SimOp::query_event, DeviceStatus::error);
  expect_device_error(rig, "query_event", [&] { rig.a->allocate(MiB, 1, 0); });
  EXPECT_EQ(rig.a->stats(0).active_bytes.all().current, 4 * static_cast<std::int64_t>(MiB));
  rig.sim->clear_faults();
  rig.sim->advance(2);
  void* q = rig.a->allocate(4 * MiB, 1, 0);
  EXPECT_EQ(q, p);  // the block came back once its stream finished
  rig.a->deallocate(q);
  rig.a->validate();
}

TEST(DeviceErrors, SynchronizeEventNamesTheCall) {
  Rig rig;
  void* p = rig.a->allocate(4 * MiB, 1, 0);
  rig.a->record_stream(p, 2);
  rig.a->deallocate(p);
  rig.sim->fail_operation(SimOp::synchronize_event, DeviceStatus::error);
  expect_device_error(rig, "synchronize_event", [&] { rig.a->empty_cache(); });
  rig.sim->clear_faults();
  rig.a->empty_cache();
  expect_empty(rig);
}

TEST(DeviceErrors, DeallocateNamesTheCallAndKeepsTheSegment) {
  Rig rig;
  rig.a->deallocate(rig.a->allocate(30 * MiB, 1, 0));
  const std::int64_t reserved = rig.a->stats(0).reserved_bytes.all().current;
  rig.sim->fail_operation(SimOp::deallocate, DeviceStatus::error);
  expect_device_error(rig, "deallocate", [&] { rig.a->empty_cache(); });
  EXPECT_EQ(rig.a->stats(0).reserved_bytes.all().current, reserved);
  EXPECT_EQ(rig.sim->used(0), static_cast<std::size_t>(reserved));
  rig.sim->clear_faults();
  rig.a->empty_cache();
  expect_empty(rig);
}

// A failing deallocate met on the ladder (releasing cache for a new segment).
TEST(DeviceErrors, DeallocateFailureOnTheLadderSurfaces) {
  Rig rig;
  rig.sim->set_capacity(0, 64 * MiB);
  rig.a->deallocate(rig.a->allocate(40 * MiB, 2, 0));  // cached on stream 2
  rig.sim->fail_operation(SimOp::deallocate, DeviceStatus::error);
  expect_device_error(rig, "deallocate", [&] { rig.a->allocate(40 * MiB, 1, 0); });
  rig.sim->clear_faults();
  rig.a->deallocate(rig.a->allocate(40 * MiB, 1, 0));
  rig.a->empty_cache();
  expect_empty(rig);
}

// record_event and create_event failures are recovered from, by design: the free
// waits for the using stream instead (stream_pool.cpp defer_free), so the caller
// sees no error and the block is reusable at once.
TEST(DeviceErrors, EventFailuresOnFreeFallBackToStreamSynchronization) {
  for (SimOp op : {SimOp::record_event, SimOp::create_event}) {
    Rig rig;
    void* p = rig.a->allocate(4 * MiB, 1, 0);
    rig.a->record_stream(p, 2);
    rig.sim->fail_operation(op, DeviceStatus::error);
    const std::uint64_t syncs = rig.sim->counters().stream_syncs;
    EXPECT_NO_THROW(rig.a->deallocate(p));
    EXPECT_EQ(rig.sim->counters().stream_syncs, syncs + 1);
    EXPECT_EQ(rig.a->stats(0).active_bytes.all().current, 0);
    rig.a->validate();
    rig.sim->clear_faults();
    rig.a->empty_cache();
    expect_empty(rig);
  }
}

}  // namespace
}  // namespace reservoir
