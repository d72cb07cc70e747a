// SimPlacement: every parameter of the simulated device's placement model — where the
// CUDA driver puts the memory of cuMemAlloc and cuMemAddressReserve. Best fit breaks
// ties between equal blocks by address, so where segments land changes what the
// allocator reuses, splits and finally reserves; the simulated device places them as
// the driver does. The defaults are an H200 under driver 580 (CUDA 13), measured by
// the placement probe (docs/gpu-truth.md, bench/gpu/placement/recorded/); the same
// page tells how to recalibrate them from a probe run on another GPU.
//
// The model, in the driver's terms (sizes below are the defaults):
//   - The device's address window is carved into chunks: address ranges of a multiple
//     of `chunk` bytes (32 MiB), aligned to `chunk`. An allocation that fits in no
//     chunk gets a new chunk of round_up(size, chunk) bytes, placed at the top of the
//     highest free range that is strictly larger than the chunk (top-down; an exactly
//     fitting free range is passed over). The allocation sits at the chunk's start;
//     the rest of the chunk is free for later allocations.
//   - An allocation first tries the chunks, newest first (the order they were made),
//     taking in the first chunk with room the smallest hole that fits (ties: the lower
//     address), at the hole's start. Inside chunks, sizes of at least `page` (2 MiB)
//     are rounded up to and aligned on `page`; smaller ones on `small_alignment`.
//   - A chunk whose last allocation is freed goes back to the free ranges (merged with
//     its free neighbours); a chunk with anything live keeps all of its range.
//   - A reservation (cuMemAddressReserve) takes a chunk of round_up(size, chunk) bytes
//     from the bottom of the window (bottom-up, at the requested alignment); the tail of
//     its chunk beyond the reservation serves allocations like any chunk's free room.
//   - The context holds the top `context_bytes` of the window from the start, with
//     free holes in it (context_holes), tried after every chunk the program made; the
//     context's chunks are never given back.
#pragma once

#include <cstddef>
#include <vector>

namespace reservoir {

// A free hole in the context's part of the window: [top - below_top, top - below_top
// + size), top being the window's end.
struct SimContextHole {
  std::size_t below_top = 0;
  std::size_t size = 0;
};

struct SimPlacement {
  // Granule and alignment of the driver's address chunks.
  std::size_t chunk = std::size_t{32} << 20;
  // Allocations of at least this size are rounded up to it and aligned on it.
  std::size_t page = std::size_t{2} << 20;
  // Smaller allocations are rounded up to and aligned on this (not measured: the
  // engine never asks for less than 2 MiB).
  std::size_t small_alignment = 512;
  // The top of the window that the CUDA context holds from the start.
  std::size_t context_bytes = std::size_t{512} << 20;
  // Its free holes, in the order they are tried (after every chunk the program made):
  // on the H200, a 2 MiB hole 98 MiB below the top, then the upper 24 MiB of the
  // topmost chunk (its lower 8 MiB are the context's).
  std::vector<SimContextHole> context_holes = {{std::size_t{98} << 20, std::size_t{2} << 20},
                                               {std::size_t{24} << 20, std::size_t{24} << 20}};
};

}  // namespace reservoir
