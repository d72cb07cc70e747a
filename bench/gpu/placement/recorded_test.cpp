// The H200's recorded placements (recorded/, GPU run A) against the simulated device's
// placement model (include/reservoir/sim_placement.hpp).
//
// What matches, exactly: every address of every recorded log — scenarios, op lists
// and live runs, allocations and reservations — when the model's window is the probe
// process's: reservations from 0x302000000 up (where the driver put the first one),
// segments from the end of the context's 512 MiB at 0x7f907e000000 down. The probe ran
// every scenario in one process, each freeing all it made, so each log starts from
// the same driver state but for one thing: by the live runs of multistream_train_overlap
// and resnet50_train the process had taken the context's 2 MiB hole (their first 2 MiB
// segment skips it). A log starts with that hole taken when, with it free, the first
// difference would be a segment the model puts into it; every address must then match.
//
// And: the engine on the simulated device makes the calls it made on the GPU (the
// live.* logs: sizes, order and which segment each free names).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/sim/placement.hpp"
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

std::string hex(std::uintptr_t a) {
  std::ostringstream s;
  s << "0x" << std::hex << a;
  return s.str();
}

// The context's 2 MiB hole (the first of SimPlacement's context_holes).
constexpr std::uintptr_t kSmallHole = kProbeTop - 98 * kMiB;

struct ModelRun {
  std::string diff;             // "" when every address is the recorded one
  std::uintptr_t model_at = 0;  // at the first difference, where the model placed it
  std::size_t placed = 0;       // calls that placed something
};

// Replays the log's calls on the model, up to the first difference.
ModelRun replay_on_model(const std::vector<PlacementCall>& calls, const SimPlacement& params) {
  reservoir::sim::DriverPlacement model(kProbeBottom, kProbeTop, params);
  ModelRun run;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const PlacementCall& c = calls[i];
    const std::string where = "call " + std::to_string(i + 1) + ": ";
    if (c.status != reservoir::DeviceStatus::ok) {
      run.diff = where + "a failed call (not modelled)";
      return run;
    }
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
        if (!model.release(c.address)) {
          run.diff = where + "nothing placed at " + hex(c.address);
          return run;
        }
        continue;
      default:
        continue;
    }
    ++run.placed;
    if (got != c.address) {
      run.diff = where + (c.kind == PlacementCall::alloc ? "alloc " : "reserve ") +
                 std::to_string(c.size) + ": driver " + hex(c.address) + ", model " + hex(got);
      run.model_at = got;
      return run;
    }
  }
  return run;
}

SimPlacement without_the_small_hole() {
  SimPlacement params;
  params.context_holes.erase(params.context_holes.begin());
  return params;
}

// The log on the model, from the probe's state: the default model, or — when the
// first difference is the model putting a segment into the context's 2 MiB hole —
// the model with that hole taken. *taken says which.
ModelRun replay_log(const std::vector<PlacementCall>& calls, bool* taken) {
  ModelRun run = replay_on_model(calls, SimPlacement{});
  *taken = !run.diff.empty() && run.model_at == kSmallHole;
  return *taken ? replay_on_model(calls, without_the_small_hole()) : run;
}

TEST(RecordedPlacement, EveryAddressTheDriverGaveIsTheModels) {
  const std::vector<fs::path> logs = recorded_logs();
  ASSERT_GE(logs.size(), 45u);
  std::size_t total = 0, without_hole = 0;
  for (const fs::path& p : logs) {
    const std::string stem = p.stem().string();
    bool taken = false;
    const ModelRun run = replay_log(parse_calls(read_text(p), stem), &taken);
    EXPECT_EQ(run.diff, "") << stem;
    EXPECT_GT(run.placed, 0u) << stem;
    total += run.placed;
    without_hole += taken;
  }
  EXPECT_GE(total, 3000u);
  EXPECT_LE(without_hole, logs.size() / 4);  // the exception, not the rule
}

TEST(RecordedPlacement, WithoutTheContextsSmallHoleTheLogsDiffer) {
  // The state at the start is part of the model: most logs need the hole free.
  std::size_t differ = 0;
  for (const fs::path& p : recorded_logs()) {
    const std::string stem = p.stem().string();
    differ +=
        !replay_on_model(parse_calls(read_text(p), stem), without_the_small_hole()).diff.empty();
  }
  EXPECT_GE(differ, 12u);
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
  EXPECT_GE(compared, 9u);
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
