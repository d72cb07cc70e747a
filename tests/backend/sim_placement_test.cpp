// The simulated device's placement model, rule by rule (include/reservoir/
// sim_placement.hpp). Each test is one rule as the H200's driver showed it in the
// placement probe (bench/gpu/placement/recorded/, named in each test); the recorded
// sequences themselves are replayed in bench/gpu/placement/placement_test.cpp.
#include "backend/sim/placement.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr std::uintptr_t kLo = 4 * GiB;  // a window of 1 TiB
constexpr std::uintptr_t kHi = kLo + 1024 * GiB;

// The model without the context's part of the window: the program's chunks alone.
SimPlacement bare() {
  SimPlacement p;
  p.context_bytes = 0;
  p.context_holes.clear();
  return p;
}

std::uintptr_t below_top(std::size_t bytes) {
  return kHi - bytes;
}

TEST(SimPlacement, NewChunksComeTopDownOneWholeChunkEach) {
  // large_20MiB: 20 MiB segments at decreasing addresses 32 MiB apart.
  sim::DriverPlacement p(kLo, kHi, bare());
  for (std::size_t i = 1; i <= 4; ++i) EXPECT_EQ(p.allocate(20 * MiB), below_top(32 * MiB * i));
  // mixed_large: a chunk is the size rounded up to 32 MiB (40 -> 64, 130 -> 160 MiB).
  EXPECT_EQ(p.allocate(40 * MiB), below_top(128 * MiB + 64 * MiB));
  EXPECT_EQ(p.allocate(130 * MiB), below_top(192 * MiB + 160 * MiB));
  EXPECT_EQ(p.chunks(), 6u);
}

TEST(SimPlacement, SmallSegmentsFillTheirChunkUpward) {
  // small_2MiB: 2 MiB segments go upward inside 32 MiB chunks taken downward.
  sim::DriverPlacement p(kLo, kHi, bare());
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(p.allocate(2 * MiB), below_top(32 * MiB) + i * 2 * MiB);
  }
  EXPECT_EQ(p.allocate(2 * MiB), below_top(64 * MiB));
  EXPECT_EQ(p.chunks(), 2u);
}

TEST(SimPlacement, ChunkTailsServeLaterSegmentsNewestChunkFirst) {
  // ops.resnet50_train.default: a 2 MiB segment goes into the tail of the newest chunk,
  // then a 20 MiB one into the newest chunk whose tail holds it.
  sim::DriverPlacement p(kLo, kHi, bare());
  const std::uintptr_t a = p.allocate(20 * MiB);  // tail of 12 MiB
  const std::uintptr_t b = p.allocate(38 * MiB);  // 64 MiB chunk: tail of 26 MiB
  const std::uintptr_t c = p.allocate(98 * MiB);  // 128 MiB chunk: tail of 30 MiB
  EXPECT_EQ(p.allocate(2 * MiB), c + 98 * MiB);   // newest chunk first
  EXPECT_EQ(p.allocate(26 * MiB), c + 100 * MiB);
  EXPECT_EQ(p.allocate(20 * MiB), b + 38 * MiB);  // c is full: the next newest with room
  EXPECT_EQ(p.allocate(10 * MiB), a + 20 * MiB);
  EXPECT_EQ(p.chunks(), 3u);
}

TEST(SimPlacement, InsideAChunkTheSmallestHoleThatFits) {
  // ops.resnet50_train.default_at_fit: with the chunk's first 38 MiB freed and its tail
  // free, a 2 MiB segment takes the tail (the smaller hole), not the chunk's start.
  sim::DriverPlacement p(kLo, kHi, bare());
  const std::uintptr_t base = p.allocate(38 * MiB);
  const std::uintptr_t mid = p.allocate(2 * MiB);
  EXPECT_EQ(mid, base + 38 * MiB);
  ASSERT_TRUE(p.release(base));
  EXPECT_EQ(p.allocate(2 * MiB), base + 40 * MiB);  // the 24 MiB tail beats 38 MiB
  EXPECT_EQ(p.allocate(30 * MiB), base);            // only the freed start holds 30 MiB
}

