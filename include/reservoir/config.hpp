// Allocator settings, in PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax:
//   "key:value,key:value"  e.g. "max_split_size_mb:256,expandable_segments:True"
// Read from RESERVOIR_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF. An unknown key or a
// bad value throws ConfigError naming the key and what is allowed. docs/config.md
// lists every key.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "reservoir/export.hpp"

namespace reservoir {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
// roundup_power2_divisions has one entry per power-of-two interval of sizes,
// [1 MiB, 2 MiB), [2 MiB, 4 MiB), ... (below 1 MiB uses the first, 32 GiB+ the last).
inline constexpr std::size_t kRoundupIntervals = 16;

struct RESERVOIR_API Config {
  // The engine behind the API: "native" (Reservoir's caching engine) or
  // "cudaMallocAsync" (the driver's stream-ordered memory pool, as PyTorch's
  // backend:cudaMallocAsync, with Reservoir's statistics, history and OOM report on
  // top; docs/async.md). Chosen when the allocator is made.
  std::string backend = "native";
  // How memory is cached (policy): "pytorch" reproduces PyTorch's native allocator to
  // the byte (per-stream caches, segments of its sizes); "compact" aims at the least
  // reserved memory (one device-wide cache over 2 MiB pages mapped where blocks live,
  // reused across streams with device-side waits). docs/config.md, docs/memory.md.
  enum class Policy { pytorch, compact };
  Policy policy = Policy::pytorch;
  // Blocks of at least this size are never split (max_split_size_mb).
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  // An oversize cached block serves a request at most this much smaller
  // (max_non_split_rounding_mb; default 20 MiB).
  std::size_t max_non_split_rounding_size = 20 * kMiB;
  // Divisions per power-of-two interval; 0 or 1 = plain 512-byte rounding.
  std::array<std::size_t, kRoundupIntervals> roundup_power2_divisions{};
  // Age-based release of cached blocks once reserved exceeds this fraction of the
  // memory fraction's allowance (0 = off; needs a memory fraction).
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  // Address space reserved per expandable segment: bytes (0 = device memory plus 1/8).
  std::size_t expandable_segments_reserve = 0;
  // Fraction of device memory when > 0 and expandable_segments_reserve is 0.
  double expandable_segments_reserve_fraction = 0.0;
  bool release_lock_on_cudamalloc = false;
  // A block freed during a CUDA graph capture while other captured streams use it
  // (record_stream) is reused in the same capture once the capture orders the block's
  // stream after those uses (graph_capture_record_stream_reuse), not only after the
  // capture ends.
  bool graph_capture_record_stream_reuse = false;
  // Applied to every device at creation (1.0 = no limit unless set later).
  double per_process_memory_fraction = 1.0;
  bool per_process_memory_fraction_set = false;
  // Which device backend the default allocator uses: "auto" (CUDA if a device is
  // present, else the simulated device), "cuda" or "sim".
  std::string device = "auto";
  // Capacity of the simulated device when device is sim (0 = SimBackend default).
  std::size_t sim_capacity = 0;
  // When the simulated device's work completes: "host_waits" (at the program's host
  // waits, notify_host_wait), "eager", "paced" (also at an event's sim_pace-th query) or
  // "manual" (SimCompletion, docs/simulated_device.md).
  std::string sim_completion = "host_waits";
  std::uint32_t sim_pace = 4;
  // Write a trace (docs/trace_format.md) of every request to this path ("" = off).
  std::string record_trace;
  // Write a snapshot at the moment of an OutOfMemoryError ("" = off).
  std::string oom_snapshot;

  // Parses a whole configuration onto the defaults. Throws ConfigError.
  static Config parse(std::string_view text);
  // RESERVOIR_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF, else defaults; a variable that
  // is empty (or only blanks) counts as unset. Throws ConfigError.
  static Config from_environment();
  // Applies "key:value,..." on top of this configuration. Throws ConfigError (and
  // then leaves *this unchanged), also when the result has settings that cannot
  // apply together (check()).
  void apply(std::string_view text);
  // As PyTorch's torch.cuda.memory._set_allocator_settings: max_split_size_mb,
  // roundup_power2_divisions and garbage_collection_threshold go back to their
  // defaults unless text names them; every other setting keeps its value. Throws
  // ConfigError (and then leaves *this unchanged).
  void apply_settings(std::string_view text);
  // Throws ConfigError naming both settings when two cannot apply together
  // (policy:compact with expandable_segments:True or backend:cudaMallocAsync).
  void check() const;
  // The keys that text names, in order, values unchecked (for tools that accept
  // only some keys). Throws ConfigError for an entry that is not key:value.
  static std::vector<std::string> keys_of(std::string_view text);
  // Divisions for a rounded request of size bytes.
  std::size_t divisions_for(std::size_t size) const noexcept;
  // The settings that differ from the defaults, each once, as "key:value,..." in the
  // order of docs/config.md's table ("" for all defaults). parse(to_string()) gives
  // back this configuration.
  std::string to_string() const;

  bool operator==(const Config&) const = default;
};

}  // namespace reservoir
