// The c10 calls, exactly as /work/shared/tools/anchor_bench.cpp and peer_replay.cpp
// make them.
#include "c10_api.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <cstdio>

// Exported by libc10_cuda (C10_CUDA_API); libtorch_cuda's CUDA hooks register the
// real test through it, as CUDAHooks.cpp declares it.
namespace c10::cuda::_internal {
void setHasPrimaryContext(bool (*func)(c10::DeviceIndex));
}

namespace reservoir_bench::c10_api {

namespace A = c10::cuda::CUDACachingAllocator;

namespace {

// c10 asks "has this device a primary context?" through a hook that libtorch_cuda's
// static initializer registers (e.g. when a block used on other streams is freed:
// its events are recorded, then the device is restored with MaybeSetDevice). A
// program linking only libc10_cuda gets c10's stand-in, which throws "Should never
// been called". Loading libtorch_cuda registers the real one, as in a torch process.
void register_cuda_hooks() {
  if (dlopen(RESERVOIR_TORCH_CUDA_LIB, RTLD_NOW | RTLD_GLOBAL) != nullptr) return;
  std::fprintf(stderr,
               "reservoir_c10_replay: cannot load %s (%s); taking every device to have its "
               "primary context (device 0 does once anything is allocated)\n",
               RESERVOIR_TORCH_CUDA_LIB, dlerror());
  c10::cuda::_internal::setHasPrimaryContext(+[](c10::DeviceIndex) { return true; });
}

}  // namespace

void init() {
  register_cuda_hooks();
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

bool try_alloc(std::size_t size, cudaStream_t stream, void** ptr) {
  try {
    *ptr = A::raw_alloc_with_stream(size, stream);
    return true;
  } catch (const c10::OutOfMemoryError&) {
    return false;
  }
}

void record_stream(void* ptr, cudaStream_t stream) {
  // c10 finds the block by address but only accepts a DataPtr with its own deleter;
  // the DataPtr is released, not deleted: the trace's free returns the block.
  c10::DataPtr data(ptr, ptr, A::get()->raw_deleter(), c10::Device(c10::DeviceType::CUDA, 0));
  A::recordStream(data, c10::cuda::getStreamFromExternal(stream, 0));
  (void)data.release_context();
}

void set_memory_fraction(double fraction) {
  A::setMemoryFraction(fraction, 0);
}

void reset_all() {
  reset();
  A::resetAccumulatedStats(0);
}

void retain_pool(std::uint64_t id) {
  A::createOrIncrefPool(0, c10::cuda::MempoolId_t{0, id});
}

void release_pool(std::uint64_t id) {
  A::releasePool(0, c10::cuda::MempoolId_t{0, id});
}

void begin_route(std::uint64_t id, std::function<bool(cudaStream_t)> filter) {
  A::beginAllocateToPool(0, c10::cuda::MempoolId_t{0, id}, std::move(filter));
}

void end_route(std::uint64_t id) {
  A::endAllocateToPool(0, c10::cuda::MempoolId_t{0, id});
}

std::shared_ptr<void> checkpoint(std::uint64_t id) {
  return std::static_pointer_cast<void>(A::getCheckpointState(0, c10::cuda::MempoolId_t{0, id}));
}

void restore(const std::shared_ptr<void>& state, std::vector<void*>* freed,
             std::vector<void*>* allocated) {
  A::CheckpointDelta delta =
      A::setCheckpointPoolState(0, std::static_pointer_cast<A::AllocatorState>(state));
  for (void* p : delta.ptrs_freed) freed->push_back(p);
  for (c10::DataPtr& d : delta.dataptrs_allocd) {
    allocated->push_back(d.get());
    // The trace's frees give these blocks back (raw_delete): their DataPtr must not
    // (release_context gives up the deleter without calling it).
    (void)d.release_context();
  }
}

void empty_cache() {
  A::emptyCache();
}

Stats stats() {
  const auto s = A::getDeviceStats(0);
  auto u = [](std::int64_t v) { return v < 0 ? std::uint64_t{0} : static_cast<std::uint64_t>(v); };
  Stats out;
  out.peak_reserved = u(s.reserved_bytes[0].peak);
  out.peak_requested = u(s.requested_bytes[0].peak);
  out.peak_allocated = u(s.allocated_bytes[0].peak);
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  out.num_ooms = s.num_ooms;
  out.num_alloc_retries = s.num_alloc_retries;
  return out;
}

}  // namespace reservoir_bench::c10_api
