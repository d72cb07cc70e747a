// Command-line parsing for reservoir-replay, with CLI11 (Debian libcli11-dev,
// header-only). CLI11 reads the options; the checks of their values stay here, so
// the messages can say exactly what is wrong.
#include "cli.hpp"

#include <CLI/CLI.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <memory>

#include "report.hpp"
#include "reservoir/config.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/version.hpp"

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

// Help text columns: options in the first kColumn, descriptions wrapped to kWidth.
constexpr std::size_t kColumn = 24, kWidth = 88;

// Breaks text at spaces into lines of at most width characters (CLI11 indents
// each continuation line to the description column).
std::string wrap(std::string_view text, std::size_t width) {
  std::string out, line;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(start, end - start);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line += word;
    start = end + 1;
  }
  return out + line;
}

std::string describe(std::string_view text) {
  return wrap(text, kWidth - kColumn);
}

// Option values as typed, before the checks of parse_cli.
struct RawOptions {
  std::string capacity;
  std::string kv_cache, kv_budget;
  std::vector<std::string> configs;
};

// The one definition of the command line: parse_cli and help_text both use it.
std::unique_ptr<CLI::App> make_app(CliOptions& o, RawOptions& raw) {
  auto app = std::make_unique<CLI::App>(
      wrap("Replays an allocation trace (docs/trace_format.md; plain or gzip) through "
           "Reservoir and reports the memory each allocator setting needs, on a simulated "
           "device unless --device says otherwise.",
           kWidth) +
          "\n",
      "reservoir-replay");
  app->get_formatter()->column_width(kColumn);
  app->get_formatter()->label("REQUIRED", "");
  app->set_help_flag("-h,--help", "show this text and exit");
  app->set_version_flag("--version", version_text(), "print the version and exit");
  app->add_option("TRACE", o.trace, describe("trace file, plain or gzip; - reads standard input"))
      ->type_name("")
      ->required();
  app->add_option("--config", raw.configs,
                  describe("allocator settings as in RESERVOIR_ALLOC_CONF (docs/config.md), "
                           "e.g. max_split_size_mb:256; repeat to compare side by side; \"\" "
                           "is the default configuration"))
      ->type_name("STR")
      ->expected(1)
      ->take_all();
  app->add_option(
         "--capacity", raw.capacity,
         describe("memory of the simulated device, default " + with_commas(kDefaultSimCapacity) +
                  " (" + human_bytes(kDefaultSimCapacity) +
                  ", an H200); suffixes K, M, G, T, binary, optionally followed by iB "
                  "or B"))
      ->type_name("BYTES");
  app->add_flag("--fit", o.fit,
                describe("also find the smallest memory fraction of the device under which "
                         "the whole trace runs, as PyTorch's "
                         "set_per_process_memory_fraction"))
      ->disable_flag_override();
  app->add_flag("--device-lags", o.device_lags,
                describe("on the simulated device, a stream's work completes only at the "
                         "trace's host waits (s lines) and at frees on it, so memory used on "
                         "other streams (u lines) is reused later; by default the device keeps "
                         "up, as when the trace is replayed on a GPU"))
      ->disable_flag_override();
  app->add_flag("--calls", o.calls,
                describe("also count and time every device call of the measured replays "
                         "(allocate, map, unmap, set_access, record_event, ...): the report "
                         "adds a row per kind, calls x host time each; the clock reads add "
                         "~40 ns to each call"))
      ->disable_flag_override();
  app->add_option("--kv-cache", raw.kv_cache,
                  describe("also find the largest KV cache of BYTES per token that still fits "
                           "on the device with the program, made just before its first CUDA "
                           "graph capture (or at the start); suffixes as --capacity"))
      ->type_name("BYTES");
  app->add_option("--kv-budget", raw.kv_budget,
                  describe("the device memory for --kv-cache, default --capacity"))
      ->type_name("BYTES");
  app->add_option("--kv-layers", o.kv_layers,
                  describe("the KV cache is this many equal allocations (one per layer), "
                           "default 1"))
      ->type_name("N")
      ->check(CLI::Range(1u, 65536u));
  app->add_flag("--json", o.json, describe("print a JSON array instead of the table"))
      ->disable_flag_override();
  app->add_option("--plot", o.plot,
                  describe("write a chart of requested and reserved memory over the trace, "
                           "one panel per setting; FILE ends in .svg, or in .png when the "
                           "build has cairo"))
      ->type_name("FILE");
  app->add_option("--device", o.device,
                  describe("where the measured replay runs: sim (default), cuda (the GPU: "
                           "real memory and host time) or auto (cuda when a GPU is present); "
                           "--fit always runs on sim"))
      ->type_name("DEVICE");
  app->footer(
      wrap("Exit codes: 0 done (OOMs are results, not errors), 2 bad input, 1 an "
           "internal error. More in docs/replay.md.",
           kWidth));
  return app;
}

}  // namespace

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

