// Command line of reservoir-replay (docs/replay.md), parsed with CLI11:
//   reservoir-replay [OPTIONS] TRACE
// TRACE is a file, or - for standard input.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "replay.hpp"

namespace reservoir::replay {

// A bad command line; what() says what is wrong.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CliOptions {
  std::string trace;
  std::vector<std::string> configs;  // in the order given; {""} when none was given
  std::size_t capacity = kDefaultSimCapacity;
  bool fit = false;
  bool json = false;
  std::string plot;  // "" = no plot
  // Where the measured replay runs: "sim" (default), "cuda" (the GPU: real memory and
  // host time), or "auto" (cuda when a GPU is present). The fit search always runs on
  // the simulated device.
  std::string device = "sim";
  // The device lags: the trace's work completes only at its host waits and frees
  // (ReplayOptions::device_keeps_up false).
  bool device_lags = false;
  // Count and time the device calls of the measured replays (CallProfile).
  bool calls = false;
  // The KV cache question (kv_cache_fit): bytes per token (0: not asked), the device
  // it must fit on with the program (default: capacity), and its allocations.
  std::uint64_t kv_bytes_per_token = 0;
  std::size_t kv_budget = 0;
  std::uint32_t kv_layers = 1;
  bool help = false;
  bool version = false;
};

// Parses argv[1..argc). Throws UsageError. With --help or --version, nothing else
// is checked or meaningful.
CliOptions parse_cli(int argc, const char* const* argv);

// "141G", "80GiB", "512MiB", "1.5GiB", "4096": a byte count. Suffixes (any case,
// optionally followed by "iB" or "B") are binary: K = 2^10, M = 2^20, G = 2^30,
// T = 2^40. nullopt for anything else, zero, or more than 2^63 bytes.
std::optional<std::size_t> parse_bytes(std::string_view text);

// Why reservoir-replay refuses config ("" if it does not): keys that configure the
// process rather than the allocator (sim_capacity, sim_completion, sim_pace, device, record_trace,
// oom_snapshot; the message names the option to use instead), and
// per_process_memory_fraction with --fit, which searches that fraction itself.
// Malformed settings are left to Config::parse.
std::string config_refusal(const std::string& config, bool fit);

// What --help prints.
std::string help_text();

// What --version prints (without the newline): "reservoir-replay 0.1.0".
std::string version_text();

}  // namespace reservoir::replay
