// DriverPlacement: the simulated device's address placement, as the CUDA driver does it
// (the model and its parameters: include/reservoir/sim_placement.hpp). Internal to
// SimBackend, which calls it under its mutex; it does no capacity accounting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

#include "reservoir/sim_placement.hpp"

namespace reservoir::sim {

// The problem with params ("" when they make a model), for SimOptions' validation.
std::string placement_problem(const SimPlacement& params);

// One device's window [lo, hi), carved into chunks.
//
// Invariants:
//   - free_ holds disjoint, non-touching ranges below the context's part of the
//     window; chunks never overlap one another nor a free range, and free_ plus the
//     chunks the program made cover [lo, hi - context_bytes) exactly;
//   - every chunk is [base, base + size) with size a multiple of params.chunk (context
//     chunks excepted); its holes are disjoint, non-touching, inside it, and with its
//     live allocations they tile it; largest == the longest hole (0 when none);
//   - live_[p] names the chunk holding the allocation at p and its footprint; a chunk
//     that is not a context chunk has at least one live allocation or reservation.
class DriverPlacement {
 public:
  DriverPlacement() = default;
  // params must be valid (placement_problem(params) == ""), and the window, shrunk to
  // whole chunks, longer than params.context_bytes.
  DriverPlacement(std::uintptr_t lo, std::uintptr_t hi, const SimPlacement& params);

  // Places an allocation of size bytes (> 0); its start, or 0 when no room is left.
  std::uintptr_t allocate(std::size_t size);
  // Places a reservation of size bytes at a multiple of alignment (a power of two);
  // its start, or 0 when no room is left.
  std::uintptr_t reserve(std::size_t size, std::size_t alignment);
  // Gives back what allocate or reserve placed at start; false if nothing is there.
  bool release(std::uintptr_t start);

  std::size_t chunks() const { return chunks_.size(); }
  std::size_t free_ranges() const { return free_.size(); }

 private:
  struct Chunk {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    bool context = false;                         // held from the start, never given back
    std::map<std::uintptr_t, std::size_t> holes;  // start -> length
    std::size_t largest = 0;
    std::size_t live = 0;
  };
  struct Live {
    std::uint64_t chunk = 0;  // key in chunks_
    std::size_t footprint = 0;
  };
  // Newest first: chunks_ is keyed by creation number, in descending order.
  using Chunks = std::map<std::uint64_t, Chunk, std::greater<>>;

  // The chunk's smallest hole holding footprint bytes at alignment (ties: the lower
  // address); the aligned start, or 0.
  static std::uintptr_t best_fit(const Chunk& c, std::size_t footprint, std::size_t alignment);
  // Takes [p, p + footprint) out of the chunk's hole that contains it.
  static void take(Chunk& c, std::uintptr_t p, std::size_t footprint);
  static void give(Chunk& c, std::uintptr_t p, std::size_t footprint);
  static void update_largest(Chunk& c);
  // A new chunk of size bytes at the top (top_down) or the bottom of the free ranges;
  // returns its key, or nullopt-like 0 when none fits.
  std::uint64_t new_chunk(std::size_t size, std::size_t alignment, bool top_down);
  void free_range(std::uintptr_t start, std::uintptr_t end);
  std::uintptr_t place(std::uint64_t key, std::uintptr_t p, std::size_t footprint);

  SimPlacement params_;
  std::map<std::uintptr_t, std::uintptr_t> free_;  // start -> end
  Chunks chunks_;
  std::unordered_map<std::uintptr_t, Live> live_;
  std::uint64_t next_key_ = 1;
};

}  // namespace reservoir::sim
