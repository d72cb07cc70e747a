// The placement probe's CPU parts: op lists (format, parse, files), the built-in
// scenarios, the logging backend, running op lists, and the engine's calls for a trace.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

#include "engine_ops.hpp"
#include "op_list.hpp"
#include "op_runner.hpp"
#include "replay.hpp"
#include "reservoir/sim_backend.hpp"
#include "scenarios.hpp"
#include "trace_reader.hpp"

namespace {

namespace fs = std::filesystem;
using namespace reservoir_bench::placement;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("reservoir_placement_test_" + name)).string();
}

std::string parse_error(const std::string& text) {
  try {
    parse_ops(text, "x");
  } catch (const OpError& e) {
    return e.what();
  }
  return "";
}

TEST(OpList, FormatParseRoundTrip) {
  OpList l;
  l.name = "x";
  l.notes = {"a note"};
  const std::size_t a = l.alloc(20 * kMiB);
  l.reserve(3 * kGiB);
  l.alloc(2 * kMiB);
  l.free(a);
  const std::string text = format_ops(l);
  EXPECT_EQ(text, std::string(kOpsHeader) +
                      "\n# a note\nalloc 20971520\nreserve 3221225472\nalloc 2097152\nfree 0\n");
  const OpList back = parse_ops(text, "x");
  EXPECT_EQ(back.notes, l.notes);
  ASSERT_EQ(back.ops.size(), 4u);
  EXPECT_EQ(back.ops[1].kind, OpKind::reserve);
  EXPECT_EQ(back.ops[3].kind, OpKind::free);
  EXPECT_EQ(back.ops[3].value, 0u);
  EXPECT_EQ(back.allocs(), 2u);
}

TEST(OpList, MalformedListsNameTheLine) {
  EXPECT_EQ(parse_error("alloc 10\nfree 1\n"), "x:2: free 1 names no earlier alloc (1 so far)");
  EXPECT_EQ(parse_error("alloc 10\nfree 0\nfree 0\n"), "x:3: alloc 0 is freed twice");
  EXPECT_EQ(parse_error("alloc 0\n"), "x:1: alloc of 0 bytes");
  EXPECT_EQ(parse_error("alloc -1\n"), "x:1: expected 'alloc NUMBER', got 'alloc -1'");
  EXPECT_EQ(parse_error("alloc\n"), "x:1: expected 'alloc NUMBER', got 'alloc'");
  EXPECT_EQ(parse_error("grab 10\n"),
            "x:1: unknown op 'grab 10' (alloc SIZE | free INDEX | reserve SIZE)");
  EXPECT_EQ(parse_error("# placement ops v2: new\n"),
            "x:1: unsupported version: '# placement ops v2: new'");
  EXPECT_EQ(parse_error("\n# note\r\nalloc 5 \r\n"), "");  // blanks and CRs tolerated
}

TEST(OpList, ValidateRefusesABadList) {
  OpList l;
  l.name = "y";
  l.alloc(1);
  l.free(0);
  l.free(0);
  EXPECT_THROW(validate(l), OpError);
  EXPECT_THROW(write_ops(temp_path("bad.txt"), l), OpError);
}

TEST(OpList, FilesPlainAndGzip) {
  OpList l;
  l.notes = {"n"};
  l.alloc(4096);
  l.free(0);
  for (const char* file : {"rt.txt", "rt.txt.gz"}) {
    const std::string path = temp_path(file);
    write_ops(path, l);
    const OpList back = read_ops(path);
    EXPECT_EQ(back.name, "reservoir_placement_test_rt");
    EXPECT_EQ(format_ops(back), format_ops(l));
    std::ifstream in(path, std::ios::binary);
    const bool gz = in.get() == 0x1f && in.get() == 0x8b;
    EXPECT_EQ(gz, std::string(file).ends_with(".gz")) << file;
    fs::remove(path);
  }
  EXPECT_THROW(read_ops(temp_path("missing.txt")), OpError);
}

TEST(OpList, NamesForTracesAndSettings) {
  EXPECT_EQ(ops_name("traces/gpt2.trace.gz", ""), "gpt2.default");
  EXPECT_EQ(ops_name("/a/b/r50.trace", "max_split_size_mb:128"), "r50.max_split_size_mb_128");
  EXPECT_EQ(ops_name("t.trace.gz", "roundup_power2_divisions:[256:1,>:8]"),
            "t.roundup_power2_divisions__256_1___8_");
}

