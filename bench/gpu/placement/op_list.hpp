// A placement op list: the device calls whose addresses the placement probe asks the
// CUDA driver for (bench/gpu/placement_probe.cpp), as a small text file.
//
//   # placement ops v1: alloc SIZE | free INDEX | reserve SIZE
//   # any comment
//   alloc 20971520        a segment of SIZE bytes (Backend::allocate, cuMemAlloc)
//   free 0                the INDEX-th alloc of the list (0-based) goes back
//   reserve 162135015424  an address range (reserve_address_range), kept to the end
//
// Lists come from two places: scenarios built in code (scenarios.hpp) and the device
// calls Reservoir's engine made while replaying a trace (engine_ops.hpp), written to
// bench/gpu/placement/ops/ by reservoir_placement_ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace reservoir_bench::placement {

inline constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
inline constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
inline constexpr const char* kOpsHeader =
    "# placement ops v1: alloc SIZE | free INDEX | reserve SIZE";

// A malformed op list; what() is "NAME:LINE: reason".
class OpError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class OpKind : std::uint8_t { alloc, free, reserve };

struct Op {
  OpKind kind = OpKind::alloc;
  std::uint64_t value = 0;  // alloc, reserve: bytes (> 0); free: index of the alloc
};

// Invariant: every free names an earlier alloc of the list that no earlier free named.
struct OpList {
  std::string name;                // the scenario's name, used for its output file
  std::vector<std::string> notes;  // comment lines (without "# "), kept in the file
  std::vector<Op> ops;

  std::size_t allocs() const;
  // Appends an alloc and returns its index (what free takes).
  std::size_t alloc(std::uint64_t bytes);
  void free(std::size_t index) { ops.push_back({OpKind::free, index}); }
  void reserve(std::uint64_t bytes) { ops.push_back({OpKind::reserve, bytes}); }
};

// Throws OpError when the invariant does not hold (or a size is 0).
void validate(const OpList& list);

// The file text: header, notes, one op per line.
std::string format_ops(const OpList& list);
// Parses format_ops's text; name becomes the list's name and prefixes messages.
OpList parse_ops(std::string_view text, const std::string& name);

// Reads a file, plain or gzip (zlib detects which). The list is named after the file
// (without directory and without .txt/.txt.gz). Throws OpError.
OpList read_ops(const std::string& path);
// Writes format_ops's text, gzip-compressed when path ends in ".gz". Throws OpError.
void write_ops(const std::string& path, const OpList& list);

// "gpt2_train_varlen.trace.gz" + "max_split_size_mb:128" ->
// "gpt2_train_varlen.max_split_size_mb_128": a file name for a trace and a setting
// ("" is "default"; characters other than [A-Za-z0-9._-] become '_').
std::string ops_name(const std::string& trace_path, const std::string& config);

}  // namespace reservoir_bench::placement
