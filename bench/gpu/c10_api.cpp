// The c10 calls, exactly as /work/shared/tools/anchor_bench.cpp and peer_replay.cpp
// make them.
#include "c10_api.hpp"

#include <c10/cuda/CUDACachingAllocator.h>

namespace reservoir_bench::c10_api {

namespace A = c10::cuda::CUDACachingAllocator;

void init() {
  int count = 0;
  cudaGetDeviceCount(&count);
  A::init(count > 0 ? count : 1);
}

void* alloc(std::size_t size, cudaStream_t stream) {
  return A::raw_alloc_with_stream(size, stream);
}

void free(void* ptr, cudaStream_t) {
  A::raw_delete(ptr);
}

void reset() {
  A::emptyCache();
  A::resetPeakStats(0);
}

std::uint64_t peak_reserved() {
  return static_cast<std::uint64_t>(A::getDeviceStats(0).reserved_bytes[0].peak);
}

}  // namespace reservoir_bench::c10_api
