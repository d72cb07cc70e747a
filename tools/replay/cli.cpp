// Command-line parsing for reservoir-replay. Hand-written: four options do not
// justify a dependency, and the messages can say exactly what is wrong.
#include "cli.hpp"

#include <cctype>
#include <charconv>
#include <cmath>

namespace reservoir::replay {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

}  // namespace

const char* usage_text() {
  return "usage: reservoir-replay TRACE [--config STR]... [--capacity BYTES] [--fit] [--json]\n"
         "                        [--plot FILE.svg] [--device sim|cuda|auto]\n"
         "  --device D        where the measured replay runs: sim (default), cuda (the GPU),\n"
         "                    auto (cuda when a GPU is present); --fit always uses sim\n"
         "                        [--plot FILE.svg]\n"
         "\n"
         "Replays an allocation trace (docs/trace_format.md; plain or .gz) through Reservoir\n"
         "on a simulated device and reports the memory each configuration needs.\n"
         "\n"
         "  --config STR      allocator settings, e.g. max_split_size_mb:256 (repeat to compare\n"
         "                    side by side; \"\" is the default configuration)\n"
         "  --capacity BYTES  simulated device memory (default 141GiB, an H200); suffixes\n"
         "                    K, M, G, T (binary, optionally followed by iB or B)\n"
         "  --fit             also search the smallest capacity that runs with no OOM\n"
         "  --json            print a JSON array instead of the table\n"
         "  --plot FILE.svg   write a chart of requested and reserved memory over the trace\n"
         "  -h, --help        show this text\n";
}

std::optional<std::size_t> parse_bytes(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  if (digits == 0) return std::nullopt;
  double value = 0;
  const std::string_view number = text.substr(0, digits);
  auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc{} || ptr != number.data() + number.size()) return std::nullopt;

  std::string_view suffix = text.substr(digits);
  double unit = 1;
  if (!suffix.empty() && !iequals(suffix, "b")) {
    static constexpr std::string_view kPrefixes = "kmgt";
    const auto p = kPrefixes.find(static_cast<char>(std::tolower(suffix.front())));
    if (p == std::string_view::npos) return std::nullopt;
    const std::string_view rest = suffix.substr(1);
    if (!rest.empty() && !iequals(rest, "ib") && !iequals(rest, "b")) return std::nullopt;
    unit = std::ldexp(1.0, 10 * static_cast<int>(p + 1));
  }
  const double bytes = std::floor(value * unit);
  if (!(bytes >= 1) || bytes > std::ldexp(1.0, 63)) return std::nullopt;
  return static_cast<std::size_t>(bytes);
}

CliOptions parse_cli(int argc, const char* const* argv) {
  CliOptions o;
  bool options_done = false;
  // Value of an option given as "--name VALUE" or "--name=VALUE".
  auto value_of = [&](int& i, std::string_view arg, std::string_view name,
                      std::string* out) -> bool {
    if (arg == name) {
      if (i + 1 >= argc) throw UsageError(std::string(name) + " needs a value");
      *out = argv[++i];
      return true;
    }
    if (arg.size() > name.size() && arg.substr(0, name.size()) == name && arg[name.size()] == '=') {
      *out = std::string(arg.substr(name.size() + 1));
      return true;
    }
    return false;
  };

  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string value;
    if (!options_done && arg.size() > 1 && arg[0] == '-') {
      if (arg == "--") {
        options_done = true;
      } else if (arg == "-h" || arg == "--help") {
        o.help = true;
      } else if (arg == "--fit") {
        o.fit = true;
      } else if (arg == "--json") {
        o.json = true;
      } else if (value_of(i, arg, "--config", &value)) {
        o.configs.push_back(value);
      } else if (value_of(i, arg, "--capacity", &value)) {
        auto bytes = parse_bytes(value);
        if (!bytes)
          throw UsageError("--capacity: '" + value +
                           "' is not a byte count (e.g. 80GiB, 141G, 512MiB, 1073741824)");
        o.capacity = *bytes;
      } else if (value_of(i, arg, "--device", &value)) {
        if (value != "sim" && value != "cuda" && value != "auto")
          throw UsageError("--device: '" + value + "' is not one of sim, cuda, auto");
        o.device = value;
      } else if (value_of(i, arg, "--plot", &value)) {
        if (value.empty()) throw UsageError("--plot needs a file name");
        o.plot = value;
      } else {
        throw UsageError("unknown option '" + std::string(arg) + "'");
      }
    } else if (o.trace.empty()) {
      o.trace = arg;
    } else {
      throw UsageError("unexpected argument '" + std::string(arg) + "' (one trace at a time)");
    }
  }
  if (o.help) return o;
  if (o.trace.empty()) throw UsageError("no trace given");
  if (o.configs.empty()) o.configs.push_back("");
  return o;
}

}  // namespace reservoir::replay
