// Pattern kernels for the GPU tests (see gpu_kernels.hpp).
#include <cstdint>

#include "gpu/gpu_kernels.hpp"

namespace reservoir::gpu_test {

namespace {

constexpr unsigned kThreads = 256;

// splitmix64 of (tag, word): cheap, and different for different tags.
__device__ inline std::uint64_t pattern_word(std::uint32_t tag, std::uint64_t word) {
  std::uint64_t x = (static_cast<std::uint64_t>(tag) << 40) ^ (word * 0x9E3779B97F4A7C15ull);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

__device__ inline unsigned char pattern_byte(std::uint32_t tag, std::uint64_t i) {
  return static_cast<unsigned char>(pattern_word(tag, i / 8) >> (8 * (i % 8)));
}

// The part of region r that the x-blocks of this grid row cover: whole words in a
// grid-stride loop, then the tail bytes (at most 7) by the first thread of the row.
__device__ void fill_region(const Region& r) {
  auto* words = static_cast<std::uint64_t*>(r.ptr);
  const std::uint64_t n_words = r.size / 8;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t w = blockIdx.x * blockDim.x + threadIdx.x; w < n_words; w += stride)
    words[w] = pattern_word(r.tag, w);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    auto* bytes = static_cast<unsigned char*>(r.ptr);
    for (std::uint64_t i = n_words * 8; i < r.size; ++i) bytes[i] = pattern_byte(r.tag, i);
  }
}

__device__ unsigned long long count_mismatches(const Region& r) {
  const auto* words = static_cast<const std::uint64_t*>(r.ptr);
  const std::uint64_t n_words = r.size / 8;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (std::uint64_t w = blockIdx.x * blockDim.x + threadIdx.x; w < n_words; w += stride) {
    std::uint64_t diff = words[w] ^ pattern_word(r.tag, w);
    for (; diff != 0; diff >>= 8) bad += (diff & 0xff) != 0;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const auto* bytes = static_cast<const unsigned char*>(r.ptr);
    for (std::uint64_t i = n_words * 8; i < r.size; ++i) bad += bytes[i] != pattern_byte(r.tag, i);
  }
  return bad;
}

__global__ void fill_regions_kernel(const Region* regions, int n) {
  if (static_cast<int>(blockIdx.y) < n) fill_region(regions[blockIdx.y]);
}

__global__ void verify_regions_kernel(const Region* regions, int n,
                                      unsigned long long* mismatches) {
  if (static_cast<int>(blockIdx.y) >= n) return;
  unsigned long long bad = count_mismatches(regions[blockIdx.y]);
  if (bad != 0) atomicAdd(&mismatches[blockIdx.y], bad);
}

__global__ void fill_kernel(Region r) {
  fill_region(r);
}

__global__ void verify_kernel(Region r, unsigned long long* mismatches) {
  unsigned long long bad = count_mismatches(r);
  if (bad != 0) atomicAdd(mismatches, bad);
}

__device__ inline std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_then_verify_kernel(Region r, std::uint64_t spin_ns, SpinResult* result) {
  if (threadIdx.x == 0) {
    const std::uint64_t start = global_timer_ns();
    while (global_timer_ns() - start < spin_ns) __nanosleep(1000);
  }
  __syncthreads();
  unsigned long long bad = count_mismatches(r);
  if (bad != 0) atomicAdd(&result->mismatches, bad);
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(&result->blocks_done, 1u);
}

unsigned blocks_for(std::size_t size) {
  std::size_t words = size / 8;
  std::size_t blocks = (words + kThreads - 1) / kThreads;
  if (blocks == 0) blocks = 1;
  return blocks > 1024 ? 1024u : static_cast<unsigned>(blocks);
}

}  // namespace

// 16 blocks per region row: enough to saturate the GPU with thousands of rows.
cudaError_t fill_regions(const Region* regions, int n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  fill_regions_kernel<<<dim3(16, static_cast<unsigned>(n)), kThreads, 0, stream>>>(regions, n);
  return cudaGetLastError();
}

cudaError_t verify_regions(const Region* regions, int n, unsigned long long* mismatches,
                           cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  verify_regions_kernel<<<dim3(16, static_cast<unsigned>(n)), kThreads, 0, stream>>>(regions, n,
                                                                                     mismatches);
  return cudaGetLastError();
}

cudaError_t fill(Region region, cudaStream_t stream) {
  fill_kernel<<<blocks_for(region.size), kThreads, 0, stream>>>(region);
  return cudaGetLastError();
}

cudaError_t verify(Region region, unsigned long long* mismatches, cudaStream_t stream) {
  verify_kernel<<<blocks_for(region.size), kThreads, 0, stream>>>(region, mismatches);
  return cudaGetLastError();
}

cudaError_t spin_then_verify(Region region, std::uint64_t spin_ns, SpinResult* result,
                             cudaStream_t stream) {
  spin_then_verify_kernel<<<kSpinBlocks, kThreads, 0, stream>>>(region, spin_ns, result);
  return cudaGetLastError();
}

}  // namespace reservoir::gpu_test

namespace reservoir::gpu_test {
namespace {
__global__ void wait_for_flag_kernel(volatile int* flag, std::uint64_t timeout_ns) {
  std::uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    if (*flag != 0) return;
    std::uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > timeout_ns) return;
    __nanosleep(1000);
  }
}
}  // namespace

cudaError_t wait_for_flag(volatile int* device_flag, std::uint64_t timeout_ns,
                          cudaStream_t stream) {
  wait_for_flag_kernel<<<1, 1, 0, stream>>>(device_flag, timeout_ns);
  return cudaGetLastError();
}
}  // namespace reservoir::gpu_test
