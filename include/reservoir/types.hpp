// Handles shared by every layer (util vocabulary): streams, events and physical
// memory as the device knows them, opaque to the engine.
#pragma once

#include <cstdint>

namespace reservoir {

// A stream as the device knows it (for CUDA: the cudaStream_t / CUstream value;
// 0 is the legacy default stream). Opaque to the engine: only compared and hashed.
// Every value is a valid handle to the engine, UINTPTR_MAX included.
using StreamHandle = std::uintptr_t;
// An event created by Backend::create_event. Opaque to the engine.
using EventHandle = std::uintptr_t;
// A physical memory allocation (virtual-memory capability; CUmemGenericAllocationHandle).
using PhysicalHandle = std::uint64_t;

// A private memory pool's id: a pair of integers, as PyTorch's MempoolId_t (a graph
// capture's pools have first != 0, torch.cuda.graph_pool_handle()'s second != 0).
// {0, 0} names the default pools.
struct PoolId {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  bool is_default() const noexcept { return first == 0 && second == 0; }
  bool operator==(const PoolId&) const = default;
};

}  // namespace reservoir
