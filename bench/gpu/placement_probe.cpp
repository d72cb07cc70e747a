// reservoir_placement_probe: where does the CUDA driver place the segments Reservoir's
// engine asks for? Runs op lists (bench/gpu/placement/) through the project's
// CudaBackend -- cuMemAlloc for segments, cuMemAddressReserve for reservations, the calls
// the engine makes -- and writes one log per scenario: "alloc SIZE 0xADDR",
// "free 0xADDR", "reserve SIZE 0xADDR", ... under a header naming the device, driver,
// memory and VMM granularity.
//
//   reservoir_placement_probe --out DIR [--ops DIR] [--traces DIR] [--device cuda|sim]
//
// Scenarios: the built-in ones (placement/scenarios.hpp: a-e), every op list in --ops
// (f: the engine's calls on the simulated device, from reservoir_placement_ops), and with
// --traces, each trace replayed live through Reservoir on this device under the op
// lists' settings, logging the engine's own calls ("live.*": compare with f to see where
// the simulated device's placement changed the engine's choices). --device sim runs
// the same on SimBackend, the simulated device's answers for comparison.
// Every allocation is freed at the end of each scenario. stdout: one line per scenario.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "placement/engine_ops.hpp"
#include "placement/op_runner.hpp"
#include "placement/scenarios.hpp"
#include "reservoir/sim_backend.hpp"
#if RESERVOIR_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "reservoir/cuda_backend.hpp"
#endif

namespace {

namespace fs = std::filesystem;
using namespace reservoir_bench::placement;

const char* const kLiveSettings[] = {"", "roundup_power2_divisions:4", "max_split_size_mb:128"};

const char* kUsage =
    "usage: reservoir_placement_probe --out DIR [--ops DIR] [--traces DIR] [--device cuda|sim]\n"
    "  --out DIR     one log per scenario (DIR/<scenario>.txt) and DIR/summary.txt\n"
    "  --ops DIR     also replay the op lists DIR/*.txt (bench/gpu/placement/ops)\n"
    "  --traces DIR  also replay DIR/*.trace.gz live through Reservoir, logging its calls\n"
    "  --device D    cuda (default) or sim (the simulated device, for comparison)\n";

struct Options {
  std::string out, ops, traces, device = "cuda";
};

std::vector<std::string> files_ending(const std::string& dir, const std::string& tail) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string p = e.path().string();
    if (p.size() > tail.size() && p.compare(p.size() - tail.size(), tail.size(), tail) == 0)
      out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Device {
  std::shared_ptr<Backend> backend;
  reservoir::SimBackend* sim = nullptr;  // backend itself when simulated
  std::vector<std::string> header;       // name, driver, granularity (memory per scenario)
};

Device open_device(const std::string& kind) {
  Device d;
  std::string name;
  std::string versions;
  if (kind == "sim") {
    reservoir::SimOptions o;
    o.capacity = 141 * kGiB;  // reservoir-replay's default device
    auto sim = std::make_shared<reservoir::SimBackend>(o);
    d.sim = sim.get();
    d.backend = sim;
    name = "simulated (SimBackend, 141 GiB)";
  } else {
#if RESERVOIR_HAVE_CUDA
    if (!reservoir::CudaBackend::available())
      throw std::runtime_error("--device cuda: " + reservoir::CudaBackend::unavailable_reason());
    auto cuda = std::make_shared<reservoir::CudaBackend>();
    name = cuda->device_name(0);
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    versions = "driver API " + std::to_string(driver) + ", runtime " + std::to_string(runtime);
    d.backend = cuda;
#else
    throw std::runtime_error("--device cuda: this build has no CUDA toolkit (use --device sim)");
#endif
  }
  std::size_t g = 0;
  const bool vmm = d.backend->has(reservoir::kVirtualMemory) &&
                   d.backend->granularity(0, &g) == reservoir::DeviceStatus::ok;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  d.header = {"reservoir placement probe v1", "date " + std::string(date),
              "device " + name + (versions.empty() ? "" : "; " + versions),
              "vmm " + std::string(vmm ? "yes" : "no") + "; granularity " + std::to_string(g)};
  return d;
}

reservoir::MemoryInfo memory(Device& d) {
  reservoir::MemoryInfo info;
  (void)d.backend->memory_info(0, &info);
  return info;
}

std::string memory_line(const reservoir::MemoryInfo& m) {
  return "memory_info total " + std::to_string(m.total) + " free " + std::to_string(m.free);
}

class Writer {
 public:
  Writer(std::string dir, Device& device) : dir_(std::move(dir)), device_(device) {}

