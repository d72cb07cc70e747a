// reservoir.torch's native part: memory history with PyTorch's own stack contexts,
// and c10's snapshot built from Reservoir's segments and blocks.
//
// torch.cuda.memory._record_memory_history (and its C++ twin) makes a context
// recorder (Python, TorchScript and C++ frames: torch's CapturedTraceback) and hands
// it to the current allocator's recordHistory; torch.cuda.memory._snapshot() and
// torch::cuda::_memory_snapshot_pickled() turn the allocator's snapshot() into
// frames. Reservoir's C API carries no such context, so this part keeps the history
// PyTorch reads: a tracker attached to Reservoir (called on the thread whose call
// made the entry, after Reservoir let go of its locks) runs the recorder there, as
// c10's allocator does inside malloc and free, and keeps per device the last
// max_entries entries, each with its context, compile region and user metadata, and
// the context of every live block and segment for the snapshot.
//
// Context levels (c10's RecordContext): STATE keeps the context of live blocks and
// segments only; ALLOC also puts it on their trace entries; ALL also records where
// frees and device frees happened. skip_actions leaves those actions out of the
// ring (a block's context is still kept).
//
// Included by torch_native_allocator.cpp after PyTorch's and Reservoir's headers.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace reservoir_native {

using Context = std::shared_ptr<c10::GatheredContext>;
using c10::cuda::MempoolId_t;
using c10::cuda::CUDACachingAllocator::CreateContextFn;
using c10::cuda::CUDACachingAllocator::RecordContext;
using c10::cuda::CUDACachingAllocator::SnapshotInfo;
using c10::cuda::CUDACachingAllocator::TraceEntry;

// PyTorch's action for one of Reservoir's; false for one it has no name for. Under
// policy:compact each extent is mapped whole and unmapped whole: its mappings are
// segments to PyTorch's tools (a communication library registers those only).
inline bool torch_action(int action, bool compact, TraceEntry::Action* out) {
  using Action = TraceEntry::Action;
  switch (action) {
    case RESERVOIR_TRACE_ALLOC: *out = Action::ALLOC; return true;
    case RESERVOIR_TRACE_FREE_REQUESTED: *out = Action::FREE_REQUESTED; return true;
    case RESERVOIR_TRACE_FREE_COMPLETED: *out = Action::FREE_COMPLETED; return true;
    case RESERVOIR_TRACE_SEGMENT_ALLOC: *out = Action::SEGMENT_ALLOC; return true;
    case RESERVOIR_TRACE_SEGMENT_FREE: *out = Action::SEGMENT_FREE; return true;
    case RESERVOIR_TRACE_SEGMENT_MAP:
      *out = compact ? Action::SEGMENT_ALLOC : Action::SEGMENT_MAP;
      return true;
    case RESERVOIR_TRACE_SEGMENT_UNMAP:
      *out = compact ? Action::SEGMENT_FREE : Action::SEGMENT_UNMAP;
      return true;
    case RESERVOIR_TRACE_SNAPSHOT: *out = Action::SNAPSHOT; return true;
    case RESERVOIR_TRACE_OOM: *out = Action::OOM; return true;
    default: return false;
  }
}

// The names skip_actions uses (those of the snapshot's "action" key).
inline const char* action_name(TraceEntry::Action action) {
  using Action = TraceEntry::Action;
  switch (action) {
    case Action::ALLOC: return "alloc";
    case Action::FREE_REQUESTED: return "free_requested";
    case Action::FREE_COMPLETED: return "free_completed";
    case Action::SEGMENT_ALLOC: return "segment_alloc";
    case Action::SEGMENT_FREE: return "segment_free";
    case Action::SEGMENT_MAP: return "segment_map";
    case Action::SEGMENT_UNMAP: return "segment_unmap";
    case Action::SNAPSHOT: return "snapshot";
    case Action::OOM: return "oom";
  }
  return "";
}

// A failed call of Reservoir's C API as PyTorch's error, with Reservoir's message.
inline void check(reservoir_status status, const char* what) {
  if (status == RESERVOIR_OK) return;
  const char* message = reservoir_last_error();
  TORCH_CHECK(false, "Reservoir: ", what, " failed: ", message ? message : "(no message)");
}

