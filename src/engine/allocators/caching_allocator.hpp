// CachingAllocator: the engine as a whole — every device's DeviceEngine (made on
// first use), the process-wide SegmentMap that resolves a pointer to the pool owning
// it, the hooks, the configuration in force and the history settings that engines
// made later must also get. It owns the free path's lookup-and-retry protocol, so
// the front only validates arguments, routes and translates errors.
//
// Lookup protocol (deallocate, record_stream, block queries): the SegmentMap is read
// without a lock and may return a segment that another thread released and reused
// meanwhile; a refusal by the owner is therefore checked against a fresh lookup, and
// only when that names the same owner is the pointer really invalid.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/allocators/memory_resource.hpp"
#include "engine/books/block.hpp"
#include "engine/books/block_owner.hpp"
#include "engine/books/segment_map.hpp"
#include "engine/device/device_engine.hpp"
#include "engine/ipc/ipc_handle.hpp"
#include "reservoir/backend.hpp"
#include "reservoir/config.hpp"
#include "reservoir/history.hpp"

namespace reservoir::detail {

class CachingAllocator final : public BlockResource {
 public:
  CachingAllocator(Backend& backend, Config config, int device_count);
  ~CachingAllocator() override;

  // ---- Requests (MemoryResource); the hot two are inline ----
  RESERVOIR_INLINE void* allocate(std::size_t size, StreamHandle stream, int device) override {
    return reinterpret_cast<void*>(engine(device).allocate(size, stream));
  }
  void deallocate(void* ptr) override {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    // One owner so far (one stream, one device, no private pool): no lookup.
    if (BlockOwner* sole = segments_.sole_owner()) {
      if (sole->free(address)) return;
      return free_slow(ptr);
    }
    free_routed(ptr);
  }
  void record_stream(void* ptr, StreamHandle stream) override;
  void notify_host_wait(StreamHandle stream, int device) override;
  void release_stream(StreamHandle stream, int device) override;
  BaseAllocation base_allocation(void* ptr) override;
  std::size_t block_size(void* ptr) override;
  std::size_t requested_size(void* ptr) override;
  void empty_cache(int device) override;  // -1: every device in use
  std::size_t largest_cached_block(int device) override;
  const EngineTraits& traits() const override;
  // The allocated block at ptr, as IPC shares it (throws InvalidPointerError).
  SharedBlock share(void* ptr);

  // ---- Engines ----
  // The engine of a valid device index, made on first use.
  DeviceEngine& engine(int device) {
    DeviceEngine* e = slot(device).load(std::memory_order_acquire);
    return e ? *e : make_engine(device);
  }
  DeviceEngine* engine_if_made(int device) const {
    return slot(device).load(std::memory_order_acquire);
  }
  int device_count() const noexcept { return device_count_; }
  EngineHooks& hooks() noexcept { return hooks_; }
  void add_free_memory_callback(FreeMemoryCallback callback);
  void attach_oom_observer(OomObserver observer);

  // ---- Configuration ----
  Config config() const;
  // Applies "key:value,..." to every engine (throws ConfigError, changing nothing);
  // returns the configuration now in force. merge: on top of the settings in force
  // (Config::apply); torch_settings: as torch.cuda.memory._set_allocator_settings
  // (Config::apply_settings).
  enum class ConfigUpdate { merge, torch_settings };
  Config update_config(std::string_view text, ConfigUpdate how = ConfigUpdate::merge);

  // ---- History (kept per engine; settings apply to engines made later too) ----
  void record_history(bool enabled, std::size_t max_entries, ContextLevel level,
                      ContextRecorder recorder);
  void attach_trace_tracker(TraceTracker tracker);
  // false when history is off (the annotation is dropped).
  bool record_annotation(Annotation annotation);
  std::vector<Annotation> annotations() const;

  void validate();

  // ---- Tags (docs/sleep.md) ----
  // A tag scope opened (true) or closed (false) on some thread: while any is open,
  // every engine's requests read their thread's tag (DeviceEngine::set_tagging).
  void tag_scope(bool open);

 private:
  // Several owners: this thread's last segment, then the map (remembered for the
  // next free); out of line, so that the one-owner path stays short.
  void free_routed(void* ptr);
  void free_slow(void* ptr);  // the lookup protocol, after the fast path was refused
  template <typename Op>
  void retry(void* ptr, const char* action, Op&& op);
  BlockOwner& owner_of(void* ptr, const char* action);
  DeviceEngine& make_engine(int device);
  // Where device's engine is published: the first devices' slots live in this object
  // (a request loads its engine without first loading an array's address).
  std::atomic<DeviceEngine*>& slot(int device) const {
    if (RESERVOIR_LIKELY(device < kNearDevices)) return near_[device];
    return far_[device - kNearDevices];
  }
  static constexpr int kNearDevices = 16;

  Backend& backend_;
  const int device_count_;
  SegmentMap segments_;
  EngineHooks hooks_;
  mutable std::atomic<DeviceEngine*> near_[kNearDevices] = {};
  std::unique_ptr<std::atomic<DeviceEngine*>[]> far_;  // devices kNearDevices and up
  std::vector<std::unique_ptr<DeviceEngine>> owned_;   // under engines_mutex_
  mutable std::mutex engines_mutex_;
  mutable std::mutex config_mutex_;
  Config config_;
  // History settings, applied to engines made later too (under engines_mutex_).
  bool history_enabled_ = false;
  std::size_t history_entries_ = 1;
  ContextLevel history_level_ = ContextLevel::none;
  ContextRecorder history_recorder_;
  std::vector<TraceTracker> trackers_;
  mutable std::mutex annotations_mutex_;
  std::deque<Annotation> annotations_;  // oldest first, at most history_entries_
  int tag_scopes_ = 0;                  // under engines_mutex_: open tag scopes (tag_scope)
};

}  // namespace reservoir::detail
