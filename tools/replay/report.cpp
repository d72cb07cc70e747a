// Table and JSON writers. JSON is written by hand: the tool has no dependency
// beyond the library and zlib.
#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string_view>

#include "explain.hpp"

namespace reservoir::replay {

namespace {

// Doubles as JSON numbers: finite only (JSON has no NaN or infinity).
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return printf_string("%.6g", v);
}

std::string bytes_cell(std::uint64_t b) {
  return with_commas(b) + " (" + human_bytes(b) + ")";
}

std::string duration_us(double us) {
  if (us >= 1e6) return printf_string("%.2f s", us / 1e6);
  if (us >= 1e3) return printf_string("%.2f ms", us / 1e3);
  if (us < 10) return printf_string("%.2f us", us);
  return printf_string("%.0f us", us);
}

struct Row {
  std::string name;
  std::vector<std::string> cells;
};

}  // namespace

std::string printf_string(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string config_label(const std::string& config) {
  return config.empty() ? "default" : config;
}

std::string with_commas(std::uint64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  const std::size_t n = digits.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string human_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  return printf_string("%.2f", v) + " " + kUnits[unit];
}

std::string format_table(const Trace& trace, std::uint64_t capacity,
                         const std::vector<ReplayResult>& results, bool with_fit,
                         const std::string& device) {
  std::vector<Row> rows;
  auto add = [&](std::string name, auto cell) {
    Row r{std::move(name), {}};
    for (const ReplayResult& res : results) r.cells.push_back(cell(res));
    rows.push_back(std::move(r));
  };
  add("config", [](const ReplayResult& r) { return config_label(r.config); });
  add("events", [](const ReplayResult& r) { return with_commas(r.events); });
  add("peak requested", [](const ReplayResult& r) { return bytes_cell(r.peak_requested); });
  add("peak allocated", [](const ReplayResult& r) { return bytes_cell(r.peak_allocated); });
  add("peak reserved", [](const ReplayResult& r) { return bytes_cell(r.peak_reserved); });
  add("reserved/requested", [](const ReplayResult& r) { return printf_string("%.4f", r.ratio); });
  add("device allocs", [](const ReplayResult& r) { return with_commas(r.device_allocs); });
  add("device frees", [](const ReplayResult& r) { return with_commas(r.device_frees); });
  add("device time (sim)", [](const ReplayResult& r) { return duration_us(r.device_time_us); });
  add("OOMs", [](const ReplayResult& r) { return with_commas(r.ooms); });
  add("host ns/event", [](const ReplayResult& r) { return printf_string("%.1f", r.ns_per_event); });
  // Device calls (--calls): one row per kind any setting made, "count x time each".
  for (std::size_t k = 0; k < static_cast<std::size_t>(CallKind::count_); ++k) {
    const auto kind = static_cast<CallKind>(k);
    auto find = [kind](const ReplayResult& r) -> const CallCount* {
      for (const CallCount& c : r.calls)
        if (c.kind == kind) return &c;
      return nullptr;
    };
    if (std::none_of(results.begin(), results.end(), find)) continue;
    add(std::string("calls: ") + to_string(kind), [&find](const ReplayResult& r) {
      const CallCount* c = find(r);
      if (!c) return std::string("0");
      return with_commas(c->count) + " x " +
             duration_us(static_cast<double>(c->ns) / 1e3 / static_cast<double>(c->count));
    });
  }
  // Private pools (traces with pools): each pool's rows, or their sums past a few.
  const std::size_t pools = results.empty() ? 0 : results.front().pools.size();
  constexpr std::size_t kPoolRows = 8;
  auto pool_sum = [](const ReplayResult& r, std::uint64_t PoolFigures::*field) {
    std::uint64_t sum = 0;
    for (const PoolFigures& f : r.pools) sum += f.*field;
    return sum;
  };
  if (pools > kPoolRows) {
    add("pools: peak reserved (sum)", [&](const ReplayResult& r) {
      return bytes_cell(pool_sum(r, &PoolFigures::peak_reserved));
    });
    add("pools: reserved at end",
        [&](const ReplayResult& r) { return bytes_cell(pool_sum(r, &PoolFigures::end_reserved)); });
  } else {
    for (std::size_t k = 0; k < pools; ++k) {
      const std::string name = "pool " + std::to_string(results.front().pools[k].number);
      auto figure = [k](const ReplayResult& r, std::uint64_t PoolFigures::*field) {
        return k < r.pools.size() ? bytes_cell(r.pools[k].*field) : std::string("-");
      };
      add(name + ": peak live",
          [&](const ReplayResult& r) { return figure(r, &PoolFigures::peak_live); });
      add(name + ": peak reserved",
          [&](const ReplayResult& r) { return figure(r, &PoolFigures::peak_reserved); });
      add(name + ": reserved at end", [&](const ReplayResult& r) {
        if (k < r.pools.size() && r.pools[k].released && r.pools[k].end_reserved == 0)
          return std::string("released");
        return figure(r, &PoolFigures::end_reserved);
      });
    }
  }
  if (with_fit) {
    add("fit capacity", [](const ReplayResult& r) {
      return r.fit_capacity ? bytes_cell(*r.fit_capacity) : std::string("does not fit");
    });
    add("fit memory fraction", [](const ReplayResult& r) {
      return r.fit_capacity ? printf_string("%.6f", r.fit_fraction) : std::string("-");
    });
    add("fit / requested", [](const ReplayResult& r) {
      return r.fit_capacity ? printf_string("%.4f", r.fit_ratio) : std::string("-");
    });
  }

  std::size_t name_width = 0;
  std::vector<std::size_t> widths(results.size(), 0);
  for (const Row& r : rows) {
    name_width = std::max(name_width, r.name.size());
    for (std::size_t c = 0; c < r.cells.size(); ++c)
      widths[c] = std::max(widths[c], r.cells[c].size());
  }

  std::string out =
      "trace " + std::filesystem::path(trace.path).filename().string() + ": " +
      with_commas(trace.events.size()) + " events, " + with_commas(trace.allocations) +
      " allocations, " + std::to_string(trace.streams) +
      (trace.streams == 1 ? " stream" : " streams") +
      (trace.sleeps + trace.wakes > 0 ? ", " + with_commas(trace.sleeps) + " sleeps and " +
                                            with_commas(trace.wakes) + " wakes of tags"
                                      : std::string()) +
      (trace.pools > 0
           ? ", " + with_commas(trace.pools) +
                 (trace.pools == 1 ? " private pool (" : " private pools (") +
                 with_commas(trace.captures) + " captures, " + with_commas(trace.checkpoints) +
                 " checkpoints, " + with_commas(trace.restores) + " restores)"
           : std::string()) +
      (device.empty()
           ? "; simulated device " + human_bytes(capacity)
           : "; measured on " + device +
                 (with_fit ? ", fit on a simulated " + human_bytes(capacity) + " device" : "")) +
      "\n\n";
  for (const Row& r : rows) {
    std::string line = r.name + std::string(name_width - r.name.size() + 2, ' ');
    for (std::size_t c = 0; c < r.cells.size(); ++c) {
      // Right-aligned so digits line up under their config.
      const std::string& cell = r.cells[c];
      line += std::string(widths[c] - cell.size(), ' ') + cell;
      if (c + 1 < r.cells.size()) line += "   ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    if (&r == &rows.front()) out += std::string(line.size(), '-') + "\n";
  }
  std::string notes;
  for (const ReplayResult& r : results) {
    if (const std::string why = explain_ratio(r); !why.empty()) notes += why + "\n";
    if (r.first_oom)
      notes +=
          "first OOM under " + config_label(r.config) + ": " + describe_oom(*r.first_oom) + "\n";
  }
  for (const ReplayResult& r : results) {
    notes += format_captures(r);
    if (r.kv_cache) notes += describe_kv_cache(r);
  }
  if (trace.captures > 0 && !device.empty())
    notes +=
        "captures are modelled on the host: requests go to the pools the trace names, "
        "under the allocator's capture rules from each g line to its e line; the replay "
        "launches no kernel, so there is nothing to capture on " +
        device + "\n";
  if (!notes.empty()) out += "\n" + notes;
  return out;
}

std::string describe_kv_cache(const ReplayResult& r) {
  const KvCacheFit& k = *r.kv_cache;
  const std::string where =
      k.at_event == 0 ? "at the start of the trace"
                      : "before its first capture (event " + with_commas(k.at_event) + ")";
  const std::string head = "KV cache under " + config_label(r.config) + " on a " +
                           human_bytes(k.budget) + " device with the program: ";
  if (!k.fits) return head + "none fits (the program alone does not run there)\n";
  const std::uint64_t bytes = k.tokens * k.bytes_per_token;
  return head + "at most " + with_commas(k.tokens) + " tokens of " +
         human_bytes(k.bytes_per_token) + " (" + human_bytes(bytes) + ", " +
         std::to_string(k.layers) + (k.layers == 1 ? " allocation" : " equal allocations") +
         " made " + where + "; " + std::to_string(k.runs) + " replays)\n";
}

std::string format_captures(const ReplayResult& r) {
  if (r.captures.empty()) return "";
  constexpr std::size_t kShown = 32;
  std::vector<std::vector<std::string>> rows = {
      {"capture", "pool", "requests", "requested", "reserved growth", "graphs so far"}};
  for (std::size_t k = 0; k < r.captures.size() && k < kShown; ++k) {
    const CaptureFigures& c = r.captures[k];
    const auto signed_bytes = [](std::uint64_t after, std::uint64_t before) {
      return after >= before ? human_bytes(after - before) : "-" + human_bytes(before - after);
    };
    rows.push_back({std::to_string(k + 1), std::to_string(c.pool), with_commas(c.requests),
                    human_bytes(c.requested_bytes),
                    c.ended ? signed_bytes(c.reserved_after, c.reserved_before) : "(no end)",
                    c.ended ? human_bytes(c.pools_reserved_after) : "-"});
  }
  std::vector<std::size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  std::string out = "captures under " + config_label(r.config) +
                    " (reserved growth: reserved memory at the capture's end less at its "
                    "begin; graphs so far: what the private pools reserve then):\n";
  for (const auto& row : rows) {
    std::string line = " ";
    for (std::size_t c = 0; c < row.size(); ++c)
      line += " " + std::string(widths[c] - row[c].size(), ' ') + row[c];
    out += line + "\n";
  }
  if (r.captures.size() > kShown)
    out += "  ... " + with_commas(r.captures.size() - kShown) + " more (--json lists them all)\n";
  return out;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;  // UTF-8 passes through unchanged
        }
    }
  }
  return out + "\"";
}

