// reservoir_placement_ops: writes the op lists of the device calls Reservoir's engine
// makes for each trace on the simulated device (bench/gpu/placement/ops/), for the
// placement probe to replay on the CUDA driver.
//
//   reservoir_placement_ops --traces traces --out bench/gpu/placement/ops
//   reservoir_placement_ops --traces traces --check bench/gpu/placement/ops   (CTest)
//
// Per trace: the settings of kSettings at the replay tool's default capacity, and the
// default setting at its own fit capacity (the calls under memory pressure, where cached
// segments are given back and new ones made). Each run is checked against
// reservoir-replay's own figures (same peaks and device calls), so the lists are the
// calls behind those figures.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine_ops.hpp"
#include "op_list.hpp"
#include "replay.hpp"
#include "reservoir/errors.hpp"

namespace {

namespace fs = std::filesystem;
using namespace reservoir_bench::placement;

const char* const kSettings[] = {"", "roundup_power2_divisions:4", "max_split_size_mb:128"};
// An H200 as reservoir-replay simulates it by default.
constexpr std::uint64_t kCapacity = reservoir::kDefaultSimCapacity;

const char* kUsage =
    "usage: reservoir_placement_ops --traces DIR (--out DIR | --check DIR)\n"
    "  --traces DIR  the *.trace.gz files to replay\n"
    "  --out DIR     write one op list per trace and setting\n"
    "  --check DIR   compare with the lists in DIR instead; exit 1 if any differs\n";

std::vector<std::string> trace_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 9 && name.compare(name.size() - 9, 9, ".trace.gz") == 0)
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The engine's calls for one trace and setting as an op list, with notes saying where
// they come from; *peak_reserved: the run's. Throws std::runtime_error when the run
// disagrees with reservoir-replay.
OpList engine_list(const reservoir::replay::Trace& trace, const std::string& config,
                   std::uint64_t capacity, const std::string& name, const char* what,
                   std::uint64_t* peak_reserved = nullptr) {
  const EngineRun run = replay_logged_sim(trace, config, capacity);
  reservoir::replay::ReplayOptions ro;
  ro.capacity = capacity;
  const reservoir::replay::ReplayResult ref = reservoir::replay::replay_trace(trace, config, ro);
  if (run.peak_reserved != ref.peak_reserved || run.device_allocs != ref.device_allocs ||
      run.device_frees != ref.device_frees || run.ooms != ref.ooms)
    throw std::runtime_error(name + ": the logged replay disagrees with reservoir-replay (peak " +
                             std::to_string(run.peak_reserved) + " vs " +
                             std::to_string(ref.peak_reserved) + ", device allocs " +
                             std::to_string(run.device_allocs) + " vs " +
                             std::to_string(ref.device_allocs) + ")");
  if (peak_reserved) *peak_reserved = run.peak_reserved;
  OpList list = ops_from_calls(run.calls, name);
  const std::string trace_name = fs::path(trace.path).filename().string();
  list.notes.push_back("f: the device calls of Reservoir's engine replaying " + trace_name +
                       " on the simulated device");
  list.notes.push_back("config \"" + config + "\", capacity " + std::to_string(capacity) + " (" +
                       what + ")");
  list.notes.push_back("sim: peak requested " + std::to_string(run.peak_requested) +
                       ", peak reserved " + std::to_string(run.peak_reserved) + ", device allocs " +
                       std::to_string(run.device_allocs) + ", device frees " +
                       std::to_string(run.device_frees) + ", OOMs " + std::to_string(run.ooms));
  return list;
}

bool same(const OpList& a, const OpList& b) {
  if (a.notes != b.notes || a.ops.size() != b.ops.size()) return false;
  for (std::size_t i = 0; i < a.ops.size(); ++i)
    if (a.ops[i].kind != b.ops[i].kind || a.ops[i].value != b.ops[i].value) return false;
  return true;
}

int run(const std::string& traces, const std::string& out, bool check) {
  int stale = 0;
  std::size_t lists = 0;
  for (const std::string& path : trace_files(traces)) {
    const reservoir::replay::Trace trace = reservoir::replay::read_trace(path);
    if (trace.pools + trace.sleeps > 0) {  // the engine lists replay requests only
      std::printf("skipped %s: it routes to private pools or sleeps tags\n", path.c_str());
      continue;
    }
    std::vector<OpList> made;
    std::uint64_t default_peak = 0;
    for (const char* config : kSettings)
      made.push_back(engine_list(trace, config, kCapacity, ops_name(path, config),
                                 "reservoir-replay's default device",
                                 *config == '\0' ? &default_peak : nullptr));
    const std::uint64_t fit = fit_capacity_sim(trace, "", default_peak);
    if (fit > 0)
      made.push_back(engine_list(trace, "", fit, ops_name(path, "") + "_at_fit",
                                 "the smallest capacity that runs with no OOM, to 2 MiB"));
    for (const OpList& list : made) {
      ++lists;
      const std::string file = (fs::path(out) / (list.name + ".txt")).string();
      if (!check) {
        write_ops(file, list);
        std::printf("%s: %zu ops, %zu allocs\n", file.c_str(), list.ops.size(), list.allocs());
        continue;
      }
      if (!fs::exists(file) || !same(read_ops(file), list)) {
        std::printf("stale: %s\n", file.c_str());
        ++stale;
      }
    }
  }
  if (check) {
    std::printf("%zu op lists checked, %d stale%s\n", lists, stale,
                stale ? " (regenerate: reservoir_placement_ops --traces traces --out "
                        "bench/gpu/placement/ops)"
                      : "");
  }
  return stale ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string traces, out, check;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string* to) {
      if (i + 1 >= argc) return false;
      *to = argv[++i];
      return true;
    };
    bool ok = true;
    if (arg == "--traces")
      ok = value(&traces);
    else if (arg == "--out")
      ok = value(&out);
    else if (arg == "--check")
      ok = value(&check);
    else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "reservoir_placement_ops: bad argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  if (traces.empty() || out.empty() == check.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    if (!out.empty()) fs::create_directories(out);
    return run(traces, out.empty() ? check : out, !check.empty());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reservoir_placement_ops: %s\n", e.what());
    return 1;
  }
}
