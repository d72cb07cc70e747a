// Command line of reservoir-replay (docs/replay.md):
//   reservoir-replay TRACE [--config STR]... [--capacity BYTES] [--fit] [--json]
//                          [--plot FILE.svg] [--device sim|cuda|auto]
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "replay.hpp"

namespace reservoir::replay {

// A bad command line; what() says what is wrong (the usage text is printed apart).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CliOptions {
  std::string trace;
  std::vector<std::string> configs;  // in the order given; {""} when none was given
  std::size_t capacity = kDefaultCapacity;
  bool fit = false;
  bool json = false;
  std::string plot;  // "" = no plot
  // Where the measured replay runs: "sim" (default), "cuda" (the GPU: real memory and
  // host time), or "auto" (cuda when a GPU is present). The fit search always runs on
  // the simulated device.
  std::string device = "sim";
  bool help = false;
};

// Parses argv[1..argc). Throws UsageError. With --help, only help is meaningful.
CliOptions parse_cli(int argc, const char* const* argv);

// "141G", "80GiB", "512MiB", "1.5GiB", "4096": a byte count. Suffixes (any case,
// optionally followed by "iB" or "B") are binary: K = 2^10, M = 2^20, G = 2^30,
// T = 2^40. nullopt for anything else, zero, or more than 2^63 bytes.
std::optional<std::size_t> parse_bytes(std::string_view text);

// The usage text printed by --help and after a usage error.
const char* usage_text();

}  // namespace reservoir::replay
