// reservoir.torch's native part: PyTorch's pluggable allocator completed with what
// its interface leaves out.
//
// torch.cuda.memory.CUDAPluggableAllocator forwards allocation, free and the hooks
// with setters (src/integrations/torch_allocator.cpp), but not:
//   - cacheInfo ("does not yet support cacheInfo"), which cuDNN's benchmark mode
//     (torch.backends.cudnn.benchmark = True) asks for the workspace it may use;
//   - getCheckpointState / setCheckpointPoolState / checkPoolLiveAllocations, which
//     inductor's cudagraph trees (torch.compile mode="reduce-overhead") use, and
//     whose restore must give the storages live at a restore a deleter (PyTorch's
//     binding does that from the CheckpointDelta the allocator returns).
//   - snapshot and attachAllocatorTraceTracker, through which ProcessGroupNCCL
//     registers the allocator's segments with NCCL
//     (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1, zero-copy collectives): the
//     segments a communicator's creation lists, then every segment made and given back;
//   - attachOutOfMemoryObserver (what dump-on-OOM tools attach from C++);
//   - recordHistory with PyTorch's stack contexts, compile regions, user metadata and
//     annotations, and snapshot() with blocks, their contexts and the traces, from
//     which torch.cuda.memory._snapshot() and the memory viewer's plots are built
//     (torch_native_history.hpp); and the profiler's memory events
//     (torch.profiler.profile(profile_memory=True));
//   - enable / isEnabled (torch.cuda.caching_allocator_enable): a no-op there.
// Signatures that differ between PyTorch versions (snapshot's arguments, TraceEntry's
// constructor) are matched at compile time; members declared without `override` for
// them override whichever the installed PyTorch declares.
// And its allocation path keeps a map of every live pointer under a mutex, which
// Reservoir does not need (it knows each block's size, device and stream).
//
// Python cannot override a C++ virtual, so this file is compiled against the
// installed PyTorch's own headers (python/reservoir/_torch_native.py does it on the
// first install() and caches the result): a subclass of CUDAPluggableAllocator,
// copied from the pluggable install() has just made and wired (so the hooks stay
// as wired), made PyTorch's current allocator before CUDA is initialized.
//
// Not part of libreservoir.so (which needs no PyTorch): its own small library,
// linked against PyTorch's and libreservoir.so, loaded with ctypes.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/core/Allocator.h>
#include <c10/util/ApproximateClock.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

// libreservoir.so's C API and the hooks of it called here, from the library's own
// headers: _torch_native.py points the compiler at the copies bundled into the
// package (python/setup.py), or at include/ and src/ of the checkout.
#include "integrations/torch_hooks.hpp"
#include "reservoir/reservoir.h"
#include "torch_native_history.hpp"

namespace {

using c10::cuda::MempoolId_t;
using c10::cuda::CUDACachingAllocator::AllocatorState;
using c10::cuda::CUDACachingAllocator::AllocatorTraceTracker;
using c10::cuda::CUDACachingAllocator::CheckpointDelta;
using c10::cuda::CUDACachingAllocator::CreateContextFn;
using c10::cuda::CUDACachingAllocator::OutOfMemoryObserver;
using c10::cuda::CUDACachingAllocator::RecordContext;
using c10::cuda::CUDACachingAllocator::SnapshotInfo;
using c10::cuda::CUDACachingAllocator::TraceEntry;
using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

// The deleter of every DataPtr this allocator makes (PyTorch compares deleters:
// _free_And_Remove_DeleterFn, _has_Standard_Deleter).
// PyTorch's profiler (torch.profiler with profile_memory=True) hears of every
// allocation and free from the allocator, as from c10's: bytes, then the device's
// allocated and reserved bytes.
void report_to_profiler(void* ptr, int64_t bytes, int device) {
  size_t allocated = 0, reserved = 0;
  reservoir_torch_memory_in_use(device, &allocated, &reserved);
  c10::reportMemoryUsageToProfiler(ptr, bytes, allocated, reserved,
                                   c10::Device(c10::DeviceType::CUDA,
                                               static_cast<c10::DeviceIndex>(device)));
}
void profile_allocation(void* ptr, int device) {
  if (ptr == nullptr || !c10::memoryProfilingEnabled()) return;
  report_to_profiler(ptr, static_cast<int64_t>(reservoir_torch_block_size(ptr)), device);
}

void delete_block(void* ptr) {
  if (ptr != nullptr && c10::memoryProfilingEnabled()) {
    const auto bytes = static_cast<int64_t>(reservoir_torch_block_size(ptr));
    cudaPointerAttributes attributes{};
    const int device =
        cudaPointerGetAttributes(&attributes, ptr) == cudaSuccess ? attributes.device : 0;
    reservoir_torch_free(ptr, 0, 0, nullptr);
    report_to_profiler(ptr, -bytes, device);
    return;
  }
  reservoir_torch_free(ptr, 0, 0, nullptr);
}

// torch.cuda.caching_allocator_enable(False), PyTorch's meaning: every request goes
// straight to cudaMalloc (never counted in the statistics) and back with cudaFree.
// What raw_alloc handed out so is remembered, so that raw_delete, which may come
// after caching is on again, gives it back the same way.
struct Uncached {
  std::atomic<bool> enabled{true};
  std::atomic<std::size_t> live{0};  // raw pointers below: raw_delete looks only then
  std::mutex mutex;
  std::unordered_set<void*> raw;

