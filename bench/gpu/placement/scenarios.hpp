// The placement probe's built-in scenarios: sequences of the segment sizes Reservoir's
// engine asks the device for (2 MiB small segments, 20 MiB large segments, 2 MiB-rounded
// large sizes from 12 MiB up to a few GiB), to learn where the CUDA driver places them.
//
//   a  small_2MiB           N x 2 MiB
//   b  large_20MiB          N x 20 MiB
//   c  mixed_large          rounded large sizes, fixed list then seeded log-uniform
//   d  holes_<S>_<pattern>  N x S, free a pattern (first, last, every other, a middle
//                           run), then sizes smaller / equal / larger than the holes
//   e  vmm_*                d-like sequences with address reservations (device total
//                           * 9/8, as expandable segments reserve) first or in between
//
// Every list is deterministic (fixed seeds, no std:: distributions, whose output differs
// between standard libraries). The probe frees what is still live at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "op_list.hpp"

namespace reservoir_bench::placement {

// device_total: the device's memory (memory_info total), for the reservation size and to
// keep every scenario's live bytes under a quarter of it; granularity: the VMM mapping
// granularity (reservations are rounded up to it).
std::vector<OpList> builtin_scenarios(std::uint64_t device_total, std::uint64_t granularity);

// The reservation an expandable segment makes on a device of device_total bytes:
// total + total / 8, rounded up to granularity.
std::uint64_t expandable_reservation(std::uint64_t device_total, std::uint64_t granularity);

}  // namespace reservoir_bench::placement