  void write(const std::string& name, const std::vector<std::string>& notes,
             const std::string& body, const std::vector<PlacementCall>& calls, double seconds) {
    std::vector<std::string> header = device_.header;
    header.push_back("scenario " + name);
    header.push_back(memory_line(memory(device_)) + " (after the scenario)");
    std::string text;
    for (const std::string& h : header) text += "# " + h + "\n";
    for (const std::string& n : notes) text += "# " + n + "\n";
    text += body;
    const std::string path = (fs::path(dir_) / (name + ".txt")).string();
    std::ofstream(path, std::ios::binary) << text;
    const PlacementSummary s = summarize(calls);
    char line[512];
    std::snprintf(line, sizeof line,
                  "%-56s allocs %5zu failed %3zu below-previous %4zu in-freed-range %4zu "
                  "reserves %zu (%.2f s)",
                  name.c_str(), s.allocs, s.failed, s.down, s.reuse, s.reserves, seconds);
    std::puts(line);
    std::fflush(stdout);
    summary_ += std::string(line) + "\n";
  }

  void finish() {
    std::string text;
    for (const std::string& h : device_.header) text += "# " + h + "\n";
    text += "# " + memory_line(memory(device_)) + " (at the end)\n";
    text +=
        "# per scenario: allocations, failed ones, placed below the previous one, placed\n"
        "# inside a range freed earlier in the scenario, reservations\n";
    std::ofstream(fs::path(dir_) / "summary.txt", std::ios::binary) << text << summary_;
  }

 private:
  std::string dir_;
  Device& device_;
  std::string summary_;
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_list(Writer& w, Device& d, const OpList& list) {
  const auto t0 = std::chrono::steady_clock::now();
  const OpRun run = run_ops(list, *d.backend);
  std::vector<PlacementCall> seq(run.calls.begin(),
                                 run.calls.begin() + static_cast<long>(run.end_of_sequence));
  w.write(list.name, {}, format_run(list, run), seq, since(t0));
}

int probe(const Options& o) {
  Device d = open_device(o.device);
  fs::create_directories(o.out);
  for (const std::string& h : d.header) std::printf("# %s\n", h.c_str());
  const reservoir::MemoryInfo m0 = memory(d);
  std::printf("# %s\n", memory_line(m0).c_str());
  std::size_t g = 0;
  if (d.backend->granularity(0, &g) != reservoir::DeviceStatus::ok) g = 2 * kMiB;
  Writer w(o.out, d);

  for (const OpList& list : builtin_scenarios(m0.total, g)) run_list(w, d, list);
  if (!o.ops.empty())
    for (const std::string& path : files_ending(o.ops, ".txt")) {
      OpList list = read_ops(path);
      list.name = "ops." + list.name;
      run_list(w, d, list);
    }
  if (!o.traces.empty())
    for (const std::string& path : files_ending(o.traces, ".trace.gz")) {
      const reservoir::replay::Trace trace = reservoir::replay::read_trace(path);
      if (trace.pools + trace.sleeps > 0) {  // the engine lists replay requests only
        std::printf("skipped %s: it routes to private pools or sleeps tags\n", path.c_str());
        continue;
      }
      for (const char* config : kLiveSettings) {
        const auto t0 = std::chrono::steady_clock::now();
        const EngineRun run = replay_logged(trace, config, d.backend, d.sim);
        const std::string notes[] = {
            "live: Reservoir's engine replaying " + fs::path(path).filename().string() +
                " on this device, config \"" + config + "\"",
            "peak requested " + std::to_string(run.peak_requested) + ", peak reserved " +
                std::to_string(run.peak_reserved) + ", device allocs " +
                std::to_string(run.device_allocs) + ", device frees " +
                std::to_string(run.device_frees) + ", OOMs " + std::to_string(run.ooms)};
        w.write("live." + ops_name(path, config), {notes[0], notes[1]}, format_calls(run.calls),
                run.calls, since(t0));
      }
    }
  w.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::string* to = arg == "--out"      ? &o.out
                      : arg == "--ops"    ? &o.ops
                      : arg == "--traces" ? &o.traces
                      : arg == "--device" ? &o.device
                                          : nullptr;
    if (to == nullptr || i + 1 >= argc) {
      std::fprintf(stderr, "reservoir_placement_probe: bad argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
    *to = argv[++i];
  }
  if (o.out.empty() || (o.device != "cuda" && o.device != "sim")) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    return probe(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reservoir_placement_probe: %s\n", e.what());
    return 1;
  }
}
