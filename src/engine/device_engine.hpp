// DeviceEngine: the allocator of one device. It routes each request to the
// StreamPool of its stream (created on first use, found without a lock) and owns
// what the pools share: the size policy, the memory-fraction budget, pooled
// events, the statistics ledger, and the out-of-memory ladder's device-wide rungs.
//
// Invariants:
//   reserved_ == sum over pools of their reserved bytes, outside of an operation
//     that is between reserving budget and recording its segment;
//   with a memory fraction set, reserved_ <= allowed_ at all times;
//   every pool in pools_ is reachable through table_ by its stream.
// Lock order: config_mutex_ -> pool locks (in creation order) -> ledger/segment map
// / event pool mutexes. A pool lock is never held while taking another pool's.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/event_pool.hpp"
#include "engine/history.hpp"
#include "engine/size_policy.hpp"
#include "engine/stat_ledger.hpp"
#include "reservoir/allocator.hpp"

namespace reservoir::detail {

class SegmentMap;
class StreamPool;
struct Segment;

// Callbacks shared by every engine of an Allocator.
struct EngineHooks {
  std::mutex mutex;
  std::vector<FreeMemoryCallback> free_memory_callbacks;
  std::vector<OomObserver> oom_observers;
};

class DeviceEngine {
 public:
  DeviceEngine(Backend& backend, int device, const Config& config, SegmentMap& segments,
               EngineHooks& hooks);
  ~DeviceEngine();
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;

  // The pool of stream, created on first use. Lock-free once created.
  StreamPool& pool(StreamHandle stream) {
    const StreamTable* t = table_.load(std::memory_order_acquire);
    std::size_t mask = t->capacity - 1;
    for (std::size_t i = hash(stream) & mask;; i = (i + 1) & mask) {
      std::uintptr_t key = t->entries[i].key.load(std::memory_order_acquire);
      if (key == stream + 1) return *t->entries[i].pool;
      if (key == 0) return create_pool(stream);
    }
  }

  // ---- Device-wide operations (Allocator) ----
  void empty_cache();
  void set_memory_fraction(double fraction);
  double memory_fraction() const;
  std::size_t largest_cached_block();
  DeviceStats stats();
  void reset_peak_stats();
  void reset_accumulated_stats();
  // Installs a new configuration with every pool locked; apply_fraction: the update
  // set per_process_memory_fraction (else a fraction set at run time stays).
  void update_config(const Config& config, bool apply_fraction);
  // Segments of every pool with their blocks (adds a snapshot history entry).
  void snapshot(std::vector<SegmentInfo>* out);
  History& history() noexcept { return history_; }
  // Records a history entry when history or a tracker is on.
  void trace(TraceAction action, std::uintptr_t address, std::size_t size, StreamHandle stream,
             const Context& context) {
    if (history_.active())
      history_.record(
          TraceEntry{action, device_, address, size, stream, backend_.now_us(), context});
  }
  // Walks every pool. quiescent: also reconcile device-wide totals (no operation may
  // be in flight). Throws InvariantError.
  void validate(bool quiescent);

  // ---- Shared services (StreamPool) ----
  Backend& backend() noexcept { return backend_; }
  int device() const noexcept { return device_; }
  const SizePolicy& policy() const noexcept { return policy_; }
  const Config& config() const noexcept { return config_; }
  EventPool& events() noexcept { return events_; }
  StatLedger& ledger() noexcept { return ledger_; }
  SegmentMap& segments() noexcept { return segments_; }
  // Takes bytes from the memory-fraction budget; false when it would exceed it.
  bool reserve(std::size_t bytes) noexcept;
  void unreserve(std::size_t bytes) noexcept;
  std::size_t reserved() const noexcept { return reserved_.load(std::memory_order_relaxed); }
  Segment* new_segment();
  void recycle_segment(Segment* segment);
  bool has_free_memory_callbacks();
  bool run_free_memory_callbacks();
  bool gc_enabled() const noexcept { return gc_enabled_.load(std::memory_order_relaxed); }
  std::uint64_t gc_tick() noexcept { return gc_clock_.fetch_add(1, std::memory_order_relaxed) + 1; }
  std::uint64_t gc_now() const noexcept { return gc_clock_.load(std::memory_order_relaxed); }
  // Address space each new expandable segment reserves (expandable_segments_reserve,
  // else device memory plus 1/8).
  std::size_t expandable_reserve();
  // Devices granted access to this device's expandable segments.
  std::vector<int> peers();
  void add_peer(int device);
  // Age-based release of cached large blocks (garbage_collection_threshold).
  void garbage_collect();
  // The ladder's last rung: wait for every pending free, then release every free,
  // unsplit segment of every pool.
  void release_cached_everywhere();
  // Builds the out-of-memory report, tells the observers, and throws.
  [[noreturn]] void raise_out_of_memory(StreamPool& pool, std::size_t requested,
                                        std::size_t alloc_size);
  void count_retry() noexcept { num_alloc_retries_.fetch_add(1, std::memory_order_relaxed); }
  void count_device_alloc() noexcept { num_device_alloc_.fetch_add(1, std::memory_order_relaxed); }
  void count_device_free() noexcept { num_device_free_.fetch_add(1, std::memory_order_relaxed); }

 private:
  struct StreamEntry {
    std::atomic<std::uintptr_t> key{0};  // stream + 1; 0 = empty
    StreamPool* pool = nullptr;          // written before key is published
  };
  struct StreamTable {
    explicit StreamTable(std::size_t n) : capacity(n), entries(new StreamEntry[n]) {}
    std::size_t capacity;
    std::unique_ptr<StreamEntry[]> entries;
  };
  static std::size_t hash(StreamHandle s) noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(s) * 0x9E3779B97F4A7C15ull) >> 40);
  }
  StreamPool& create_pool(StreamHandle stream);
  std::vector<StreamPool*> pools_snapshot();

  Backend& backend_;
  const int device_;
  SegmentMap& segments_;
  EngineHooks& hooks_;
  Config config_;
  SizePolicy policy_;
  EventPool events_;
  StatLedger ledger_;
  History history_;

  std::atomic<std::size_t> reserved_{0};
  std::atomic<std::size_t> allowed_{~std::size_t{0}};
  std::atomic<bool> fraction_set_{false};
  std::atomic<bool> gc_enabled_{false};
  std::atomic<std::uint64_t> gc_clock_{0};
  std::atomic<std::int64_t> num_alloc_retries_{0}, num_ooms_{0}, num_sync_all_streams_{0},
      num_device_alloc_{0}, num_device_free_{0};

  std::mutex config_mutex_;  // lock-all operations
  std::mutex create_mutex_;  // pool creation, segment objects
  std::mutex ladder_mutex_;  // one device-wide release at a time
  std::atomic<StreamTable*> table_;
  std::vector<std::unique_ptr<StreamTable>> tables_;  // current and retired (readers may hold them)
  std::vector<std::unique_ptr<StreamPool>> pools_;
  std::vector<std::unique_ptr<Segment>> segment_objects_;
  std::vector<Segment*> spare_segments_;
  std::uint64_t next_serial_ = 0;
  std::vector<int> peers_;  // under create_mutex_
};

}  // namespace reservoir::detail
