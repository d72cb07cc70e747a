// The out-of-memory report's opening, shared by every engine (the caching ladder,
// backend:cudaMallocAsync, uncached mode): PyTorch's first sentences, word for word
// (tools and tests match them), then the processes using the device as PyTorch lists
// them (its reportProcessMemoryInfo), then the allowance and PyTorch's sentence on
// allocated and reserved memory:
//
//   CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of
//   139.81 GiB of which 1.50 GiB is free. Process 4242 has 80.00 GiB memory in use.
//   Including non-PyTorch memory, this process has 58.00 GiB memory in use. 40.00 GiB
//   allowed; Of the allocated memory 38.00 GiB is allocated by Reservoir, and
//   2.00 GiB is reserved by Reservoir but unallocated.
//
// Without the process list (no NVML) the process sentences are one sentence saying
// the list is unavailable and why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "reservoir/backend.hpp"

namespace reservoir::detail {

struct OomOpening {
  int device = 0;
  std::size_t alloc_size = 0;  // what the device was asked for
  bool have_info = false;
  MemoryInfo info;
  bool limited = false;  // a memory fraction is set
  std::size_t allowed = 0;
  std::uint64_t allocated = 0, reserved = 0;
};

// "Process 1234 has 1.00 GiB memory in use. Including non-PyTorch memory, this
// process has ... memory in use. " (each followed by one space), or the sentence that
// the list is unavailable. Asks the backend (process_memory) each time.
std::string process_memory_sentences(Backend& backend, int device);

// The processes, one line each, for memory summaries: "  process 1234: 1.00 GiB
// (this process)"; or one line saying why the list is unavailable.
std::vector<std::string> process_memory_lines(Backend& backend, int device);

// The opening described above, ending with a space.
std::string oom_opening(Backend& backend, const OomOpening& o);

}  // namespace reservoir::detail