inline bool policy_compact() {
  char config[1024] = {};
  std::size_t needed = 0;
  return reservoir_config_text(config, sizeof config, &needed) == RESERVOIR_OK &&
         std::string(config).find("policy:compact") != std::string::npos;
}

// PyTorch's TraceEntry for one of Reservoir's, by whichever constructor the installed
// PyTorch has (with the pool, the context, the compile region and the metadata, or
// fewer of them).
template <typename E = TraceEntry>
E trace_entry(typename E::Action action, const reservoir_trace_entry& e, Context context = nullptr,
              const std::string& compile_context = "N/A", const std::string& metadata = "") {
  const auto device = static_cast<c10::DeviceIndex>(e.device);
  const auto stream = reinterpret_cast<cudaStream_t>(e.stream);
  const auto time = c10::getApproximateTime();
  const MempoolId_t pool{e.pool.first, e.pool.second};
  using A = typename E::Action;
  if constexpr (std::is_constructible_v<E, A, c10::DeviceIndex, std::size_t, std::size_t,
                                        cudaStream_t, MempoolId_t, decltype(time), Context,
                                        std::string, std::string>) {
    return E(action, device, e.address, e.size, stream, pool, time, std::move(context),
             compile_context, metadata);
  } else if constexpr (std::is_constructible_v<E, A, c10::DeviceIndex, std::size_t, std::size_t,
                                               cudaStream_t, MempoolId_t, decltype(time),
                                               Context>) {
    return E(action, device, e.address, e.size, stream, pool, time, std::move(context));
  } else {
    return E(action, device, e.address, e.size, stream, time, std::move(context));
  }
}

// Members that only some PyTorch versions have.
template <typename T, typename = void>
struct has_annotations : std::false_type {};
template <typename T>
struct has_annotations<T, std::void_t<decltype(std::declval<T&>().external_annotations)>>
    : std::true_type {};
template <typename T, typename = void>
struct has_config : std::false_type {};
template <typename T>
struct has_config<T, std::void_t<decltype(std::declval<T&>().config_metadata)>>
    : std::true_type {};

// The history PyTorch reads (one per process, never destroyed: Reservoir may call
// its tracker late in the process's exit).
class History {
 public:
  static History& instance() {
    static auto* history = new History();
    return *history;
  }

  // c10's recordHistory.
  void record(bool enabled, CreateContextFn recorder, std::size_t max_entries, RecordContext when,
              bool clear, const std::vector<std::string>& skip_actions) {
    TORCH_CHECK(when == RecordContext::NEVER || recorder != nullptr,
                "Reservoir: recordHistory needs a context recorder for a context level");
    if (enabled && !attached_.exchange(true)) {
      compact_ = policy_compact();
      check(reservoir_attach_trace_tracker(&History::deliver, this), "recordHistory");
    }
    std::lock_guard<std::mutex> guard(mutex_);
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled ? when : RecordContext::NEVER;
    max_entries_ = std::max<std::size_t>(1, max_entries);
    skip_.clear();
    skip_.insert(skip_actions.begin(), skip_actions.end());
    if (!enabled || clear) {
      rings_.clear();
      annotations_.clear();
    }
    if (!enabled) {
      blocks_.clear();
      segments_.clear();
    }
    for (auto& ring : rings_)
      while (ring.second.size() > max_entries_) ring.second.pop_front();
    enabled_.store(enabled);
  }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Compile regions are per thread: a region's requests are the thread's that runs it.
  static std::vector<std::string>& compile_regions() {
    thread_local std::vector<std::string> regions;
    return regions;
  }
  void set_user_metadata(const std::string& metadata) {
    std::lock_guard<std::mutex> guard(mutex_);
    metadata_ = metadata;
  }
  std::string user_metadata() {
    std::lock_guard<std::mutex> guard(mutex_);
    return metadata_;
  }
  void annotate(const std::vector<std::pair<std::string, std::string>>& metadata) {
    if (!enabled()) return;
    int device = 0;
    if (reservoir_current_device(&device) != RESERVOIR_OK) device = 0;
    std::lock_guard<std::mutex> guard(mutex_);
    annotations_.push_back(Annotation{device, c10::getApproximateTime(), metadata});
    while (annotations_.size() > max_entries_) annotations_.pop_front();
  }

