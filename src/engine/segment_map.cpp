#include "engine/segment_map.hpp"

#include "engine/block.hpp"
#include "util/checks.hpp"

namespace reservoir::detail {

SegmentMap::SegmentMap() {
  for (auto& m : root_) m.store(nullptr, std::memory_order_relaxed);
}

SegmentMap::~SegmentMap() {
  for (auto& m : root_) {
    Middle* middle = m.load(std::memory_order_relaxed);
    if (!middle) continue;
    for (auto& l : middle->leaves) delete l.load(std::memory_order_relaxed);
    delete middle;
  }
}

SegmentMap::Slot* SegmentMap::slot(std::uint64_t page, bool create) {
  std::size_t top = static_cast<std::size_t>(page >> (2 * kLevelBits)) & (kFanout - 1);
  std::size_t mid = static_cast<std::size_t>(page >> kLevelBits) & (kFanout - 1);
  std::size_t low = static_cast<std::size_t>(page) & (kFanout - 1);
  if ((page >> (3 * kLevelBits)) != 0) return nullptr;  // beyond 57-bit addresses
  Middle* middle = root_[top].load(std::memory_order_acquire);
  if (!middle) {
    if (!create) return nullptr;
    middle = new Middle();
    for (auto& l : middle->leaves) l.store(nullptr, std::memory_order_relaxed);
    root_[top].store(middle, std::memory_order_release);
  }
  Leaf* leaf = middle->leaves[mid].load(std::memory_order_acquire);
  if (!leaf) {
    if (!create) return nullptr;
    leaf = new Leaf();
    middle->leaves[mid].store(leaf, std::memory_order_release);
  }
  return &leaf->slots[low];
}

Segment* SegmentMap::find(std::uintptr_t address) const noexcept {
  std::uint64_t page = static_cast<std::uint64_t>(address) >> kPageBits;
  if ((page >> (3 * kLevelBits)) != 0) return nullptr;
  const Middle* middle =
      root_[(page >> (2 * kLevelBits)) & (kFanout - 1)].load(std::memory_order_acquire);
  if (!middle) return nullptr;
  const Leaf* leaf =
      middle->leaves[(page >> kLevelBits) & (kFanout - 1)].load(std::memory_order_acquire);
  if (!leaf) return nullptr;
  const Slot& s = leaf->slots[page & (kFanout - 1)];
  for (Segment* seg :
       {s.first.load(std::memory_order_acquire), s.second.load(std::memory_order_acquire)}) {
    if (seg && seg->holds(address)) return seg;
  }
  return nullptr;
}

void SegmentMap::insert(Segment* segment) {
  insert(segment, segment->base, segment->size);
}

void SegmentMap::erase(Segment* segment) {
  erase(segment, segment->base, segment->size);
}

void SegmentMap::insert(Segment* segment, std::uintptr_t address, std::size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> guard(write_mutex_);
  std::uint64_t first = address >> kPageBits;
  std::uint64_t last = (address + bytes - 1) >> kPageBits;
  for (std::uint64_t page = first; page <= last; ++page) {
    Slot* s = slot(page, true);
    RESERVOIR_CHECK(s != nullptr, "segment address beyond 57 bits");
    // Entries never move between the two places, so a concurrent reader cannot
    // miss a segment that stays registered.
    if (s->first.load(std::memory_order_relaxed) == nullptr) {
      s->first.store(segment, std::memory_order_release);
    } else {
      RESERVOIR_CHECK(s->second.load(std::memory_order_relaxed) == nullptr,
                      "three segments share one 2 MiB page");
      s->second.store(segment, std::memory_order_release);
    }
  }
}

void SegmentMap::erase(Segment* segment, std::uintptr_t address, std::size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> guard(write_mutex_);
  std::uint64_t first = address >> kPageBits;
  std::uint64_t last = (address + bytes - 1) >> kPageBits;
  for (std::uint64_t page = first; page <= last; ++page) {
    Slot* s = slot(page, false);
    if (!s) continue;
    if (s->first.load(std::memory_order_relaxed) == segment)
      s->first.store(nullptr, std::memory_order_release);
    else if (s->second.load(std::memory_order_relaxed) == segment)
      s->second.store(nullptr, std::memory_order_release);
  }
}

}  // namespace reservoir::detail