  static Uncached& instance() {
    static Uncached* kept = new Uncached();  // outlives every tensor freed at exit
    return *kept;
  }
  static void* allocate(std::size_t size) {
    void* ptr = nullptr;
    if (size != 0) C10_CUDA_CHECK(cudaMalloc(&ptr, size));
    return ptr;
  }
  void* raw_allocate(std::size_t size) {
    void* ptr = allocate(size);
    if (ptr == nullptr) return ptr;
    std::lock_guard<std::mutex> guard(mutex);
    raw.insert(ptr);
    live.store(raw.size());
    return ptr;
  }
  // Whether ptr came from raw_allocate (then it is given back here).
  bool raw_free(void* ptr) {
    if (live.load() == 0) return false;
    {
      std::lock_guard<std::mutex> guard(mutex);
      if (raw.erase(ptr) == 0) return false;
      live.store(raw.size());
    }
    free(ptr);
    return true;
  }
  // A deleter: reports a failure instead of throwing.
  static void free(void* ptr) {
    const cudaError_t status = cudaFree(ptr);
    if (status != cudaSuccess)
      std::fprintf(stderr, "reservoir: cudaFree(%p) of an uncached allocation failed: %s\n", ptr,
                   cudaGetErrorString(status));
  }
};

reservoir_pool_id pool_of(MempoolId_t id) {
  return reservoir_pool_id{id.first, id.second};
}

using reservoir_native::check;

// A private pool's state as Reservoir took it.
struct ReservoirPoolState final : AllocatorState {
  explicit ReservoirPoolState(reservoir_pool_checkpoint* taken) : checkpoint(taken) {}
  ~ReservoirPoolState() override { reservoir_pool_checkpoint_free(checkpoint); }
  ReservoirPoolState(const ReservoirPoolState&) = delete;
  ReservoirPoolState& operator=(const ReservoirPoolState&) = delete;
  reservoir_pool_checkpoint* checkpoint;
};

using reservoir_native::History;
// PyTorch's trace trackers, called by one tracker attached to Reservoir (the C API's
// trackers stay attached for the process: so do these).
class Trackers {
 public:
  static Trackers& instance() {
    static auto* trackers = new Trackers();  // never destroyed: Reservoir may call it late
    return *trackers;
  }
  void attach(AllocatorTraceTracker tracker) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (!attached_) {
      check(reservoir_attach_trace_tracker(&Trackers::deliver, this), "attachAllocatorTraceTracker");
      attached_ = true;
    }
    compact_ = reservoir_native::policy_compact();  // see torch_action
    auto next = std::make_shared<std::vector<AllocatorTraceTracker>>(*list_);
    next->push_back(std::move(tracker));
    list_ = std::move(next);
  }

 private:
  static void deliver(void* ctx, const reservoir_trace_entry* e) {
    auto* self = static_cast<Trackers*>(ctx);
    std::shared_ptr<const std::vector<AllocatorTraceTracker>> list;
    bool compact = false;
    {
      std::lock_guard<std::mutex> guard(self->mutex_);
      list = self->list_;
      compact = self->compact_;
    }
    TraceEntry::Action action;
    if (!reservoir_native::torch_action(e->action, compact, &action)) return;
    const TraceEntry entry = reservoir_native::trace_entry(action, *e);
    for (const AllocatorTraceTracker& tracker : *list) {
      // A tracker's error must not cross Reservoir's C boundary (a free never throws).
      try {
        tracker(entry);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "reservoir: a PyTorch trace tracker threw (ignored): %s\n",
                     error.what());
      } catch (...) {
        std::fprintf(stderr, "reservoir: a PyTorch trace tracker threw (ignored)\n");
      }
    }
  }

  std::mutex mutex_;
  bool attached_ = false;
  bool compact_ = false;
  std::shared_ptr<const std::vector<AllocatorTraceTracker>> list_ =
      std::make_shared<std::vector<AllocatorTraceTracker>>();
};