TEST(Scenarios, DeterministicValidAndWithinBudget) {
  const std::uint64_t total = 140 * kGiB;
  const std::vector<OpList> a = builtin_scenarios(total, 2 * kMiB);
  const std::vector<OpList> b = builtin_scenarios(total, 2 * kMiB);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GE(a.size(), 20u);
  std::size_t with_reserve = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(format_ops(a[i]), format_ops(b[i]));
    std::uint64_t live = 0, peak = 0;
    std::vector<std::uint64_t> sizes;
    bool reserves = false;
    for (const Op& op : a[i].ops) {
      if (op.kind == OpKind::alloc) {
        sizes.push_back(op.value);
        live += op.value;
        EXPECT_EQ(op.value % (2 * kMiB), 0u) << a[i].name;  // sizes the engine asks for
      } else if (op.kind == OpKind::free) {
        live -= sizes[op.value];
      } else {
        reserves = true;
        EXPECT_EQ(op.value, expandable_reservation(total, 2 * kMiB));
      }
      peak = std::max(peak, live);
    }
    EXPECT_LE(peak, total / 4) << a[i].name;
    with_reserve += reserves;
  }
  EXPECT_EQ(with_reserve, 5u);
  EXPECT_EQ(expandable_reservation(8 * kGiB, 2 * kMiB), 9 * kGiB);
  EXPECT_EQ(expandable_reservation(8 * kGiB + 1, 2 * kMiB), 9 * kGiB + 2 * kMiB);
}

TEST(OpsFromCalls, FreesBecomeIndicesAndFailuresDrop) {
  using C = PlacementCall;
  const std::vector<C> calls = {
      {C::alloc, 100, 0x1000, DeviceStatus::ok},
      {C::alloc, 200, 0, DeviceStatus::out_of_memory},
      {C::alloc, 300, 0x2000, DeviceStatus::ok},
      {C::free, 100, 0x1000, DeviceStatus::ok},
      {C::free, 1, 0x9999, DeviceStatus::ok},  // never allocated: dropped
      {C::reserve, 4096, 0x8000, DeviceStatus::ok},
      {C::map, 4096, 0x8000, DeviceStatus::ok},  // not an op
      {C::alloc, 400, 0x1000, DeviceStatus::ok},
  };
  const OpList l = ops_from_calls(calls, "n");
  EXPECT_EQ(format_ops(l),
            std::string(kOpsHeader) + "\nalloc 100\nalloc 300\nfree 0\nreserve 4096\nalloc 400\n");
  const PlacementSummary s = summarize(calls);
  EXPECT_EQ(s.allocs, 3u);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.down, 1u);   // 0x1000 after 0x2000
  EXPECT_EQ(s.reuse, 1u);  // 0x1000 was freed
  EXPECT_EQ(s.reserves, 1u);
  EXPECT_EQ(format_calls({calls[1], calls[3], calls[5]}),
            "alloc 200 failed out_of_memory\nfree 0x1000\nreserve 4096 0x8000\n");
}

TEST(RunOps, SimulatedDevicePlacesAsTheDriverAndCleansUp) {
  reservoir::SimOptions o;
  o.capacity = 8 * kGiB;
  reservoir::SimBackend sim(o);
  OpList l;
  l.name = "holes";
  for (int i = 0; i < 4; ++i) l.alloc(20 * kMiB);
  l.free(1);
  l.alloc(10 * kMiB);       // fits the newest chunk's tail
  l.alloc(4 * kGiB);        // fits the 8 GiB device after 70 MiB
  l.alloc(4 * kGiB);        // fails: over capacity
  l.reserve(9 * kGiB + 1);  // rounded up to the granularity
  const OpRun run = run_ops(l, sim);
  ASSERT_EQ(run.end_of_sequence, 9u);  // 4 allocs, free, 3 allocs, reserve
  const auto& c = run.calls;
  EXPECT_EQ(c[5].address, c[3].address + 20 * kMiB);  // not the freed chunk: the driver's way
  EXPECT_EQ(c[7].status, DeviceStatus::out_of_memory);
  EXPECT_EQ(c[8].kind, PlacementCall::reserve);
  EXPECT_EQ(c[8].size, 9 * kGiB + 2 * kMiB);
  // Clean-up: the five live allocations in index order, then the reservation.
  ASSERT_EQ(c.size(), 9u + 5u + 1u);
  EXPECT_EQ(c[9].address, c[0].address);
  EXPECT_EQ(c[10].address, c[2].address);
  EXPECT_EQ(c.back().kind, PlacementCall::release);
  EXPECT_EQ(sim.live_segments(0), 0u);
  const std::string text = format_run(l, run);
  EXPECT_NE(text.find("alloc 4294967296 failed out_of_memory\n"), std::string::npos);
  EXPECT_NE(text.find("# end of sequence"), std::string::npos);
}

