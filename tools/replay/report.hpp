// Text outputs of reservoir-replay: the side-by-side table and the JSON array.
// (The plots are in plot.hpp.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "replay.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {

// "" -> "default"; any other config string as given.
std::string config_label(const std::string& config);

// 14902362112 -> "14,902,362,112".
std::string with_commas(std::uint64_t value);

// v formatted by a printf format with one double conversion: ("%.4f", 1.1417).
std::string printf_string(const char* fmt, double v);

// Bytes in the largest binary unit that keeps the number >= 1: "13.88 GiB", "512 B".
std::string human_bytes(std::uint64_t bytes);

// One column per result, one row per figure, preceded by a line describing the
// trace and the simulated capacity, followed by a line for each setting whose ratio
// is extreme (explain_ratio) and each first OOM (describe_oom). with_fit adds the
// fit rows. device: the device the measured replays ran on ("" = the simulated one).
std::string format_table(const Trace& trace, std::uint64_t capacity,
                         const std::vector<ReplayResult>& results, bool with_fit,
                         const std::string& device = "");

// A JSON array, one object per result, with exactly the keys
//   config, events, peak_requested, peak_allocated, peak_reserved, ratio,
//   device_allocs, device_frees, device_time_us, ooms, ns_per_event
// and, with with_fit, fit_capacity, fit_ratio and fit_fraction (null if nothing fits);
// a trace with private pools adds "pools": [{"pool", "requests", "peak_live",
// "peak_allocated", "peak_reserved", "end_allocated", "end_reserved", "released"}, ...]
// and, with captures, "captures": [{"pool", "requests", "requested_bytes",
// "reserved_before", "reserved_after", "pools_reserved_after" (null: no end)}, ...];
// with --kv-cache, "kv_cache": {"bytes_per_token", "budget", "layers", "at_event",
// "tokens" (null: the program alone does not fit), "runs"};
// a replay run with ReplayOptions::profile_calls adds "calls": {KIND: {"count": N,
// "ns": host ns inside those calls}, ...} for each kind of device call it made.
std::string format_json(const std::vector<ReplayResult>& results, bool with_fit);

// The captures of r (trace v2's g to e lines), one row each: pool, requests, bytes
// requested, reserved growth during it, and what the private pools reserve at its end
// (the graphs' memory so far: the capture ladder); "" when it has none.
std::string format_captures(const ReplayResult& r);

// The line of r's KV cache answer (r.kv_cache set).
std::string describe_kv_cache(const ReplayResult& r);

// s as a JSON string literal, quotes included.
std::string json_string(const std::string& s);

}  // namespace reservoir::replay