TEST(SimPlacement, AnEmptiedChunkGoesBackAndAnExactFitIsPassedOver) {
  // holes_1024MiB_first: the freed range takes a smaller chunk at its top; the rest, an
  // exact fit for the next one, is passed over for the free space below.
  sim::DriverPlacement p(kLo, kHi, bare());
  std::vector<std::uintptr_t> gib;
  for (int i = 0; i < 4; ++i) gib.push_back(p.allocate(1 * GiB));
  ASSERT_TRUE(p.release(gib[0]));
  EXPECT_EQ(p.chunks(), 3u);
  EXPECT_EQ(p.allocate(512 * MiB), gib[0] + 512 * MiB);
  EXPECT_EQ(p.allocate(1 * GiB), gib[3] - 1 * GiB);                // the 512 MiB left is too small
  EXPECT_EQ(p.allocate(512 * MiB), gib[3] - 1 * GiB - 512 * MiB);  // exact fit: passed over
  // holes_20MiB_last: the lowest chunk freed merges with the free space below it.
  ASSERT_TRUE(p.release(gib[3] - 1 * GiB - 512 * MiB));
  EXPECT_EQ(p.allocate(1 * GiB), gib[3] - 2 * GiB);
}

TEST(SimPlacement, ReservationsComeBottomUpAndTheirTailServesSegments) {
  // vmm_between_2MiB_middle_run: a reservation of 28 MiB past a multiple of 32 MiB
  // leaves a 4 MiB tail in its chunk, which the next 2 MiB segments take (the newest
  // chunk); emptied, the tail stays with the reservation, and newer chunks come first.
  sim::DriverPlacement p(kLo, kHi, bare());
  const std::uintptr_t seg = p.allocate(2 * MiB);
  const std::size_t size = 5032 * 32 * MiB + 28 * MiB;
  const std::uintptr_t r = p.reserve(size, 2 * MiB);
  EXPECT_EQ(r, kLo);
  const std::uintptr_t t0 = p.allocate(2 * MiB);
  const std::uintptr_t t1 = p.allocate(2 * MiB);
  EXPECT_EQ(t0, r + size);
  EXPECT_EQ(t1, r + size + 2 * MiB);
  EXPECT_EQ(p.allocate(2 * MiB), seg + 2 * MiB);    // the tail is full: back to the older chunk
  const std::uintptr_t big = p.allocate(30 * MiB);  // a new chunk, newer than r's
  ASSERT_TRUE(p.release(t0));
  ASSERT_TRUE(p.release(t1));
  EXPECT_EQ(p.allocate(2 * MiB), big + 30 * MiB);
  // The next reservation starts at the next chunk boundary, past r's tail.
  EXPECT_EQ(p.reserve(2 * MiB, 2 * MiB), r + 5033 * 32 * MiB);
  EXPECT_EQ(p.reserve(2 * MiB, 4 * GiB), 164 * GiB);  // the next multiple of 4 GiB
}

TEST(SimPlacement, TheContextsHolesComeAfterEveryChunkOfTheProgram) {
  // The probe's first calls: a 2 MiB segment in the context's 2 MiB hole, then the
  // upper 24 MiB of the topmost chunk, then chunks of the program, which are tried first.
  sim::DriverPlacement p(kLo, kHi, SimPlacement{});
  EXPECT_EQ(p.allocate(2 * MiB), below_top(98 * MiB));
  EXPECT_EQ(p.allocate(2 * MiB), below_top(24 * MiB));
  EXPECT_EQ(p.allocate(20 * MiB), below_top(22 * MiB));  // 22 MiB left: it fits
  EXPECT_EQ(p.allocate(20 * MiB), below_top(512 * MiB + 32 * MiB));
  EXPECT_EQ(p.allocate(2 * MiB), below_top(512 * MiB + 12 * MiB));  // newest chunk first
  ASSERT_TRUE(p.release(below_top(98 * MiB)));
  ASSERT_TRUE(p.release(below_top(24 * MiB)));
  ASSERT_TRUE(p.release(below_top(22 * MiB)));
  EXPECT_EQ(p.chunks(), 3u);  // the context's two are never given back
  EXPECT_EQ(p.allocate(24 * MiB), below_top(24 * MiB));
}

