// reservoir-replay: how much memory a recorded workload needs under each allocator
// setting, learned on a simulated device before running it (docs/replay.md).
//
// Exit codes: 0 success (OOMs are results, not errors); 2 a usage error, a missing,
// malformed, damaged or empty trace, a refused config or plot; 1 anything unexpected.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli.hpp"
#include "plot.hpp"
#include "replay.hpp"
#include "report.hpp"
#include "reservoir/config.hpp"
#include "reservoir/errors.hpp"
#if RESERVOIR_HAVE_CUDA
#include "reservoir/cuda_backend.hpp"
#endif
#include "trace_reader.hpp"

namespace {

using namespace reservoir::replay;
using Clock = std::chrono::steady_clock;

// A one-line progress bar on stderr, shown only on a terminal and only once the
// work has taken more than a second (short runs stay quiet).
class ProgressBar {
 public:
  ProgressBar() : enabled_(isatty(STDERR_FILENO) == 1), start_(Clock::now()) {}
  ~ProgressBar() { clear(); }

  void set_label(std::string label) { label_ = std::move(label); }

  void update(std::size_t done, std::size_t total) {
    if (!enabled_ || total == 0) return;
    const auto now = Clock::now();
    if (now - start_ < std::chrono::seconds(1)) return;
    if (shown_ && now - last_ < std::chrono::milliseconds(100) && done < total) return;
    last_ = now;
    constexpr int kWidth = 30;
    const int filled =
        static_cast<int>(static_cast<double>(done) / static_cast<double>(total) * kWidth);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\033[K%s [%s] %3d%%", label_.c_str(), bar.c_str(),
                 static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total)));
    std::fflush(stderr);
    shown_ = true;
  }

  void clear() {
    if (!shown_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
  Clock::time_point start_, last_;
  std::string label_;
};

int fail(const std::string& message, bool show_usage = false) {
  std::fprintf(stderr, "reservoir-replay: %s\n", message.c_str());
  if (show_usage) std::fprintf(stderr, "Run reservoir-replay --help for the options.\n");
  return 2;
}

int run(const CliOptions& opts) {
  // Every config is checked before any replay, so a typo in the last one does not
  // cost the time of the first ones.
  for (const std::string& c : opts.configs) {
    if (const std::string why = config_refusal(c, opts.fit); !why.empty()) return fail(why);
    try {
      (void)reservoir::Config::parse(c);
    } catch (const reservoir::ConfigError& e) {
      return fail("--config '" + c + "': " + e.what());
    }
  }

  // Likewise a plot that cannot be written is reported before the replays.
  if (!opts.plot.empty()) {
    if (const std::string why = plot_refusal(opts.plot); !why.empty()) return fail(why);
    if (!std::ofstream(opts.plot, std::ios::binary))
      return fail("cannot write plot '" + opts.plot + "'");
  }

  Trace trace;
  try {
    trace = read_trace(opts.trace);
  } catch (const TraceError& e) {
    return fail(e.what());
  }
  for (const std::string& c : opts.configs)
    if (const std::string why = trace_refusal(trace, c); !why.empty()) return fail(why);
  // Nothing to measure: say so rather than print a table of zeros.
  if (trace.allocations == 0) {
    return fail("warning: " + trace.path + " has " +
                (trace.events.empty() ? std::string("no events (empty, or only comments)")
                                      : "no allocations") +
                ": nothing to replay");
  }

  // The device of the measured replays.
  std::shared_ptr<reservoir::Backend> device;
  std::string device_name = "simulated";
  if (opts.device != "sim") {
#if RESERVOIR_HAVE_CUDA
    if (reservoir::CudaBackend::available()) {
      auto cuda = std::make_shared<reservoir::CudaBackend>();
      device_name = cuda->device_name(0) + " (CUDA)";
      device = cuda;
    } else if (opts.device == "cuda") {
      return fail("--device cuda: " + reservoir::CudaBackend::unavailable_reason());
    }
#else
    if (opts.device == "cuda") return fail("--device cuda: this build has no CUDA backend");
#endif
  }
  std::fprintf(stderr, "reservoir-replay: replaying on the %s device\n", device_name.c_str());

  ProgressBar bar;
  ProgressFn progress = [&bar](std::size_t done, std::size_t total) { bar.update(done, total); };
  std::vector<ReplayResult> results;
  for (const std::string& c : opts.configs) {
    const std::string label = config_label(c);
    bar.set_label(label + ": replay");
    ReplayOptions ro;
    ro.capacity = opts.capacity;
    ro.device_keeps_up = !opts.device_lags;
    ro.progress = progress;
    ro.backend = device;
    ro.profile_calls = opts.calls;
    ReplayResult r = replay_trace(trace, c, ro);

    if (opts.fit) {
      FitOptions fo;
      fo.device_total = opts.capacity;
      fo.device_keeps_up = !opts.device_lags;
      fo.progress = progress;
      fo.on_step = [&](int run) { bar.set_label(label + ": fit, run " + std::to_string(run)); };
      const FitResult f = fit_memory_fraction(trace, c, r, fo);
      r.fit_capacity = f.capacity;
      r.fit_fraction = f.fraction.value_or(0.0);
      if (f.capacity && r.peak_requested > 0)
        r.fit_ratio = static_cast<double>(*f.capacity) / static_cast<double>(r.peak_requested);
    }
    if (opts.kv_bytes_per_token > 0) {
      bar.set_label(label + ": KV cache");
      r.kv_cache =
          kv_cache_fit(trace, c, opts.kv_bytes_per_token, opts.kv_budget, opts.kv_layers, progress);
    }
    if (!opts.plot.empty()) {
      // A separate run: sampling the statistics after every event would distort
      // the host time of the measured run.
      bar.set_label(label + ": timeline");
      ReplayOptions po = ro;
      po.backend = nullptr;  // timelines come from the simulated device
      po.timeline_points = 2000;
      po.profile_calls = false;
      r.timeline = replay_trace(trace, c, po).timeline;
    }
    results.push_back(std::move(r));
  }
  bar.clear();

  const std::string out = opts.json ? format_json(results, opts.fit)
                                    : format_table(trace, opts.capacity, results, opts.fit,
                                                   device ? device_name : std::string());
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);

  if (!opts.plot.empty()) {
    try {
      write_plot(opts.plot, std::filesystem::path(trace.path).filename().string(), results);
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    std::fprintf(stderr, "reservoir-replay: wrote %s\n", opts.plot.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CliOptions opts;
  try {
    opts = parse_cli(argc, argv);
  } catch (const UsageError& e) {
    return fail(e.what(), true);
  }
  if (opts.help) {
    std::fputs(help_text().c_str(), stdout);
    return 0;
  }
  if (opts.version) {
    std::printf("%s\n", version_text().c_str());
    return 0;
  }
  try {
    return run(opts);
  } catch (const reservoir::ConfigError& e) {
    return fail(e.what());
  } catch (const TraceError& e) {
    return fail(e.what());
  } catch (const reservoir::InvalidArgumentError& e) {
    // What the trace did (a valid sequence: the reader checked it) that this setting or
    // device cannot do: a sleep where memory cannot be mapped.
    return fail(e.what());
  } catch (const std::exception& e) {
    // An engine error during a replay is a bug in Reservoir, not in the input.
    std::fprintf(stderr, "reservoir-replay: internal error: %s\n", e.what());
    return 1;
  }
}
