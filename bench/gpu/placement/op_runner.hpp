// Running an op list on a device and logging where each call landed: the placement
// probe's core, device-independent so it runs on SimBackend too (for comparison with
// the driver, and in tests).
#pragma once

#include <string>
#include <vector>

#include "logging_backend.hpp"
#include "op_list.hpp"

namespace reservoir_bench::placement {

struct OpRun {
  std::vector<PlacementCall> calls;  // every call made, including the clean-up at the end
  std::size_t end_of_sequence = 0;   // calls[0, end_of_sequence) are the list's own ops
};

// Runs list on device 0 of backend: alloc -> allocate, free -> deallocate,
// reserve -> reserve_address_range (size rounded up to the granularity, aligned to it).
// A failed alloc is logged and its later free skipped; the run goes on. Afterwards every
// live allocation is freed (in index order) and every reservation released.
OpRun run_ops(const OpList& list, Backend& backend);

// The log's body: the list's notes (as "# " lines), the calls, and a comment line where
// the clean-up begins.
std::string format_run(const OpList& list, const OpRun& run);

}  // namespace reservoir_bench::placement
