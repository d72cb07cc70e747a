// PyTorch's pluggable-allocator symbols (torch.cuda.memory.CUDAPluggableAllocator).
//
// PyTorch loads libreservoir.so with ctypes, takes the addresses of these symbols and
// calls them through std::function with the exact C++ signatures declared in
// torch/csrc/cuda/CUDAPluggableAllocator.h (the setters are listed in
// docs/python.md). No CUDA or PyTorch header is needed: cudaStream_t is only a
// pointer to an opaque struct, and MempoolId_t is a pair of unsigned long long.
//
// Errors: PyTorch calls the allocation and query hooks from C++ that translates any
// std::exception into a Python RuntimeError, so those hooks throw. Out of memory is
// raised as PyTorch's c10::OutOfMemoryError (torch.cuda.OutOfMemoryError in Python)
// where reservoir.torch.install() found that type, with PyTorch's first sentence
// ("CUDA out of memory. Tried to allocate ...", which tools match on); see
// torch_oom.cpp. The free hook runs from tensor destructors, where an exception would
// terminate the process: it never throws, and reports the first failure on stderr.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "front/c_segment.hpp"
#include "integrations/torch_hooks.hpp"
#include "integrations/torch_oom.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/history.hpp"
#include "reservoir/reservoir.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;
// c10::cuda::MempoolId_t (c10/cuda/CUDAGraphsC10Utils.h).
using MempoolId = std::pair<unsigned long long, unsigned long long>;

namespace {

using reservoir::Allocator;
using reservoir::StreamHandle;

StreamHandle handle(cudaStream_t stream) {
  return reinterpret_cast<StreamHandle>(stream);
}

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::atomic<bool> g_free_error_reported{false};

// The first failed free is printed (one line); later ones would flood a training
// log from every tensor destructor, so they are dropped.
void report_free_error(const void* ptr, const char* what) noexcept {
  if (g_free_error_reported.exchange(true)) return;
  try {
    std::fprintf(stderr,
                 "reservoir: freeing %p for PyTorch failed, memory left as is: %s "
                 "(further free errors are not printed)\n",
                 ptr, one_line(what).c_str());
  } catch (...) {
    std::fprintf(stderr, "reservoir: freeing %p for PyTorch failed\n", ptr);
  }
}

// The (device, stream) pairs PyTorch allocated on or synchronized: what
// torch.cuda.synchronize() (every stream of a device) must tell the allocator
// about. A thread-local memo keeps the allocation path to one comparison when the
// stream does not change. PyTorch pools its streams, so the list stays short; past
// kMaxStreams new ones are not remembered (a device synchronize then misses them,
// and their frees complete on the allocator's own event queries, as without it).
class SeenStreams {
 public:
  void remember(int device, StreamHandle stream) {
    thread_local int t_device = -1;
    thread_local StreamHandle t_stream = 0;
    if (device == t_device && stream == t_stream) return;
    t_device = device;
    t_stream = stream;
    std::lock_guard<std::mutex> guard(mutex_);
    const Entry entry{device, stream};
    if (std::find(entries_.begin(), entries_.end(), entry) == entries_.end() &&
        entries_.size() < kMaxStreams)
      entries_.push_back(entry);
  }
  std::vector<StreamHandle> of_device(int device) {
    std::vector<StreamHandle> out;
    std::lock_guard<std::mutex> guard(mutex_);
    for (const Entry& e : entries_)
      if (e.device == device) out.push_back(e.stream);
    return out;
  }

