// Sleep and wake of tagged memory: the vocabulary of Allocator's tag API
// (docs/sleep.md).
//
// Requests made while a TagScope is open on a thread carry its tag; a CUDA graph's or
// MemPool's private pool made while one is open carries it too. sleep(tag) gives the
// device memory under the tag's blocks back to the device (offload: their contents are
// kept in pinned host memory first), keeping every address reserved, so pointers,
// tensors and captured CUDA graphs stay valid; wake(tag) maps fresh memory at the same
// addresses and copies offloaded contents back.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace reservoir {

enum class SleepMode {
  offload,  // contents copied to pinned host memory, restored by wake
  discard,  // contents undefined after wake (caches, activations)
};

// A tag's memory on one device.
struct TagState {
  std::string name;
  bool asleep = false;
  SleepMode mode = SleepMode::offload;  // while asleep
  std::size_t allocated_bytes = 0;      // blocks the program holds (asleep or not)
  std::size_t reserved_bytes = 0;       // device memory mapped under the tag now
  std::size_t asleep_bytes = 0;         // device memory given back by sleep, mapped again by wake
  std::size_t offloaded_bytes = 0;      // host copies kept for wake (offload)
  std::size_t pools = 0;                // private pools carrying the tag (its own included)
};

// Why name cannot be a tag ("" when it can): a tag is 1-63 characters of letters,
// digits, '_', '-', '.' and ':'.
std::string tag_name_problem(std::string_view name);

}  // namespace reservoir