std::string config_refusal(const std::string& config, bool fit) {
  std::vector<std::string> keys;
  try {
    keys = Config::keys_of(config);
  } catch (const ConfigError&) {
    return "";  // malformed: Config::parse says how
  }
  const std::string head = "--config '" + config + "': ";
  for (const std::string& key : keys) {
    if (key == "sim_capacity")
      return head + "sim_capacity sets the simulated device of a program; here use --capacity";
    if (key == "sim_completion" || key == "sim_pace")
      return head + key +
             " sets when a program's simulated device completes work; here the trace's "
             "host waits do, and --device-lags chooses whether all work completes at once";
    if (key == "device")
      return head + "device picks the backend of a program; here use --device sim|cuda|auto";
    if (key == "record_trace")
      return head +
             "record_trace records a program's trace; reservoir-replay reads one: remove the key";
    if (key == "oom_snapshot")
      return head +
             "oom_snapshot is a program's setting; the report describes each setting's first "
             "OOM: remove the key";
    if (key == "per_process_memory_fraction" && fit)
      return head +
             "--fit searches the memory fraction itself: remove per_process_memory_fraction, or "
             "drop --fit";
  }
  return "";
}

std::string help_text() {
  CliOptions o;
  RawOptions raw;
  return make_app(o, raw)->help();
}

std::string version_text() {
  return std::string("reservoir-replay ") + reservoir::version();
}

CliOptions parse_cli(int argc, const char* const* argv) {
  CliOptions o;
  RawOptions raw;
  auto app = make_app(o, raw);
  app->allow_extras();  // reported below, in words of this tool
  try {
    app->parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    o.help = true;
    return o;
  } catch (const CLI::CallForVersion&) {
    o.version = true;
    return o;
  } catch (const CLI::RequiredError&) {
    throw UsageError("no trace given");  // TRACE is the only required argument
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11 says "--config: 1 required STR missing" or "fit was given a disallowed
    // flag override"; the option's name comes first either way.
    const std::string what = e.what();
    if (what.find("flag override") != std::string::npos)
      throw UsageError("--" + what.substr(0, what.find(' ')) + " takes no value");
    throw UsageError(what.substr(0, what.find(':')) + " needs a value");
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  for (const std::string& extra : app->remaining()) {
    if (extra.size() > 1 && extra[0] == '-') throw UsageError("unknown option '" + extra + "'");
    throw UsageError("unexpected argument '" + extra + "' (one trace at a time)");
  }
  if (o.trace.empty()) throw UsageError("no trace given");
  if (!raw.capacity.empty() || app->count("--capacity") > 0) {
    const auto bytes = parse_bytes(raw.capacity);
    if (!bytes)
      throw UsageError("--capacity: '" + raw.capacity +
                       "' is not a byte count (e.g. 80GiB, 141G, 512MiB, 1073741824)");
    o.capacity = *bytes;
  }
  auto bytes_of = [](const std::string& option, const std::string& text) {
    const auto bytes = parse_bytes(text);
    if (!bytes)
      throw UsageError(option + ": '" + text +
                       "' is not a byte count (e.g. 80GiB, 141G, 512MiB, 1073741824)");
    return *bytes;
  };
  if (app->count("--kv-cache") > 0) o.kv_bytes_per_token = bytes_of("--kv-cache", raw.kv_cache);
  o.kv_budget = app->count("--kv-budget") > 0 ? bytes_of("--kv-budget", raw.kv_budget) : o.capacity;
  if (app->count("--kv-budget") > 0 && o.kv_bytes_per_token == 0)
    throw UsageError("--kv-budget: the budget of --kv-cache, which was not given");
  if (app->count("--kv-layers") > 0 && o.kv_bytes_per_token == 0)
    throw UsageError("--kv-layers: the layers of --kv-cache, which was not given");
  if (o.device != "sim" && o.device != "cuda" && o.device != "auto")
    throw UsageError("--device: '" + o.device + "' is not one of sim, cuda, auto");
  if (app->count("--plot") > 0 && o.plot.empty()) throw UsageError("--plot needs a file name");
  o.configs = raw.configs.empty() ? std::vector<std::string>{""} : raw.configs;
  return o;
}

}  // namespace reservoir::replay