// An out-of-memory observer, kept for the process (as Reservoir keeps it).
void observe_oom(void* ctx, int device, size_t alloc_size, size_t allowed, size_t free_bytes) {
  try {
    (*static_cast<OutOfMemoryObserver*>(ctx))(device, static_cast<int64_t>(alloc_size),
                                               static_cast<int64_t>(allowed),
                                               static_cast<int64_t>(free_bytes));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "reservoir: an out-of-memory observer threw (ignored): %s\n",
                 error.what());
  } catch (...) {
    std::fprintf(stderr, "reservoir: an out-of-memory observer threw (ignored)\n");
  }
}

class ReservoirTorchAllocator final : public CUDAPluggableAllocator {
 public:
  // The copy keeps every function install() wired (the hooks with setters).
  explicit ReservoirTorchAllocator(CUDAPluggableAllocator& wired) : CUDAPluggableAllocator(wired) {}

  // ---- allocation without the pluggable's pointer map
  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    if (!Uncached::instance().enabled.load(std::memory_order_relaxed)) {
      void* ptr = Uncached::allocate(size);
      return c10::DataPtr(ptr, ptr, &Uncached::free, c10::Device(c10::DeviceType::CUDA, device));
    }
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device);
    void* ptr = reservoir_torch_malloc(size, device, stream);
    profile_allocation(ptr, device);
    return c10::DataPtr(ptr, ptr, &delete_block, c10::Device(c10::DeviceType::CUDA, device));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }
  void* raw_alloc(size_t size) override {
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return raw_alloc_with_stream(size, c10::cuda::getCurrentCUDAStream(device));
  }
  void* raw_alloc_with_stream(size_t size, cudaStream_t stream) override {
    Uncached& uncached = Uncached::instance();
    if (!uncached.enabled.load(std::memory_order_relaxed)) return uncached.raw_allocate(size);
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    void* ptr = reservoir_torch_malloc(size, device, stream);
    profile_allocation(ptr, device);
    return ptr;
  }
  void raw_delete(void* ptr) override {
    if (!Uncached::instance().raw_free(ptr)) delete_block(ptr);
  }
  // torch.cuda.caching_allocator_enable (no `override`: versions before it lack them)
  void enable(bool value) { Uncached::instance().enabled.store(value); }
  bool isEnabled() const { return Uncached::instance().enabled.load(); }

  // ---- cuDNN's benchmark mode
  void cacheInfo(c10::DeviceIndex device, size_t* largest) override {
    reservoir_torch_cache_info(static_cast<int>(device), largest);
  }

  // ---- cudagraph trees' checkpoints
  std::shared_ptr<AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                     MempoolId_t id) override {
    reservoir_pool_checkpoint* taken = nullptr;
    check(reservoir_pool_checkpoint_take(device, pool_of(id), &taken), "getCheckpointState");
    return std::make_shared<ReservoirPoolState>(taken);
  }
  // Every block allocated in the pool is freed and those the checkpoint records are
  // allocated again; PyTorch's binding gives the live storages the DataPtrs made here
  // (so their deleter is this allocator's, as cudagraph trees assert).
  CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                         std::shared_ptr<AllocatorState> state) override {
    auto* ours = dynamic_cast<ReservoirPoolState*>(state.get());
    TORCH_CHECK(ours != nullptr,
                "Reservoir: setCheckpointPoolState got a state that "
                "Reservoir's getCheckpointState did not make");
    reservoir_pool_restore* restored = nullptr;
    check(reservoir_pool_checkpoint_restore(ours->checkpoint, &restored), "setCheckpointPoolState");
    CheckpointDelta delta;
    try {
      const std::size_t freed = reservoir_pool_restore_count(restored, 0);
      const std::size_t allocated = reservoir_pool_restore_count(restored, 1);
      delta.ptrs_freed.reserve(freed);
      delta.dataptrs_allocd.reserve(allocated);
      for (std::size_t i = 0; i < freed; ++i)
        delta.ptrs_freed.push_back(reservoir_pool_restore_pointer(restored, 0, i));
      for (std::size_t i = 0; i < allocated; ++i) {
        void* ptr = reservoir_pool_restore_pointer(restored, 1, i);
        delta.dataptrs_allocd.emplace_back(ptr, ptr, &delete_block,
                                           c10::Device(c10::DeviceType::CUDA, device));
      }
    } catch (...) {
      reservoir_pool_restore_free(restored);
      throw;
    }
    reservoir_pool_restore_free(restored);
    return delta;
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    const std::vector<void*> ptrs(expected.begin(), expected.end());
    int same = 0;
    check(reservoir_pool_live_allocations_are(device, pool_of(id), ptrs.data(), ptrs.size(), &same),
          "checkPoolLiveAllocations");
    return same != 0;
  }

  // ---- what a communication library registers, and out-of-memory observers
  // (no `override`: each overrides the signature the installed PyTorch declares)
  // (the segments of pool only, unless it is the default (0, 0), as c10's)
  SnapshotInfo snapshot() { return History::instance().snapshot(MempoolId_t{0, 0}, true); }
  SnapshotInfo snapshot(MempoolId_t pool) { return History::instance().snapshot(pool, true); }
  SnapshotInfo snapshot(MempoolId_t pool, bool include_traces) {
    return History::instance().snapshot(pool, include_traces);
  }

  // ---- memory history with PyTorch's contexts (torch_native_history.hpp)
  // (no `override`: each overrides the signature the installed PyTorch declares)
  void recordHistory(bool enabled, CreateContextFn recorder, size_t max_entries,
                     RecordContext when, bool clear,
                     const std::vector<std::string>& skip_actions) {
    History::instance().record(enabled, recorder, max_entries, when, clear, skip_actions);
    // Reservoir's own history (reservoir.dump_snapshot, memory_summary) follows it.
    check(reservoir_record_history(enabled ? 1 : 0, std::max<size_t>(1, max_entries)),
          "recordHistory");
  }
  void recordHistory(bool enabled, CreateContextFn recorder, size_t max_entries,
                     RecordContext when) {
    recordHistory(enabled, recorder, max_entries, when, false, {});
  }
  bool isHistoryEnabled() { return History::instance().enabled(); }
  void pushCompileContext(std::string& region) { History::compile_regions().push_back(region); }
  void popCompileContext() {
    auto& regions = History::compile_regions();
    if (!regions.empty()) regions.pop_back();
  }
  void setUserMetadata(const std::string& metadata) {
    History::instance().set_user_metadata(metadata);
  }
  std::string getUserMetadata() { return History::instance().user_metadata(); }
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& metadata) {
    History::instance().annotate(metadata);
  }
  void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) {
    Trackers::instance().attach(std::move(tracker));
  }
  void attachOutOfMemoryObserver(OutOfMemoryObserver observer) override {
    auto* kept = new OutOfMemoryObserver(std::move(observer));  // for the process
    check(reservoir_attach_oom_observer(&observe_oom, kept), "attachOutOfMemoryObserver");
  }

  // Not initialized until the swap is done: see reservoir_torch_native_install.
  bool initialized() override { return swapped_ && CUDAPluggableAllocator::initialized(); }
  void finish_swap() {
    if (!CUDAPluggableAllocator::initialized()) init(c10::cuda::device_count());
    swapped_ = true;
  }

 private:
  bool swapped_ = false;
};