TEST(SimPlacement, SmallSizesPackAtTheirAlignment) {
  sim::DriverPlacement p(kLo, kHi, bare());
  const std::uintptr_t a = p.allocate(1000);
  EXPECT_EQ(a, below_top(32 * MiB));
  EXPECT_EQ(p.allocate(100), a + 1024);
  EXPECT_EQ(p.allocate(3 * MiB + 1), a + 2 * MiB);  // 2 MiB aligned, 4 MiB long
  EXPECT_EQ(p.allocate(512), a + 1536);
  EXPECT_EQ(p.allocate(2 * MiB), a + 6 * MiB);
}

TEST(SimPlacement, AFullWindowAnswersZeroAndReleaseOfNothingIsRefused) {
  SimPlacement params = bare();
  sim::DriverPlacement p(kLo, kLo + 128 * MiB, params);
  EXPECT_NE(p.allocate(64 * MiB), 0u);
  EXPECT_EQ(p.allocate(64 * MiB), 0u);  // 64 MiB left: an exact fit is passed over
  EXPECT_NE(p.allocate(32 * MiB), 0u);
  EXPECT_EQ(p.reserve(64 * MiB, 2 * MiB), 0u);
  EXPECT_FALSE(p.release(kLo + 1));
  EXPECT_EQ(p.free_ranges(), 1u);
}

TEST(SimPlacement, BadParametersAreRefusedNamingTheField) {
  const auto problem = [](auto change) {
    SimPlacement p;
    change(p);
    return sim::placement_problem(p);
  };
  EXPECT_EQ(sim::placement_problem(SimPlacement{}), "");
  EXPECT_NE(problem([](SimPlacement& p) { p.chunk = 3 * MiB; }).find("placement.chunk"),
            std::string::npos);
  EXPECT_NE(problem([](SimPlacement& p) { p.page = 3 * MiB; }).find("placement.page"),
            std::string::npos);
  EXPECT_NE(problem([](SimPlacement& p) { p.small_alignment = 0; }).find("small_alignment"),
            std::string::npos);
  EXPECT_NE(problem([](SimPlacement& p) { p.context_bytes = 16 * MiB; }).find("context_bytes"),
            std::string::npos);
  EXPECT_NE(problem([](SimPlacement& p) {
              p.context_holes.push_back({600 * MiB, 2 * MiB});
            }).find("context_holes"),
            std::string::npos);
  EXPECT_NE(problem([](SimPlacement& p) {
              p.context_holes.push_back({20 * MiB, 2 * MiB});
            }).find("overlaps"),
            std::string::npos);
  SimOptions o;
  o.placement.chunk = 0;
  EXPECT_THROW(SimBackend{o}, InvalidArgumentError);
}

TEST(SimPlacement, TheSimulatedDevicePlacesAsTheModelDoes) {
  // SimBackend's window per device ends at a chunk boundary; its segments follow the
  // default model, from the top, and reservations start at the window's bottom.
  SimBackend sim;
  void* a = nullptr;
  void* b = nullptr;
  void* r = nullptr;
  ASSERT_EQ(sim.allocate(0, 2 * MiB, &a), DeviceStatus::ok);
  ASSERT_EQ(sim.allocate(0, 2 * MiB, &b), DeviceStatus::ok);
  const auto top = reinterpret_cast<std::uintptr_t>(a) + 98 * MiB;
  EXPECT_EQ(top % (32 * MiB), 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b), top - 24 * MiB);
  ASSERT_EQ(sim.reserve_address_range(0, 4 * MiB, 0, &r), DeviceStatus::ok);
  EXPECT_LT(reinterpret_cast<std::uintptr_t>(r), reinterpret_cast<std::uintptr_t>(a));
  void* t = nullptr;
  ASSERT_EQ(sim.allocate(0, 2 * MiB, &t), DeviceStatus::ok);  // the reservation's tail
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t), reinterpret_cast<std::uintptr_t>(r) + 4 * MiB);
}

}  // namespace
}  // namespace reservoir
