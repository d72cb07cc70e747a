// PyTorch's native CUDA caching allocator (c10), for side-by-side numbers. Built only
// when TORCH_DIR is given (RESERVOIR_BENCH_WITH_C10); kept out of gpu_bench.cpp and
// c10_replay.cpp so the torch headers touch one file.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace reservoir_bench::c10_api {

void init();  // c10::cuda::CUDACachingAllocator::init(device count)
void* alloc(std::size_t size, cudaStream_t stream);
void free(void* ptr, cudaStream_t stream);
// Returns every cached block to the device and resets the peak statistics.
void reset();
std::uint64_t peak_reserved();

// ---- For the trace replayer (c10_replay.cpp), device 0 ----

// raw_alloc_with_stream; false when c10 raised OutOfMemoryError (*ptr untouched).
// A 0-byte request succeeds with *ptr == nullptr, as in c10.
bool try_alloc(std::size_t size, cudaStream_t stream, void** ptr);
// recordStream on ptr's block (a DataPtr carrying c10's own deleter, so c10 takes it
// for one of its blocks), as Tensor.record_stream(stream) does.
void record_stream(void* ptr, cudaStream_t stream);
// setMemoryFraction(fraction, 0): device allocations beyond fraction * total fail.
void set_memory_fraction(double fraction);
// reset() and resetAccumulatedStats: a cold cache with every counter at zero.
void reset_all();

// ---- Private pools, for traces with pool lines (device 0; a pool is MempoolId {0, id}) ----
void retain_pool(std::uint64_t id);   // createOrIncrefPool
void release_pool(std::uint64_t id);  // releasePool: a use dropped
// beginAllocateToPool: requests that filter accepts go to the pool (a use added).
void begin_route(std::uint64_t id, std::function<bool(cudaStream_t)> filter);
void end_route(std::uint64_t id);  // endAllocateToPool
// getCheckpointState, kept opaque.
std::shared_ptr<void> checkpoint(std::uint64_t id);
// setCheckpointPoolState: the blocks it freed and those it allocated (the caller owns
// them and frees them with free()).
void restore(const std::shared_ptr<void>& state, std::vector<void*>* freed,
             std::vector<void*>* allocated);

void empty_cache();  // emptyCache, peaks kept

struct Stats {
  std::uint64_t peak_reserved = 0, peak_requested = 0, peak_allocated = 0;
  std::int64_t num_device_alloc = 0, num_device_free = 0, num_ooms = 0, num_alloc_retries = 0;
};
Stats stats();  // getDeviceStats(0), aggregate pool

}  // namespace reservoir_bench::c10_api