void write_message(char* message, std::size_t capacity, const std::string& text) {
  if (message == nullptr || capacity == 0) return;
  std::snprintf(message, capacity, "%s", text.c_str());
}

}  // namespace

// Returns 0 when PyTorch's current allocator is now Reservoir's native one; else
// nonzero, with the reason in message (the pluggable allocator stays in place).
extern "C" __attribute__((visibility("default"))) int reservoir_torch_native_install(
    char* message, std::size_t capacity) noexcept {
  try {
    const auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
    if (!current || current->name() != "pluggable") {
      write_message(message, capacity,
                    "PyTorch's current allocator is not the pluggable one install() made");
      return 1;
    }
    // name() is the pluggable class's: only it (or a subclass) answers "pluggable".
    auto& wired = static_cast<CUDAPluggableAllocator&>(*current);
    auto native = std::make_shared<ReservoirTorchAllocator>(wired);
    // changeCurrentAllocator refuses to replace an initialized allocator, and the
    // pluggable one was initialized when made (createCustomAllocator calls init). So
    // c10 is pointed at the new one (not initialized yet) first, then PyTorch's own
    // swap runs, keeping its record of the current allocator (what
    // torch.cuda.memory._get_current_allocator() returns) right. CUDA is not
    // initialized yet (install() checked), so nothing allocates meanwhile.
    auto& slot = c10::cuda::CUDACachingAllocator::allocator;
    slot.store(native.get());
    try {
      torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(native);
    } catch (...) {
      slot.store(current.get());
      throw;
    }
    native->finish_swap();
    return 0;
  } catch (const std::exception& e) {
    write_message(message, capacity, e.what());
  } catch (...) {
    write_message(message, capacity, "unknown exception");
  }
  return 2;
}

// Whether PyTorch's current allocator is this file's class (a test's question).
extern "C" __attribute__((visibility("default"))) int reservoir_torch_native_active() noexcept {
  try {
    const auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
    return dynamic_cast<ReservoirTorchAllocator*>(current.get()) != nullptr ? 1 : 0;
  } catch (...) {
    return 0;
  }
}
