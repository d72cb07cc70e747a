#include "engine/allocators/uncached_allocator.hpp"

#include "engine/device/oom_report.hpp"
#include "reservoir/errors.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

UncachedAllocator::UncachedAllocator(Backend& backend, CachingAllocator& engines)
    : backend_(backend), engines_(engines) {
  shards_.resize(static_cast<std::size_t>(engines.device_count() > 0 ? engines.device_count() : 1));
}

UncachedAllocator::~UncachedAllocator() {
  // Teardown: give back what the program still holds.
  for (auto& [address, l] : live_)
    (void)backend_.deallocate(l.device, reinterpret_cast<void*>(address), l.size);
}

ShardCounters& UncachedAllocator::shard(int device) {
  auto& s = shards_[static_cast<std::size_t>(device)];
  if (!s) {
    s = std::make_unique<ShardCounters>();
    engines_.engine(device).ledger().attach(s.get());
  }
  return *s;
}

void* UncachedAllocator::allocate(std::size_t size, StreamHandle stream, int device) {
  void* ptr = nullptr;
  DeviceStatus st = backend_.allocate(device, size, &ptr);
  if (st == DeviceStatus::out_of_memory) {
    MemoryInfo info;
    std::string memory = backend_.memory_info(device, &info) == DeviceStatus::ok
                             ? " has a total capacity of " + format_size_pytorch_style(info.total) +
                                   " of which " + format_size_pytorch_style(info.free) + " is free."
                             : " did not report its memory.";
    DeviceCounters::bump(engines_.engine(device).counters().ooms);
    throw OutOfMemoryError("CUDA out of memory. Tried to allocate " +
                           format_size_pytorch_style(size) + ". GPU " + std::to_string(device) +
                           memory + " " + process_memory_sentences(backend_, device) +
                           "Reservoir is in uncached mode (RESERVOIR_NO_CACHING=1): "
                           "the device itself refused the request on stream " +
                           format_pointer(reinterpret_cast<void*>(stream)) + ".");
  }
  if (st != DeviceStatus::ok)
    throw DeviceError("reservoir: allocating " + format_size(size) + " on device " +
                      std::to_string(device) + " (uncached mode) failed: " + backend_.last_error());
  std::lock_guard<std::mutex> guard(mutex_);
  live_[reinterpret_cast<std::uintptr_t>(ptr)] = Live{size, device};
  DeviceEngine& e = engines_.engine(device);
  ShardScope s(shard(device));
  const int pool = SizePolicy::pool_for(size);  // the pool it would use when cached
  const auto bytes = static_cast<std::int64_t>(size);
  s->on_allocate(pool, bytes, bytes);
  s->add<kSegment>(pool, 1);
  s->add<kReservedBytes>(pool, bytes);
  DeviceCounters::bump(e.counters().device_allocs);
  return ptr;
}

const UncachedAllocator::Live& UncachedAllocator::live(void* ptr, const char* action) {
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == live_.end())
    throw InvalidPointerError(
        std::string("reservoir: cannot ") + action + " " + format_pointer(ptr) +
        ": it is not a live allocation (uncached mode: RESERVOIR_NO_CACHING=1)");
  return it->second;
}

void UncachedAllocator::deallocate(void* ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  const Live l = live(ptr, "free");
  if (backend_.deallocate(l.device, ptr, l.size) != DeviceStatus::ok)
    throw DeviceError("reservoir: freeing " + format_pointer(ptr) +
                      " (uncached mode) failed: " + backend_.last_error());
  live_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  ShardScope s(shard(l.device));
  const int pool = SizePolicy::pool_for(l.size);
  const auto bytes = static_cast<std::int64_t>(l.size);
  s->on_free(pool, bytes, bytes);
  s->add<kSegment>(pool, -1);
  s->add<kReservedBytes>(pool, -bytes);
  DeviceCounters::bump(engines_.engine(l.device).counters().device_frees);
}

void UncachedAllocator::record_stream(void* ptr, StreamHandle) {
  std::lock_guard<std::mutex> guard(mutex_);
  (void)live(ptr, "record a stream use of");
}

BaseAllocation UncachedAllocator::base_allocation(void* ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  return BaseAllocation{ptr, live(ptr, "find the segment of").size};
}

std::size_t UncachedAllocator::block_size(void* ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  return live(ptr, "size").size;
}

const EngineTraits& UncachedAllocator::traits() const {
  static const EngineTraits kUncached{
      "uncached", false, "uncached mode (RESERVOIR_NO_CACHING=1) does not share memory",
      "reservoir: private pools need the caching allocator (RESERVOIR_NO_CACHING=1 is set): CUDA "
      "graphs and memory pools cannot run uncached"};
  return kUncached;
}

}  // namespace reservoir::detail
