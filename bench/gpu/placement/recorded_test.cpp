// The H200's recorded placements (recorded/, GPU run A) against the simulated device's
// placement model (include/reservoir/sim_placement.hpp).
//
// What matches, exactly: every address of every recorded log — scenarios, op lists
// and live runs, allocations and reservations — when the model's window is the probe
// process's: reservations from 0x302000000 up (where the driver put the first one),
// segments from the end of the context's 512 MiB at 0x7f907e000000 down. The probe ran
// every scenario in one process, each freeing all it made, so each log starts from
// the same driver state — except the live runs of multistream_train_overlap and
// resnet50_train, by which time the process had taken the context's 2 MiB hole (their
// first 2 MiB segment skips it); they start with that hole taken.
//
// And: the engine on the simulated device makes the calls it made on the GPU (the
// live.* logs: sizes, order and which segment each free names).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/sim_placement.hpp"
#include "engine_ops.hpp"
#include "logging_backend.hpp"
#include "op_list.hpp"
#include "trace_reader.hpp"

namespace {

namespace fs = std::filesystem;
using namespace reservoir_bench::placement;
using reservoir::SimPlacement;

constexpr std::uintptr_t kProbeBottom = 0x302000000;
constexpr std::uintptr_t kProbeTop = 0x7f907e000000;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> recorded_logs() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(RESERVOIR_PLACEMENT_RECORDED)) {
    const std::string n = e.path().filename().string();
    if (n.ends_with(".txt") && n != "summary.txt") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool starts_without_the_small_hole(const std::string& stem) {
  return stem.starts_with("live.multistream_train_overlap.") ||
         stem.starts_with("live.resnet50_train.");
}

std::string hex(std::uintptr_t a) {
  std::ostringstream s;
  s << "0x" << std::hex << a;
  return s.str();
}

// Replays the log's calls on the model; "" when every address is the recorded one,
// else the first difference. *placed counts the calls that placed something.
std::string replay_on_model(const std::vector<PlacementCall>& calls, const SimPlacement& params,
                            std::size_t* placed) {
  reservoir::sim::DriverPlacement model(kProbeBottom, kProbeTop, params);
  *placed = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const PlacementCall& c = calls[i];
    const std::string where = "call " + std::to_string(i + 1) + ": ";
    if (c.status != reservoir::DeviceStatus::ok) return where + "a failed call (not modelled)";
    std::uintptr_t got = 0;
    switch (c.kind) {
      case PlacementCall::alloc:
        got = model.allocate(c.size);
        break;
      case PlacementCall::reserve:
        got = model.reserve(c.size, 2 * kMiB);
        break;
      case PlacementCall::free:
      case PlacementCall::release:
        if (!model.release(c.address)) return where + "nothing placed at " + hex(c.address);
        continue;
      default:
        continue;
    }
    ++*placed;
    if (got != c.address) {
      return where + (c.kind == PlacementCall::alloc ? "alloc " : "reserve ") +
             std::to_string(c.size) + ": driver " + hex(c.address) + ", model " + hex(got);
    }
  }
  return "";
}

TEST(RecordedPlacement, EveryAddressTheDriverGaveIsTheModels) {
  const std::vector<fs::path> logs = recorded_logs();
  ASSERT_GE(logs.size(), 45u);
  std::size_t total = 0;
  for (const fs::path& p : logs) {
    const std::string stem = p.stem().string();
    SimPlacement params;
    if (starts_without_the_small_hole(stem))
      params.context_holes.erase(params.context_holes.begin());
    std::size_t placed = 0;
    const std::string diff = replay_on_model(parse_calls(read_text(p), stem), params, &placed);
    EXPECT_EQ(diff, "") << stem;
    EXPECT_GT(placed, 0u) << stem;
    total += placed;
  }
  EXPECT_GE(total, 3000u);
}

TEST(RecordedPlacement, WithoutTheContextsSmallHoleTheLogsDiffer) {
  // Without the context's small hole, the other logs no longer match: the state at the
  // start is part of the model, not a free choice of the test.
  std::size_t differ = 0;
  for (const fs::path& p : recorded_logs()) {
    const std::string stem = p.stem().string();
    if (starts_without_the_small_hole(stem)) continue;
    SimPlacement params;
    params.context_holes.erase(params.context_holes.begin());
    std::size_t placed = 0;
    differ += !replay_on_model(parse_calls(read_text(p), stem), params, &placed).empty();
  }
  EXPECT_GE(differ, 10u);
}

TEST(RecordedPlacement, TheEngineMakesTheCallsItMadeOnTheGpu) {
  const char* traces = std::getenv("RESERVOIR_TRACES");
  ASSERT_NE(traces, nullptr);
  std::size_t compared = 0;
  for (const fs::path& p : recorded_logs()) {
    const std::string stem = p.stem().string();
    if (!stem.starts_with("live.")) continue;
    const std::string rest = stem.substr(5);  // TRACE.SETTING
    const std::string trace = rest.substr(0, rest.find('.'));
    const fs::path trace_path = fs::path(traces) / (trace + ".trace.gz");
    std::string config;
    bool known = false;
    for (const char* s : {"", "roundup_power2_divisions:4", "max_split_size_mb:128"}) {
      if (ops_name(trace_path.string(), s) == rest) {
        config = s;
        known = true;
      }
    }
    ASSERT_TRUE(known) << stem;
    const reservoir::replay::Trace t = reservoir::replay::read_trace(trace_path.string());
    const EngineRun run = replay_logged_sim(t, config, reservoir::kDefaultSimCapacity);
    const OpList gpu = ops_from_calls(parse_calls(read_text(p), stem), stem);
    const OpList sim = ops_from_calls(run.calls, stem);
    EXPECT_EQ(sim.allocs(), gpu.allocs()) << stem;
    EXPECT_EQ(format_ops(sim), format_ops(gpu)) << stem;
    ++compared;
  }
  EXPECT_EQ(compared, 9u);
}

TEST(RecordedPlacement, ProbeLogsParseBackAndBadLinesAreNamed) {
  const std::string text =
      "# reservoir placement probe v1\n\nalloc 20971520 0x7f907c800000\r\n"
      "alloc 4294967296 failed out_of_memory\nfree 0x7f907c800000\n"
      "reserve 168875261952 0x302000000\nrelease 0x302000000\nmap 2097152 0x302000000\n";
  const std::vector<PlacementCall> calls = parse_calls(text, "log");
  ASSERT_EQ(calls.size(), 6u);
  EXPECT_EQ(calls[0].address, 0x7f907c800000u);
  EXPECT_EQ(calls[1].status, reservoir::DeviceStatus::out_of_memory);
  EXPECT_EQ(calls[2].kind, PlacementCall::free);
  EXPECT_EQ(calls[3].size, 168875261952u);
  EXPECT_EQ(format_calls(calls),
            "alloc 20971520 0x7f907c800000\nalloc 4294967296 failed out_of_memory\n"
            "free 0x7f907c800000\nreserve 168875261952 0x302000000\nrelease 0x302000000\n"
            "map 2097152 0x302000000\n");
  for (const char* bad : {"grab 1 0x10\n", "alloc 0x10\n", "free 10\n", "alloc 5 0x10 extra\n"}) {
    try {
      parse_calls(bad, "log");
      ADD_FAILURE() << bad;
    } catch (const OpError& e) {
      EXPECT_TRUE(std::string(e.what()).starts_with("log:1: not a probe log line")) << e.what();
    }
  }
}

}  // namespace