 private:
  static constexpr std::size_t kMaxStreams = 4096;
  struct Entry {
    int device;
    StreamHandle stream;
    bool operator==(const Entry&) const = default;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

SeenStreams& seen_streams() {
  static SeenStreams* streams = new SeenStreams;  // never destroyed: frees at exit
  return *streams;
}

reservoir::PoolId pool_of(const MempoolId& id) {
  return reservoir::PoolId{id.first, id.second};
}

// The first failure of a hook that must not throw (end, release: PyTorch calls them
// from capture_end's cleanup and from destructors) is printed, like report_free_error.
std::atomic<bool> g_pool_error_reported{false};
void report_pool_error(const char* hook, const char* what) noexcept {
  if (g_pool_error_reported.exchange(true)) return;
  std::fprintf(stderr,
               "reservoir: %s for PyTorch failed: %s (further pool errors are not printed)\n", hook,
               what);
}

}  // namespace

extern "C" {

// alloc_fn of CUDAPluggableAllocator: void*(size_t, int, cudaStream_t).
RESERVOIR_C_API void* reservoir_torch_malloc(size_t size, int device, cudaStream_t stream) {
  try {
    void* ptr = Allocator::instance().allocate(size, handle(stream), device);
    seen_streams().remember(device, handle(stream));
    return ptr;
  } catch (const reservoir::OutOfMemoryError& e) {
    // PyTorch's first sentence (tools match it), then Reservoir's report; raised as
    // torch.cuda.OutOfMemoryError where install() found PyTorch's type.
    reservoir::detail::throw_torch_out_of_memory(
        reservoir::detail::torch_out_of_memory_message(e.what()));
  }
}

// free_fn: void(void*, size_t, int, cudaStream_t). The engine knows the block's
// size, device and stream; PyTorch's copies are not needed.
RESERVOIR_C_API void reservoir_torch_free(void* ptr, size_t size, int device,
                                          cudaStream_t stream) noexcept {
  try {
    Allocator::instance().deallocate(ptr);
  } catch (const std::exception& e) {
    report_free_error(ptr, e.what());
  } catch (...) {
    report_free_error(ptr, "unknown exception");
  }
}

// set_init_fn: void(int). Called at PyTorch's lazy CUDA initialization; creates the
// allocator now so a bad RESERVOIR_ALLOC_CONF fails there, and refuses the
// simulated device, whose addresses a kernel cannot use.
RESERVOIR_C_API void reservoir_torch_init(int device_count) {
  Allocator& allocator = Allocator::instance();
  const std::string backend = allocator.backend().name();
  if (backend != "cuda") {
    throw std::runtime_error("Reservoir is using the '" + backend +
                             "' device backend, not CUDA, so PyTorch cannot use its memory; "
                             "remove device:" +
                             backend + " from RESERVOIR_ALLOC_CONF or check the CUDA driver");
  }
}

// set_reset_fn: void(). torch.cuda.empty_cache().
RESERVOIR_C_API void reservoir_torch_empty_cache(void) {
  Allocator::instance().empty_cache();
}

// set_memory_fraction_fn: void(double, int). torch.cuda.set_per_process_memory_fraction.
RESERVOIR_C_API void reservoir_torch_set_memory_fraction(double fraction, int device) {
  Allocator::instance().set_memory_fraction(fraction, device);
}

// set_base_alloc_fn: void*(void*, size_t*). The segment holding ptr and its size.
RESERVOIR_C_API void* reservoir_torch_base_alloc(void* ptr, size_t* size) {
  const reservoir::BaseAllocation base = Allocator::instance().base_allocation(ptr);
  if (size != nullptr) *size = base.size;
  return base.base;
}

// cacheInfo (CUDAAllocator::cacheInfo(device, size_t*)): not a pluggable setter;
// reservoir.torch's native part (src/integrations/torch_native) overrides cacheInfo
// with this. As c10 does: a zero *largest starts from the device's free memory (an
// optimistic guess), then any cached free block larger than it, private pools
// included. cuDNN's benchmark sizes convolution workspaces with it.
RESERVOIR_C_API void reservoir_torch_cache_info(int device, size_t* largest) {
  if (largest == nullptr) return;
  Allocator& allocator = Allocator::instance();
  if (device < 0) {
    if (allocator.backend().current_device(&device) != reservoir::DeviceStatus::ok) device = 0;
  }
  if (*largest == 0) {
    reservoir::MemoryInfo info;
    if (allocator.backend().memory_info(device, &info) == reservoir::DeviceStatus::ok)
      *largest = info.free;
  }
  *largest = std::max(*largest, allocator.largest_cached_block(device));
}

// The native part's snapshot (CUDAAllocator::snapshot): each segment with its blocks,
// from one Allocator::segments() call, so blocks always tile their segment.
static_assert(static_cast<int>(reservoir::BlockStateInfo::active_allocated) == 0 &&
                  static_cast<int>(reservoir::BlockStateInfo::active_pending_free) == 1 &&
                  static_cast<int>(reservoir::BlockStateInfo::inactive) == 2,
              "reservoir_torch_block::state follows reservoir::BlockStateInfo");
RESERVOIR_C_API void reservoir_torch_segments(int device, reservoir_torch_segment_fn fn,
                                              void* ctx) {
  if (fn == nullptr) throw reservoir::InvalidArgumentError("reservoir_torch_segments: fn is NULL");
  std::vector<reservoir_torch_block> blocks;
  for (const reservoir::SegmentInfo& s : Allocator::instance().segments(device)) {
    const reservoir_segment segment = reservoir::detail::to_c(s);
    blocks.clear();
    for (const reservoir::BlockInfo& b : s.blocks)
      blocks.push_back(
          reservoir_torch_block{b.address, b.size, b.requested_size, static_cast<int>(b.state)});
    fn(ctx, &segment, blocks.data(), blocks.size());
  }
}

RESERVOIR_C_API size_t reservoir_torch_block_size(void* ptr) noexcept {
  if (ptr == nullptr) return 0;
  try {
    return Allocator::instance().block_size(ptr);
  } catch (...) {  // not a live block of this allocator
    return 0;
  }
}

RESERVOIR_C_API void reservoir_torch_memory_in_use(int device, size_t* allocated,
                                                   size_t* reserved) noexcept {
  std::int64_t a = 0, r = 0;
  try {
    const reservoir::DeviceStats stats = Allocator::instance().stats(device);
    a = stats.allocated_bytes.all().current;
    r = stats.reserved_bytes.all().current;
  } catch (...) {  // an unknown device: nothing in use there
  }
  if (allocated != nullptr) *allocated = static_cast<size_t>(a);
  if (reserved != nullptr) *reserved = static_cast<size_t>(r);
}

// set_record_stream_fn: void(void*, cudaStream_t). Like PyTorch's own allocator, a
// pointer this allocator did not hand out (e.g. from torch.from_blob) is skipped.
RESERVOIR_C_API void reservoir_torch_record_stream(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return;
  try {
    Allocator::instance().record_stream(ptr, handle(stream));
  } catch (const reservoir::InvalidPointerError&) {
  }
}

// set_begin_allocate_to_pool: void(int, MempoolId_t, std::function<bool(cudaStream_t)>).
// CUDAGraph::capture_begin (filter: the stream belongs to this capture),
// torch.cuda.use_mem_pool and inductor's cudagraph trees (filter: the calling thread)
// route requests to the pool until end. Which of them called cannot be told from
// here, so every route counts as a capture under way, as in c10 (captures_underway):
// frees are deferred and nothing goes back to the device until it ends. Creates the
// pool, or adds a use.
RESERVOIR_C_API void reservoir_torch_begin_allocate_to_pool(
    int device, MempoolId mempool_id, std::function<bool(cudaStream_t)> filter) {
  Allocator::instance().begin_allocate_to_pool(
      pool_of(mempool_id),
      [filter = std::move(filter)](StreamHandle stream) {
        return filter(reinterpret_cast<cudaStream_t>(stream));
      },
      device);
}

// set_end_allocate_to_pool_fn: void(int, MempoolId_t). Called after cudaStreamEndCapture
// and on cleanup paths: reports instead of throwing.
RESERVOIR_C_API void reservoir_torch_end_allocate_to_pool(int device,
                                                          MempoolId mempool_id) noexcept {
  try {
    Allocator::instance().end_allocate_to_pool(pool_of(mempool_id), device);
  } catch (const std::exception& e) {
    report_pool_error("endAllocateToPool", e.what());
  }
}

// set_release_pool: void(int, MempoolId_t). CUDAGraph::reset (from its destructor),
// MemPool's destructor, use_mem_pool's exit: drops a use.
RESERVOIR_C_API void reservoir_torch_release_pool(int device, MempoolId mempool_id) noexcept {
  try {
    Allocator::instance().release_pool(pool_of(mempool_id), device);
  } catch (const std::exception& e) {
    report_pool_error("releasePool", e.what());
  }
}

// Older PyTorch (before the filter-based hooks): set_begin_allocate_stream_to_pool,
// void(int, cudaStream_t, MempoolId_t): the capturing stream's requests. Its end names
// only the stream, so the pool begun for each stream is remembered here.
struct StreamRoute {
  int device;
  StreamHandle stream;
  MempoolId pool;
};
static std::mutex g_stream_routes_mutex;
static std::vector<StreamRoute> g_stream_routes;

RESERVOIR_C_API void reservoir_torch_begin_allocate_stream_to_pool(int device, cudaStream_t stream,
                                                                   MempoolId mempool_id) {
  Allocator::instance().begin_capture_to_pool(pool_of(mempool_id), handle(stream), device);
  std::lock_guard<std::mutex> guard(g_stream_routes_mutex);
  g_stream_routes.push_back(StreamRoute{device, handle(stream), mempool_id});
}

// Older PyTorch: set_end_allocate_stream_to_pool_fn, void(int, cudaStream_t).
RESERVOIR_C_API void reservoir_torch_end_allocate_stream_to_pool(int device,
                                                                 cudaStream_t stream) noexcept {
  try {
    MempoolId pool{0, 0};
    {
      std::lock_guard<std::mutex> guard(g_stream_routes_mutex);
      auto it = std::find_if(
          g_stream_routes.begin(), g_stream_routes.end(),
          [&](const StreamRoute& r) { return r.device == device && r.stream == handle(stream); });
      if (it == g_stream_routes.end()) return;
      pool = it->pool;
      g_stream_routes.erase(it);
    }
    Allocator::instance().end_allocate_to_pool(pool_of(pool), device);
  } catch (const std::exception& e) {
    report_pool_error("endAllocateStreamToPool", e.what());
  }
}

// Not a PyTorch hook: reservoir.torch calls these (ctypes) after the host waited.
// Stream.synchronize / Event.synchronize: that stream of that device.
RESERVOIR_C_API int reservoir_torch_stream_synchronized(uintptr_t stream, int device) noexcept {
  try {
    seen_streams().remember(device, stream);
  } catch (...) {  // out of host memory: the notification below still goes out
  }
  return reservoir_notify_host_wait(stream, device);
}

// torch.cuda.synchronize(device): every stream PyTorch allocated on or synchronized
// on that device.
RESERVOIR_C_API int reservoir_torch_device_synchronized(int device) noexcept {
  std::vector<StreamHandle> streams;
  try {
    streams = seen_streams().of_device(device);
  } catch (...) {
    return RESERVOIR_ERROR_INTERNAL;  // out of host memory
  }
  int status = RESERVOIR_OK;
  for (StreamHandle stream : streams) {
    const int one = reservoir_notify_host_wait(stream, device);
    if (status == RESERVOIR_OK) status = one;
  }
  return status;
}

}  // extern "C"
