// Parsing of the allocator settings (include/reservoir/config.hpp, docs/config.md).
#include "reservoir/config.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "reservoir/errors.hpp"

namespace reservoir {

namespace {

constexpr std::size_t kLargeBufferMiB = 20;

std::string trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

[[noreturn]] void bad(const std::string& key, const std::string& value,
                      const std::string& allowed) {
  throw ConfigError("reservoir config: bad value '" + value + "' for key '" + key +
                    "': " + allowed);
}

bool parse_uint(const std::string& text, unsigned long long* out) {
  if (text.empty()) return false;
  for (char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  errno = 0;
  char* end = nullptr;
  *out = std::strtoull(text.c_str(), &end, 10);
  return errno == 0 && end && *end == '\0';
}

bool parse_double(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end && *end == '\0' && std::isfinite(*out);
}

bool parse_bool(const std::string& text, bool* out) {
  if (text == "True" || text == "true" || text == "1") return *out = true, true;
  if (text == "False" || text == "false" || text == "0") return *out = false, true;
  return false;
}

bool is_power_of_two(unsigned long long v) {
  return v != 0 && (v & (v - 1)) == 0;
}

// "1048576", "512MiB", "80GiB", "141G", "2M", "64KiB".
bool parse_bytes(const std::string& text, std::size_t* out) {
  std::size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  unsigned long long number = 0;
  if (!parse_uint(text.substr(0, i), &number)) return false;
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  unsigned shift = 0;
  if (unit.empty() || unit == "b")
    shift = 0;
  else if (unit == "k" || unit == "kib" || unit == "kb")
    shift = 10;
  else if (unit == "m" || unit == "mib" || unit == "mb")
    shift = 20;
  else if (unit == "g" || unit == "gib" || unit == "gb")
    shift = 30;
  else if (unit == "t" || unit == "tib" || unit == "tb")
    shift = 40;
  else
    return false;
  if (shift && number > (~0ull >> shift)) return false;
  *out = static_cast<std::size_t>(number << shift);
  return true;
}

// ---- to_string(): values as the parser reads them back, exactly ----

// Shortest fixed-point text that reads back as v, always with a decimal point (the
// parser takes "1" for expandable_segments_reserve as one byte, "1.0" as a fraction).
std::string decimal_text(double v) {
  char buf[400];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  std::string out(buf, r.ec == std::errc{} ? r.ptr : buf);
  if (out.find('.') == std::string::npos) out += ".0";
  return out;
}

// "64GiB", "1536MiB", "1000" (the largest unit that divides the size).
std::string bytes_text(std::size_t bytes) {
  static constexpr std::pair<unsigned, const char*> kUnits[] = {
      {40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}};
  for (const auto& [shift, unit] : kUnits)
    if (bytes % (std::size_t{1} << shift) == 0) return std::to_string(bytes >> shift) + unit;
  return std::to_string(bytes);
}

// The list form that parse_roundup() reads back as d: the first entry ends the
// leading run of equal values (it also sets every interval below it), then each
// nonzero interval, then ">" for a trailing nonzero run; one number when all are equal.
std::string roundup_text(const std::array<std::size_t, kRoundupIntervals>& d) {
  std::size_t lead = 0;
  while (lead + 1 < kRoundupIntervals && d[lead + 1] == d[0]) ++lead;
  if (lead + 1 == kRoundupIntervals) return std::to_string(d[0]);
  std::size_t tail = kRoundupIntervals - 1;
  while (d[tail - 1] == d[tail]) --tail;  // stops at lead + 1 at the latest
  const bool tail_entry = d[tail] != 0;   // ">" follows the entry at tail - 1
  std::string out = "[";
  auto entry = [&out](std::size_t index, const std::string& value) {
    if (out.size() > 1) out += ',';
    out += std::to_string(std::size_t{1} << index) + ":" + value;
  };
  entry(lead, std::to_string(d[lead]));
  const std::size_t last = tail_entry ? tail : kRoundupIntervals;
  for (std::size_t i = lead + 1; i < last; ++i)
    if (d[i] != 0 || (tail_entry && i + 1 == tail)) entry(i, std::to_string(d[i]));
  if (tail_entry) out += ",>:" + std::to_string(d[tail]);
  return out + "]";
}

// Splits on top-level commas (commas inside [...] stay).
std::vector<std::string> split_entries(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out.push_back(cur);
  return out;
}

// PyTorch's meaning of the list form, quirks included (the default reproduces its
// rounding to the byte): the interval index of an entry SIZE is log2(SIZE) (clamped to
// the 16 intervals; interval i holds sizes in [2^i MiB, 2^(i+1) MiB)); the first entry
// also sets every interval below it; later entries set their own interval only (gaps
// between entries keep 0, no rounding); ">" sets every interval after the last entry.
// 0 divisions means no rounding.
void parse_roundup(Config& c, const std::string& key, const std::string& value) {
  const std::string allowed =
      "a power of two (e.g. 4), or a list of SIZE_MB:DIVISIONS entries with power-of-two "
      "sizes, power-of-two (or 0) divisions and an optional final >:DIVISIONS (e.g. "
      "[256:1,512:2,>:8])";
  if (value.empty()) bad(key, value, allowed);
  if (value.front() != '[') {
    unsigned long long d = 0;
    if (!parse_uint(value, &d) || !is_power_of_two(d)) bad(key, value, allowed);
    c.roundup_power2_divisions.fill(static_cast<std::size_t>(d));
    return;
  }
  if (value.back() != ']') bad(key, value, allowed);
  std::array<std::size_t, kRoundupIntervals> divisions{};
  std::string body = value.substr(1, value.size() - 2);
  std::size_t last_index = 0;
  bool first = true;
  std::stringstream ss(body);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    auto colon = item.find(':');
    if (colon == std::string::npos) bad(key, value, allowed);
    std::string limit = trim(item.substr(0, colon));
    unsigned long long d = 0;
    if (!parse_uint(trim(item.substr(colon + 1)), &d) || (d != 0 && !is_power_of_two(d)))
      bad(key, value, allowed);
    if (limit == ">") {
      for (std::size_t i = last_index + 1; i < kRoundupIntervals; ++i) divisions[i] = d;
      continue;
    }
    unsigned long long mb = 0;
    if (!parse_uint(limit, &mb) || !is_power_of_two(mb)) bad(key, value, allowed);
    std::size_t index = static_cast<std::size_t>(63 - __builtin_clzll(mb));
    if (index >= kRoundupIntervals) index = kRoundupIntervals - 1;
    if (first) {
      for (std::size_t i = 0; i < index; ++i) divisions[i] = d;
      first = false;
    }
    divisions[index] = d;
    last_index = index;
  }
  c.roundup_power2_divisions = divisions;
}

void apply_entry(Config& c, const std::string& key, const std::string& value) {
  if (key == "backend") {
    if (value == "native" || value == "cudaMallocAsync") {
      c.backend = value;
    } else {
      bad(key, value,
          "native (Reservoir's caching engine) or cudaMallocAsync (the driver's stream-ordered "
          "pool, with Reservoir's statistics on top)");
    }
  } else if (key == "policy") {
    if (value == "pytorch")
      c.policy = Config::Policy::pytorch;
    else if (value == "compact")
      c.policy = Config::Policy::compact;
    else
      bad(key, value,
          "pytorch (the default: PyTorch's allocator, byte for byte) or compact (the "
          "least reserved memory)");
  } else if (key == "max_split_size_mb") {
    unsigned long long mb = 0;
    if (!parse_uint(value, &mb) || mb <= kLargeBufferMiB)
      bad(key, value, "an integer number of MiB greater than 20");
    c.max_split_size =
        mb > (~std::size_t{0} >> 20) ? ~std::size_t{0} : static_cast<std::size_t>(mb) << 20;
  } else if (key == "max_non_split_rounding_mb") {
    unsigned long long mb = 0;
    if (!parse_uint(value, &mb) || mb > (1ull << 40))
      bad(key, value, "a non-negative integer number of MiB");
    c.max_non_split_rounding_size = static_cast<std::size_t>(mb) << 20;
  } else if (key == "roundup_power2_divisions") {
    parse_roundup(c, key, value);
  } else if (key == "garbage_collection_threshold") {
    double t = 0;
    if (!parse_double(value, &t) || !(t > 0.0 && t < 1.0))
      bad(key, value, "a number strictly between 0.0 and 1.0");
    c.garbage_collection_threshold = t;
  } else if (key == "expandable_segments") {
    if (!parse_bool(value, &c.expandable_segments)) bad(key, value, "True or False");
  } else if (key == "expandable_segments_reserve") {
    double f = 0;
    std::size_t bytes = 0;
    if (value.find('.') != std::string::npos && parse_double(value, &f) && f > 0 && f <= 4) {
      c.expandable_segments_reserve_fraction = f;
      c.expandable_segments_reserve = 0;
    } else if (parse_bytes(value, &bytes) && bytes > 0) {
      c.expandable_segments_reserve = bytes;
      c.expandable_segments_reserve_fraction = 0;
    } else {
      bad(key, value,
          "a size in bytes (e.g. 64GiB, 2147483648) or a fraction of device memory with a "
          "decimal point (e.g. 0.5)");
    }
  } else if (key == "release_lock_on_cudamalloc") {
    if (!parse_bool(value, &c.release_lock_on_cudamalloc)) bad(key, value, "True or False");
  } else if (key == "graph_capture_record_stream_reuse") {
    if (!parse_bool(value, &c.graph_capture_record_stream_reuse)) bad(key, value, "True or False");
  } else if (key == "per_process_memory_fraction") {
    double f = 0;
    if (!parse_double(value, &f) || f < 0.0 || f > 1.0)
      bad(key, value, "a number between 0.0 and 1.0");
    c.per_process_memory_fraction = f;
    c.per_process_memory_fraction_set = true;
  } else if (key == "pinned_use_cuda_host_register" || key == "pinned_num_register_threads" ||
             key == "pinned_use_background_threads" || key == "pinned_reserve_segment_size_mb") {
    // PyTorch's pinned host allocator keys: accepted so that a shared
    // PYTORCH_CUDA_ALLOC_CONF keeps working; they do not concern device memory.
  } else if (key == "device") {
    if (value != "auto" && value != "cuda" && value != "sim") bad(key, value, "auto, cuda or sim");
    c.device = value;
  } else if (key == "sim_capacity") {
    std::size_t bytes = 0;
    if (!parse_bytes(value, &bytes) || bytes == 0)
      bad(key, value, "a size in bytes, e.g. 80GiB or 1073741824");
    c.sim_capacity = bytes;
  } else if (key == "sim_completion") {
    if (value != "host_waits" && value != "eager" && value != "paced" && value != "manual")
      bad(key, value, "host_waits, eager, paced or manual");
    c.sim_completion = value;
  } else if (key == "sim_pace") {
    unsigned long long n = 0;
    if (!parse_uint(value, &n) || n == 0 || n > 1000000)
      bad(key, value, "a number of event queries from 1 to 1000000");
    c.sim_pace = static_cast<std::uint32_t>(n);
  } else if (key == "record_trace") {
    c.record_trace = value;
  } else if (key == "oom_snapshot") {
    c.oom_snapshot = value;
  } else {
    throw ConfigError(
        "reservoir config: unknown key '" + key +
        "'; known keys: backend, policy, max_split_size_mb, max_non_split_rounding_mb, "
        "roundup_power2_divisions, garbage_collection_threshold, expandable_segments, "
        "expandable_segments_reserve, release_lock_on_cudamalloc, "
        "graph_capture_record_stream_reuse, per_process_memory_fraction, "
        "device, sim_capacity, sim_completion, sim_pace, record_trace, oom_snapshot (see "
        "docs/config.md)");
  }
}

// Calls f(key, value) for each non-empty entry of "key:value,...", both trimmed.
template <typename F>
void for_each_entry(std::string_view text, F&& f) {
  for (const std::string& raw : split_entries(text)) {
    std::string entry = trim(raw);
    if (entry.empty()) continue;
    auto colon = entry.find(':');
    if (colon == std::string::npos)
      throw ConfigError("reservoir config: entry '" + entry +
                        "' is not of the form key:value (entries are separated by commas)");
    f(trim(entry.substr(0, colon)), trim(entry.substr(colon + 1)));
  }
}

}  // namespace

Config Config::parse(std::string_view text) {
  Config c;
  c.apply(text);
  return c;
}

Config Config::from_environment() {
  // An empty variable counts as unset: RESERVOIR_ALLOC_CONF= (a shell default, a
  // cleared setting) must not hide PYTORCH_CUDA_ALLOC_CONF.
  auto read = [](const char* variable) -> const char* {
    const char* value = std::getenv(variable);
    return value != nullptr && !trim(value).empty() ? value : nullptr;
  };
  const char* text = read("RESERVOIR_ALLOC_CONF");
  const char* name = "RESERVOIR_ALLOC_CONF";
  if (text == nullptr) {
    text = read("PYTORCH_CUDA_ALLOC_CONF");
    name = "PYTORCH_CUDA_ALLOC_CONF";
  }
  if (text == nullptr) return Config{};
  try {
    return parse(text);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (from " + name + ")");
  }
}

std::vector<std::string> Config::keys_of(std::string_view text) {
  std::vector<std::string> keys;
  for_each_entry(text, [&](const std::string& key, const std::string&) { keys.push_back(key); });
  return keys;
}

void Config::apply(std::string_view text) {
  Config next = *this;
  for_each_entry(text, [&](const std::string& key, const std::string& value) {
    apply_entry(next, key, value);
  });
  next.check();
  *this = std::move(next);
}

void Config::apply_settings(std::string_view text) {
  Config next = *this;
  const Config defaults;
  next.max_split_size = defaults.max_split_size;
  next.roundup_power2_divisions = defaults.roundup_power2_divisions;
  next.garbage_collection_threshold = defaults.garbage_collection_threshold;
  next.apply(text);  // throws ConfigError, leaving *this unchanged
  *this = std::move(next);
}

void Config::check() const {
  if (policy != Policy::compact) return;
  if (expandable_segments)
    throw ConfigError(
        "reservoir config: policy:compact and expandable_segments:True cannot be used "
        "together: policy:compact maps its own 2 MiB pages, so expandable segments would not "
        "apply; use one of them (to switch, set policy:compact,expandable_segments:False or "
        "policy:pytorch,expandable_segments:True in one update)");
  if (backend != "native")
    throw ConfigError("reservoir config: policy:compact and backend:" + backend +
                      " cannot be used together: under backend:" + backend +
                      " the driver's pool places memory, so no caching policy applies; use "
                      "backend:native with policy:compact, or drop policy:compact");
}

std::size_t Config::divisions_for(std::size_t size) const noexcept {
  // Interval index: floor(log2(size)) - 20, clamped to [0, 15].
  int log2 = 63 - __builtin_clzll(static_cast<unsigned long long>(size | 1));
  int index = log2 > 20 ? log2 - 20 : 0;
  if (index >= static_cast<int>(kRoundupIntervals)) index = kRoundupIntervals - 1;
  return roundup_power2_divisions[static_cast<std::size_t>(index)];
}

std::string Config::to_string() const {
  const Config defaults;
  std::string out;
  auto add = [&out](const char* key, const std::string& value) {
    if (!out.empty()) out += ',';
    out += key;
    out += ':';
    out += value;
  };
  if (policy != defaults.policy) add("policy", "compact");
  if (backend != defaults.backend) add("backend", backend);
  if (max_split_size != defaults.max_split_size)
    add("max_split_size_mb", std::to_string(max_split_size >> 20));
  if (max_non_split_rounding_size != defaults.max_non_split_rounding_size)
    add("max_non_split_rounding_mb", std::to_string(max_non_split_rounding_size >> 20));
  if (roundup_power2_divisions != defaults.roundup_power2_divisions)
    add("roundup_power2_divisions", roundup_text(roundup_power2_divisions));
  if (garbage_collection_threshold != defaults.garbage_collection_threshold)
    add("garbage_collection_threshold", decimal_text(garbage_collection_threshold));
  if (expandable_segments) add("expandable_segments", "True");
  if (expandable_segments_reserve != 0)
    add("expandable_segments_reserve", bytes_text(expandable_segments_reserve));
  else if (expandable_segments_reserve_fraction != 0)
    add("expandable_segments_reserve", decimal_text(expandable_segments_reserve_fraction));
  if (release_lock_on_cudamalloc) add("release_lock_on_cudamalloc", "True");
  if (graph_capture_record_stream_reuse) add("graph_capture_record_stream_reuse", "True");
  // Named even at 1.0: only a setting that names the key replaces a fraction set at
  // run time (per_process_memory_fraction_set).
  if (per_process_memory_fraction_set ||
      per_process_memory_fraction != defaults.per_process_memory_fraction)
    add("per_process_memory_fraction", decimal_text(per_process_memory_fraction));
  if (device != defaults.device) add("device", device);
  if (sim_capacity != 0) add("sim_capacity", bytes_text(sim_capacity));
  if (!record_trace.empty()) add("record_trace", record_trace);
  if (!oom_snapshot.empty()) add("oom_snapshot", oom_snapshot);
  return out;
}

}  // namespace reservoir