std::string format_json(const std::vector<ReplayResult>& results, bool with_fit) {
  std::string out = "[";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const ReplayResult& r = results[i];
    out += i == 0 ? "\n  {" : ",\n  {";
    out += "\"config\": " + json_string(r.config);
    out += ", \"events\": " + std::to_string(r.events);
    out += ", \"peak_requested\": " + std::to_string(r.peak_requested);
    out += ", \"peak_allocated\": " + std::to_string(r.peak_allocated);
    out += ", \"peak_reserved\": " + std::to_string(r.peak_reserved);
    out += ", \"ratio\": " + json_number(r.ratio);
    out += ", \"device_allocs\": " + std::to_string(r.device_allocs);
    out += ", \"device_frees\": " + std::to_string(r.device_frees);
    out += ", \"device_time_us\": " + json_number(r.device_time_us);
    out += ", \"ooms\": " + std::to_string(r.ooms);
    out += ", \"ns_per_event\": " + json_number(r.ns_per_event);
    if (!r.calls.empty()) {
      out += ", \"calls\": {";
      for (std::size_t k = 0; k < r.calls.size(); ++k) {
        const CallCount& c = r.calls[k];
        out += (k == 0 ? "\"" : ", \"") + std::string(to_string(c.kind)) +
               "\": {\"count\": " + std::to_string(c.count) + ", \"ns\": " + std::to_string(c.ns) +
               "}";
      }
      out += "}";
    }
    if (!r.pools.empty()) {
      out += ", \"pools\": [";
      for (std::size_t k = 0; k < r.pools.size(); ++k) {
        const PoolFigures& f = r.pools[k];
        out += (k == 0 ? "{" : ", {") + std::string("\"pool\": ") + std::to_string(f.number) +
               ", \"requests\": " + std::to_string(f.requests) +
               ", \"peak_live\": " + std::to_string(f.peak_live) +
               ", \"peak_allocated\": " + std::to_string(f.peak_allocated) +
               ", \"peak_reserved\": " + std::to_string(f.peak_reserved) +
               ", \"end_allocated\": " + std::to_string(f.end_allocated) +
               ", \"end_reserved\": " + std::to_string(f.end_reserved) +
               ", \"released\": " + (f.released ? "true" : "false") + "}";
      }
      out += "]";
    }
    if (!r.captures.empty()) {
      out += ", \"captures\": [";
      for (std::size_t k = 0; k < r.captures.size(); ++k) {
        const CaptureFigures& c = r.captures[k];
        out += (k == 0 ? "{" : ", {") + std::string("\"pool\": ") + std::to_string(c.pool) +
               ", \"requests\": " + std::to_string(c.requests) +
               ", \"requested_bytes\": " + std::to_string(c.requested_bytes) +
               ", \"reserved_before\": " + std::to_string(c.reserved_before) +
               ", \"reserved_after\": " +
               (c.ended ? std::to_string(c.reserved_after) : std::string("null")) +
               ", \"pools_reserved_after\": " +
               (c.ended ? std::to_string(c.pools_reserved_after) : std::string("null")) + "}";
      }
      out += "]";
    }
    if (r.kv_cache) {
      const KvCacheFit& k = *r.kv_cache;
      out += ", \"kv_cache\": {\"bytes_per_token\": " + std::to_string(k.bytes_per_token) +
             ", \"budget\": " + std::to_string(k.budget) +
             ", \"layers\": " + std::to_string(k.layers) +
             ", \"at_event\": " + std::to_string(k.at_event) +
             ", \"tokens\": " + (k.fits ? std::to_string(k.tokens) : std::string("null")) +
             ", \"runs\": " + std::to_string(k.runs) + "}";
    }
    if (with_fit) {
      out += ", \"fit_capacity\": " +
             (r.fit_capacity ? std::to_string(*r.fit_capacity) : std::string("null"));
      out += ", \"fit_ratio\": " + (r.fit_capacity ? json_number(r.fit_ratio) : "null");
      out += ", \"fit_fraction\": " + (r.fit_capacity ? json_number(r.fit_fraction) : "null");
    }
    out += "}";
  }
  out += results.empty() ? "]\n" : "\n]\n";
  return out;
}

}  // namespace reservoir::replay
