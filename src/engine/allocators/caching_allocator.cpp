#include "engine/allocators/caching_allocator.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

CachingAllocator::CachingAllocator(Backend& backend, Config config, int device_count)
    : backend_(backend), device_count_(device_count), config_(std::move(config)) {
  if (device_count > kNearDevices) {
    far_ = std::make_unique<std::atomic<DeviceEngine*>[]>(device_count - kNearDevices);
    for (int i = 0; i < device_count - kNearDevices; ++i) far_[i].store(nullptr);
  }
}

CachingAllocator::~CachingAllocator() {
  owned_.clear();  // engines return their segments before the segment map goes
}

DeviceEngine& CachingAllocator::make_engine(int device) {
  std::lock_guard<std::mutex> guard(engines_mutex_);
  if (DeviceEngine* e = slot(device).load(std::memory_order_relaxed)) return *e;
  owned_.push_back(std::make_unique<DeviceEngine>(backend_, device, config(), segments_, hooks_));
  DeviceEngine* e = owned_.back().get();
  e->history().configure(history_enabled_, history_entries_, history_level_, history_recorder_);
  for (auto& t : trackers_) e->history().add_tracker(t);
  if (tag_scopes_ > 0) e->set_tagging(true);
  slot(device).store(e, std::memory_order_release);
  return *e;
}

void CachingAllocator::tag_scope(bool open) {
  std::lock_guard<std::mutex> guard(engines_mutex_);
  RESERVOIR_ASSERT(open || tag_scopes_ > 0);
  tag_scopes_ += open ? 1 : -1;
  if (tag_scopes_ == (open ? 1 : 0))
    for (auto& e : owned_) e->set_tagging(open);
}

// ---------------------------------------------------------------- the lookup protocol

BlockOwner& CachingAllocator::owner_of(void* ptr, const char* action) {
  Segment* seg = segments_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (!seg)
    throw InvalidPointerError(std::string("reservoir: cannot ") + action + " " +
                              format_pointer(ptr) +
                              ": no Reservoir segment contains it (it was not allocated by "
                              "this allocator, or its memory was already returned)");
  BlockOwner* owner = seg->owner_now();
  if (!owner)  // released and being reused right now
    throw InvalidPointerError(std::string("reservoir: cannot ") + action + " " +
                              format_pointer(ptr) + ": its segment was just released");
  return *owner;
}

template <typename Op>
void CachingAllocator::retry(void* ptr, const char* action, Op&& op) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  BlockOwner* owner = &owner_of(ptr, action);
  for (int attempt = 0;; ++attempt) {
    if (op(*owner)) return;
    BlockOwner* again = &owner_of(ptr, action);
    if (again == owner || attempt == 3)
      throw InvalidPointerError(std::string("reservoir: cannot ") + action + " " +
                                format_pointer(ptr) + ": " + again->explain_not_allocated(address));
    owner = again;
  }
}

void CachingAllocator::free_routed(void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uint64_t generation = segments_.generation();  // before the lookup
  if (BlockOwner* hinted = SegmentMap::hinted_owner(generation, address)) {
    if (hinted->free(address)) return;
  } else if (Segment* seg = segments_.find(address)) {
    if (BlockOwner* owner = seg->owner_now(); owner && owner->free(address)) {
      SegmentMap::remember(generation, address, seg, owner);
      return;
    }
  }
  free_slow(ptr);
}

void CachingAllocator::free_slow(void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  retry(ptr, "free", [address](BlockOwner& o) { return o.free(address); });
}

void CachingAllocator::record_stream(void* ptr, StreamHandle stream) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  retry(ptr, "record a stream use of",
        [&](BlockOwner& o) { return o.record_use(address, stream); });
}

void CachingAllocator::release_stream(StreamHandle stream, int device) {
  engine(device).release_stream(stream);
}

void CachingAllocator::notify_host_wait(StreamHandle stream, int device) {
  engine(device).host_waited(stream);
}

BaseAllocation CachingAllocator::base_allocation(void* ptr) {
  BaseAllocation out;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  retry(ptr, "find the segment of", [&](BlockOwner& o) { return o.segment_of(address, &out); });
  return out;
}

