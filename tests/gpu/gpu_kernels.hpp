// Kernels the GPU tests use to touch allocator memory, behind plain host functions
// (so the tests themselves are ordinary C++ built with the project's warnings).
//
// Every byte i of a region with tag t holds byte (i % 8) of pattern_word(t, i / 8):
// regions with different tags hold different bytes almost everywhere, so an overlap
// between two live blocks shows up as mismatches in at least one of them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace reservoir::gpu_test {

struct Region {
  void* ptr = nullptr;  // 8-byte aligned
  std::size_t size = 0;
  std::uint32_t tag = 0;
};

// What spin_then_verify found.
struct SpinResult {
  unsigned long long mismatches;  // bytes that did not hold the pattern
  unsigned int blocks_done;       // blocks that finished (the "done" flag)
};

inline constexpr unsigned kSpinBlocks = 64;

// regions: a device array of n Regions (n <= 65535). Fills each with its pattern.
cudaError_t fill_regions(const Region* regions, int n, cudaStream_t stream);
// Adds each region's mismatching byte count to mismatches[i] (a device array of n).
cudaError_t verify_regions(const Region* regions, int n, unsigned long long* mismatches,
                           cudaStream_t stream);
// One region, passed by value.
cudaError_t fill(Region region, cudaStream_t stream);
// Adds the mismatching byte count to *mismatches (device memory).
cudaError_t verify(Region region, unsigned long long* mismatches, cudaStream_t stream);
// kSpinBlocks blocks each wait spin_ns nanoseconds (GPU global timer), then check the
// region's pattern, add mismatches to result->mismatches and count themselves in
// result->blocks_done. result is device memory, zeroed by the caller.
cudaError_t spin_then_verify(Region region, std::uint64_t spin_ns, SpinResult* result,
                             cudaStream_t stream);

}  // namespace reservoir::gpu_test

namespace reservoir::gpu_test {
// Work that does not finish until *host_flag (host-mapped memory, device pointer
// device_flag) becomes non-zero, or after timeout_ns (so a failing test cannot hang
// the GPU).
cudaError_t wait_for_flag(volatile int* device_flag, std::uint64_t timeout_ns, cudaStream_t stream);
}  // namespace reservoir::gpu_test
