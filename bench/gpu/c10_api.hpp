// PyTorch's native CUDA caching allocator (c10), for side-by-side numbers. Built only
// when TORCH_DIR is given (RESERVOIR_BENCH_WITH_C10); kept out of gpu_bench.cpp so the
// torch headers touch one file.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace reservoir_bench::c10_api {

void init();  // c10::cuda::CUDACachingAllocator::init(device count)
void* alloc(std::size_t size, cudaStream_t stream);
void free(void* ptr, cudaStream_t stream);
// Returns every cached block to the device and resets the peak statistics.
void reset();
std::uint64_t peak_reserved();

}  // namespace reservoir_bench::c10_api
