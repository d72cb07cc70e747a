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
}