  // c10's snapshot(pool, include_traces): the traces first, so that the SNAPSHOT
  // entry listing the segments makes comes after them, as in c10.
  SnapshotInfo snapshot(MempoolId_t pool, bool include_traces) {
    SnapshotInfo info{};
    if (include_traces) fill_traces(info);
    Listing listing{this, pool, &info, false};
    reservoir_torch_segments(-1, &History::list_segment, &listing);
    if (listing.failed) TORCH_CHECK(false, "Reservoir: snapshot: out of host memory");
    if constexpr (has_config<SnapshotInfo>::value) fill_config(info.config_metadata);
    return info;
  }

 private:
  struct Annotation {
    int device;
    decltype(c10::getApproximateTime()) time;
    std::vector<std::pair<std::string, std::string>> metadata;
  };
  struct Listing {
    History* self;
    MempoolId_t pool;
    SnapshotInfo* info;
    bool failed;
  };

  // Reservoir's tracker: may run on any thread, never throws back into Reservoir.
  static void deliver(void* ctx, const reservoir_trace_entry* e) {
    auto* self = static_cast<History*>(ctx);
    if (!self->enabled()) return;
    try {
      self->add(*e);
    } catch (...) {  // out of host memory, or a recorder that failed: the entry is lost
    }
  }

  void add(const reservoir_trace_entry& e) {
    TraceEntry::Action action;
    if (!torch_action(e.action, compact_, &action)) return;
    CreateContextFn recorder = nullptr;
    RecordContext when = RecordContext::NEVER;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      recorder = recorder_;
      when = when_;
    }
    using Action = TraceEntry::Action;
    const bool alloc = action == Action::ALLOC || action == Action::SEGMENT_ALLOC ||
                       action == Action::SEGMENT_MAP || action == Action::OOM;
    const bool free = action == Action::FREE_REQUESTED || action == Action::FREE_COMPLETED ||
                      action == Action::SEGMENT_FREE || action == Action::SEGMENT_UNMAP;
    // The recorder runs outside the mutex: it may wait for Python's lock, which a
    // thread waiting for this mutex could hold.
    Context context;
    if (recorder != nullptr && ((alloc && when >= RecordContext::STATE) ||
                                (free && when == RecordContext::ALL)))
      context = recorder();
    const std::vector<std::string>& regions = compile_regions();
    const std::string region = regions.empty() ? std::string("N/A") : regions.back();