std::size_t CachingAllocator::block_size(void* ptr) {
  std::size_t size = 0;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  retry(ptr, "size", [&](BlockOwner& o) { return o.block_sizes(address, &size, nullptr); });
  return size;
}

std::size_t CachingAllocator::requested_size(void* ptr) {
  std::size_t requested = 0;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  retry(ptr, "size", [&](BlockOwner& o) { return o.block_sizes(address, nullptr, &requested); });
  return requested;
}

SharedBlock CachingAllocator::share(void* ptr) {
  SharedBlock out;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  retry(ptr, "share", [&](BlockOwner& o) { return o.share(address, &out); });
  return out;
}

void CachingAllocator::empty_cache(int device) {
  for (int d = 0; d < device_count_; ++d)
    if (device < 0 || d == device)
      if (DeviceEngine* e = engine_if_made(d)) e->empty_cache();
}

const EngineTraits& CachingAllocator::traits() const {
  static const EngineTraits kNative{"native", true, {}, {}};
  return kNative;
}

std::size_t CachingAllocator::largest_cached_block(int device) {
  return engine(device).largest_cached_block();
}

// ---------------------------------------------------------------- hooks and settings

void CachingAllocator::add_free_memory_callback(FreeMemoryCallback callback) {
  std::lock_guard<std::mutex> guard(hooks_.mutex);
  hooks_.free_memory_callbacks.push_back(std::move(callback));
  hooks_.has_callbacks.store(true, std::memory_order_release);
}

void CachingAllocator::attach_oom_observer(OomObserver observer) {
  std::lock_guard<std::mutex> guard(hooks_.mutex);
  hooks_.oom_observers.push_back(std::move(observer));
}

Config CachingAllocator::config() const {
  std::lock_guard<std::mutex> guard(config_mutex_);
  return config_;
}

Config CachingAllocator::update_config(std::string_view text, ConfigUpdate how) {
  Config next = config();
  // Both throw ConfigError, leaving everything unchanged.
  if (how == ConfigUpdate::torch_settings)
    next.apply_settings(text);
  else
    next.apply(text);
  // Only an update that names the key changes a memory fraction set at run time.
  const bool sets_fraction = Config::parse(text).per_process_memory_fraction_set;
  {
    std::lock_guard<std::mutex> guard(engines_mutex_);
    for (auto& e : owned_) e->update_config(next, sets_fraction);
    std::lock_guard<std::mutex> cg(config_mutex_);
    config_ = next;
  }
  return next;
}

void CachingAllocator::record_history(bool enabled, std::size_t max_entries, ContextLevel level,
                                      ContextRecorder recorder) {
  std::lock_guard<std::mutex> guard(engines_mutex_);
  history_enabled_ = enabled;
  history_entries_ = max_entries;
  history_level_ = level;
  {
    std::lock_guard<std::mutex> ag(annotations_mutex_);
    if (!enabled) annotations_.clear();
  }
  for (auto& e : owned_) e->history().configure(enabled, max_entries, level, recorder);
  history_recorder_ = std::move(recorder);
}

void CachingAllocator::attach_trace_tracker(TraceTracker tracker) {
  std::lock_guard<std::mutex> guard(engines_mutex_);
  for (auto& e : owned_) e->history().add_tracker(tracker);
  trackers_.push_back(std::move(tracker));
}

bool CachingAllocator::record_annotation(Annotation annotation) {
  std::size_t limit;
  {
    std::lock_guard<std::mutex> guard(engines_mutex_);
    if (!history_enabled_) return false;
    limit = history_entries_;
  }
  std::lock_guard<std::mutex> ag(annotations_mutex_);
  if (annotations_.size() >= limit) annotations_.pop_front();
  annotations_.push_back(std::move(annotation));
  return true;
}

std::vector<Annotation> CachingAllocator::annotations() const {
  std::lock_guard<std::mutex> ag(annotations_mutex_);
  return {annotations_.begin(), annotations_.end()};
}

void CachingAllocator::validate() {
  std::lock_guard<std::mutex> guard(engines_mutex_);
  for (auto& e : owned_) e->validate();
}

}  // namespace reservoir::detail
