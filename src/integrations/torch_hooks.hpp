// The pluggable-allocator hooks of libreservoir.so (torch_allocator.cpp) that
// reservoir.torch's native part (python/reservoir/_native/) calls from C++.
//
// Not in reservoir.h, which needs no CUDA type: these take PyTorch's exact
// signatures, cudaStream_t included (CUstream_st* is what cuda_runtime_api.h
// names it). torch_allocator.cpp includes this file, so its definitions are
// compiled against these declarations; python/setup.py bundles it with reservoir.h
// into the package, where the native part is compiled at install time.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "reservoir/reservoir.h"  // RESERVOIR_C_API

struct CUstream_st;

extern "C" {
// alloc_fn of CUDAPluggableAllocator: throws on failure (PyTorch's OOM type where
// install() found it).
RESERVOIR_C_API void* reservoir_torch_malloc(size_t size, int device, CUstream_st* stream);
// free_fn: never throws.
RESERVOIR_C_API void reservoir_torch_free(void* ptr, size_t size, int device,
                                          CUstream_st* stream) noexcept;
// CUDAAllocator::cacheInfo: the largest block a request could get on device.
RESERVOIR_C_API void reservoir_torch_cache_info(int device, size_t* largest);

// One block of a segment, as c10's snapshot lists it (BlockInfo).
typedef struct reservoir_torch_block {
  uintptr_t address;
  size_t size;
  size_t requested;  // bytes asked for (0 for an inactive block)
  int state;         // 0 active_allocated, 1 active_pending_free, 2 inactive
} reservoir_torch_block;
typedef void (*reservoir_torch_segment_fn)(void* ctx, const reservoir_segment* segment,
                                           const reservoir_torch_block* blocks, size_t count);
// CUDAAllocator::snapshot: fn gets each segment of device (-1: every device) with the
// blocks tiling it, in address order, all from one snapshot; the caller's own errors
// stay in fn. Throws (as the hooks above) when the snapshot cannot be taken.
RESERVOIR_C_API void reservoir_torch_segments(int device, reservoir_torch_segment_fn fn, void* ctx);
// What c10's allocator tells PyTorch's profiler on each allocation and free: the
// bytes of the live block at ptr (0 when ptr is none), and device's allocated and
// reserved bytes now. Never throw.
RESERVOIR_C_API size_t reservoir_torch_block_size(void* ptr) noexcept;
RESERVOIR_C_API void reservoir_torch_memory_in_use(int device, size_t* allocated,
                                                   size_t* reserved) noexcept;
}