    std::lock_guard<std::mutex> guard(mutex_);
    const bool block = action == Action::ALLOC || action == Action::FREE_REQUESTED ||
                       action == Action::FREE_COMPLETED;
    auto& kept = block ? blocks_ : segments_;
    if (action == Action::ALLOC || action == Action::SEGMENT_ALLOC ||
        action == Action::SEGMENT_MAP) {
      if (context) kept[e.address] = context;
    } else if (free) {
      auto it = kept.find(e.address);
      if (!context && it != kept.end()) context = it->second;  // where it was made
      if (it != kept.end() && action != Action::FREE_REQUESTED) kept.erase(it);
    }
    if (skip_.count(action_name(action)) != 0) return;
    auto& ring = rings_[e.device];
    ring.push_back(trace_entry(action, e, when >= RecordContext::ALLOC ? context : nullptr,
                               region, metadata_));
    while (ring.size() > max_entries_) ring.pop_front();
  }

  void fill_traces(SnapshotInfo& info) {
    std::lock_guard<std::mutex> guard(mutex_);
    int devices = 0;
    if (reservoir_device_count(&devices) != RESERVOIR_OK) devices = 0;
    for (const auto& ring : rings_) devices = std::max(devices, ring.first + 1);
    info.device_traces.resize(static_cast<std::size_t>(devices));
    for (const auto& ring : rings_)
      info.device_traces[static_cast<std::size_t>(ring.first)].assign(ring.second.begin(),
                                                                      ring.second.end());
    if constexpr (has_annotations<SnapshotInfo>::value) {
      using Entry = typename decltype(info.external_annotations)::value_type;
      for (const Annotation& a : annotations_) {
        Entry entry(static_cast<c10::DeviceIndex>(a.device), a.time);
        for (const auto& [name, value] : a.metadata) entry.recordUserMetadata(name, value);
        info.external_annotations.push_back(std::move(entry));
      }
    }
  }

  static void list_segment(void* ctx, const reservoir_segment* s, const reservoir_torch_block* b,
                           std::size_t count) {
    auto* listing = static_cast<Listing*>(ctx);
    const bool all = listing->pool.first == 0 && listing->pool.second == 0;
    if (!all && (s->pool.first != listing->pool.first || s->pool.second != listing->pool.second))
      return;
    try {
      listing->info->segments.push_back(listing->self->segment(*s, b, count));
    } catch (...) {
      listing->failed = true;
    }
  }

  c10::cuda::CUDACachingAllocator::SegmentInfo segment(const reservoir_segment& s,
                                                       const reservoir_torch_block* blocks,
                                                       std::size_t count) {
    c10::cuda::CUDACachingAllocator::SegmentInfo out;
    out.device = static_cast<decltype(out.device)>(s.device);
    out.address = static_cast<decltype(out.address)>(s.address);
    out.total_size = static_cast<decltype(out.total_size)>(s.size);
    out.requested_size = static_cast<decltype(out.requested_size)>(s.requested);
    out.allocated_size = static_cast<decltype(out.allocated_size)>(s.allocated);
    out.active_size = static_cast<decltype(out.active_size)>(s.active);
    out.stream = reinterpret_cast<decltype(out.stream)>(s.stream);
    out.is_large = s.is_large != 0;
    out.is_expandable = s.is_expandable != 0;
    out.owner_private_pool_id = MempoolId_t{s.pool.first, s.pool.second};
    std::lock_guard<std::mutex> guard(mutex_);
    if (auto it = segments_.find(s.address); it != segments_.end())
      out.context_when_allocated = it->second;
    for (std::size_t i = 0; i < count; ++i) {
      c10::cuda::CUDACachingAllocator::BlockInfo block;
      block.size = static_cast<decltype(block.size)>(blocks[i].size);
      block.requested_size = static_cast<decltype(block.requested_size)>(blocks[i].requested);
      block.allocated = blocks[i].state == 0;
      block.active = blocks[i].state != 2;
      if (block.active)
        if (auto it = blocks_.find(blocks[i].address); it != blocks_.end())
          block.context_when_allocated = it->second;
      out.blocks.push_back(std::move(block));
    }
    return out;
  }

  // The settings c10's snapshot reports (its "allocator_settings"), from Reservoir's.
  template <typename Config>
  static void fill_config(Config& config) {
    std::vector<char> text(4096);
    std::size_t needed = 0;
    if (reservoir_config_text(text.data(), text.size(), &needed) != RESERVOIR_OK) return;
    const std::string settings(text.data());
    config.last_allocator_settings = settings;
    config.max_split_size = std::numeric_limits<std::size_t>::max();
    std::size_t start = 0;
    while (start <= settings.size()) {
      std::size_t end = settings.find(',', start);
      if (end == std::string::npos) end = settings.size();
      const std::string entry = settings.substr(start, end - start);
      const std::size_t colon = entry.find(':');
      if (colon != std::string::npos) {
        const std::string key = entry.substr(0, colon), value = entry.substr(colon + 1);
        try {
          if (key == "max_split_size_mb")
            config.max_split_size = static_cast<std::size_t>(std::stoull(value)) << 20;
          else if (key == "garbage_collection_threshold")
            config.garbage_collection_threshold = std::stod(value);
          else if (key == "expandable_segments")
            config.expandable_segments = value == "True" || value == "true";
          else if (key == "release_lock_on_cudamalloc")
            config.release_lock_on_malloc = value == "True" || value == "true";
        } catch (...) {  // a value of another shape: reported as the default
        }
      }
      start = end + 1;
    }
  }

  std::mutex mutex_;
  std::atomic<bool> enabled_{false};
  std::atomic<bool> attached_{false};
  bool compact_ = false;
  CreateContextFn recorder_ = nullptr;
  RecordContext when_ = RecordContext::NEVER;
  std::size_t max_entries_ = 1;
  std::unordered_set<std::string> skip_;
  std::string metadata_;
  std::map<int, std::deque<TraceEntry>> rings_;  // by device
  std::deque<Annotation> annotations_;
  std::unordered_map<std::uintptr_t, Context> blocks_;    // live blocks' contexts
  std::unordered_map<std::uintptr_t, Context> segments_;  // segments' contexts
};

}  // namespace reservoir_native