constexpr const char* kTrace =
    "# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM\n"
    "a,0,30000000,0\na,1,1000,0\na,2,50000000,1\nu,2,0\nf,0\na,3,30000000,0\n"
    "f,2\ns,0\na,4,60000000,1\nf,1\nf,3\na,5,90000000,0\nf,4\nf,5\n";

TEST(EngineOps, LoggedReplayMatchesTheReplayTool) {
  const reservoir::replay::Trace t = reservoir::replay::parse_trace_text(kTrace, "t");
  for (const char* config : {"", "max_split_size_mb:40"}) {
    const EngineRun run = replay_logged_sim(t, config, 8 * kGiB);
    reservoir::replay::ReplayOptions ro;
    ro.capacity = 8 * kGiB;
    const reservoir::replay::ReplayResult ref = reservoir::replay::replay_trace(t, config, ro);
    EXPECT_EQ(run.peak_reserved, ref.peak_reserved) << config;
    EXPECT_EQ(run.peak_requested, ref.peak_requested) << config;
    EXPECT_EQ(run.device_allocs, ref.device_allocs) << config;
    EXPECT_EQ(run.events, t.events.size());
    std::size_t allocs = 0, frees = 0;
    for (const PlacementCall& c : run.calls) {
      allocs += c.kind == PlacementCall::alloc;
      frees += c.kind == PlacementCall::free;
    }
    EXPECT_EQ(allocs, run.device_allocs) << config;
    EXPECT_EQ(frees, allocs) << config;  // teardown gives every segment back
    const OpList l = ops_from_calls(run.calls, "t");
    EXPECT_NO_THROW(validate(l));
    EXPECT_EQ(l.allocs(), allocs);
  }
}

// A trace's empty_cache lines are replayed as the replay tool does; its sleeps and
// wakes are refused (the placement tools replay requests, not tags).
TEST(EngineOps, EmptyCacheIsReplayedAndSleepsAreRefused) {
  const reservoir::replay::Trace t =
      reservoir::replay::parse_trace_text("a,0,30000000,0\nf,0\nc\na,1,60000000,0\nf,1\n", "c");
  const EngineRun run = replay_logged_sim(t, "", 8 * kGiB);
  reservoir::replay::ReplayOptions ro;
  ro.capacity = 8 * kGiB;
  const reservoir::replay::ReplayResult ref = reservoir::replay::replay_trace(t, "", ro);
  EXPECT_EQ(run.peak_reserved, ref.peak_reserved);
  EXPECT_EQ(run.device_allocs, 2u);  // the first segment went back at the c line
  const reservoir::replay::Trace tagged = reservoir::replay::parse_trace_text(
      "n,1,placement-tag\na,0,64,0,1\nz,1,discard\nw,1\n", "tagged");
  try {
    replay_logged_sim(tagged, "", 8 * kGiB);
    FAIL() << "a trace with sleeps was replayed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tagged: sleeps and wakes tags"), std::string::npos)
        << e.what();
  }
}

TEST(EngineOps, FitCapacityIsTheSmallestThatRuns) {
  const reservoir::replay::Trace t = reservoir::replay::parse_trace_text(kTrace, "t");
  const EngineRun big = replay_logged_sim(t, "", 8 * kGiB);
  const std::uint64_t fit = fit_capacity_sim(t, "", big.peak_reserved);
  ASSERT_GE(fit, t.peak_live_bytes);
  EXPECT_LE(fit, big.peak_reserved + big.peak_reserved / 100);
  EXPECT_EQ(replay_logged_sim(t, "", fit).ooms, 0u);
  if (fit > t.peak_live_bytes) {
    EXPECT_GT(replay_logged_sim(t, "", fit - 2 * kMiB - 1).ooms, 0u);
  }
}

}  // namespace
