// The allocators reservoir_gpu_bench compares, behind one shape of call (as in
// /work/shared/tools/anchor_bench.cpp), and its CUDA error check.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace reservoir_bench {

struct Api {
  const char* name;
  void* (*alloc)(std::size_t, cudaStream_t);
  void (*free)(void*, cudaStream_t);
  bool slow;                         // cudaMalloc: fewer iterations, as anchor_bench does
  void (*reset)();                   // cold start: return cached memory, reset peaks
  std::uint64_t (*peak_reserved)();  // 0 when the allocator cannot say
  // Before a stream the allocator saw is destroyed (Reservoir's release_stream);
  // nullptr: nothing to do.
  void (*release_stream)(cudaStream_t) = nullptr;
};

// Destroys a stream a's calls used, telling a first. An allocator with no such call
// (c10, whose expandable segments synchronize the stream that used their pages when
// they give them back, as Reservoir's do) has its cache emptied first instead: no
// later call of it names the destroyed stream. (PyTorch itself never destroys the
// streams of its pool.)
inline void destroy_stream(const Api& a, cudaStream_t s) {
  if (a.release_stream)
    a.release_stream(s);
  else
    a.reset();
  CK(cudaStreamDestroy(s));
}

}  // namespace reservoir_bench
