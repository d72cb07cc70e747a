// SegmentMap: address -> Segment for every live segment of every device, read
// without locks so that deallocate() finds the owning stream pool (and device) of a
// pointer before taking exactly one lock.
//
// A three-level radix tree over 2 MiB pages of a 57-bit address space. Each page
// slot holds up to two segments (a segment need not start on a page boundary, so a
// page can straddle the end of one and the start of the next).
// Invariant: for every registered segment S and address a in [S.base, S.base+S.size),
// find(a) == S. sole_owner() == the owner of every segment ever registered while they
// all had one and the same owner and it is alive, else nullptr.
// A free needs no lookup while sole_owner() names an owner: a pointer handed out by
// another owner was handed out after that owner's first segment was registered,
// which cleared sole_ (under write_mutex_, before the pointer existed), so its free
// sees nullptr; the sole owner refuses a pointer it did not hand out.
// Nodes are never freed before the map, so concurrent readers are safe; writers
// (segment creation and release) serialize on a mutex.
// Owner hints: each thread keeps, per 2 MiB page slot (kOwnerHints of them, by the
// page number's low bits), the range and owner of the last segment a free of its found
// there (OwnerHint), with the map's generation then: a thread taking turns between a
// few streams frees into a few segments, each found by its own hint. generation() moves to a value
// no map has used before at every erase and every owner's end, so while it is
// unchanged the hinted segment is still registered to that owner, alive: a free in its
// range asks the owner directly (which still refuses a pointer it did not hand out).
// Invariant: a hint whose generation equals generation() names a registered segment's
// [base, base + size) and its owner.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "engine/books/block.hpp"
#include "util/compiler.hpp"

namespace reservoir::detail {

// A thread's last segment found for a free in a page slot (see above); generation 0:
// none.
struct OwnerHint {
  std::uint64_t generation = 0;
  std::uintptr_t base = 0;
  std::size_t size = 0;
  BlockOwner* owner = nullptr;
};
constexpr std::size_t kOwnerHints = 8;
struct OwnerHints {
  OwnerHint slot[kOwnerHints];
  static std::size_t of(std::uintptr_t address) noexcept {
    return static_cast<std::size_t>(address >> 21) & (kOwnerHints - 1);
  }
};
// Constant-initialized: an access is a thread-pointer offset, no initialization check.
extern constinit thread_local OwnerHints tls_owner_hints;

class SegmentMap {
 public:
  SegmentMap();
  ~SegmentMap();
  SegmentMap(const SegmentMap&) = delete;
  SegmentMap& operator=(const SegmentMap&) = delete;

  // The live segment containing address, or nullptr. Inline: every free starts here.
  Segment* find(std::uintptr_t address) const noexcept {
    const std::uint64_t page = static_cast<std::uint64_t>(address) >> kPageBits;
    if (RESERVOIR_UNLIKELY((page >> (3 * kLevelBits)) != 0)) return nullptr;
    const Middle* middle =
        root_[(page >> (2 * kLevelBits)) & (kFanout - 1)].load(std::memory_order_acquire);
    if (RESERVOIR_UNLIKELY(!middle)) return nullptr;
    const Leaf* leaf =
        middle->leaves[(page >> kLevelBits) & (kFanout - 1)].load(std::memory_order_acquire);
    if (RESERVOIR_UNLIKELY(!leaf)) return nullptr;
    const Slot& s = leaf->slots[page & (kFanout - 1)];
    if (Segment* seg = s.first.load(std::memory_order_acquire); seg && seg->holds(address))
      return seg;
    Segment* seg = s.second.load(std::memory_order_acquire);
    return seg && seg->holds(address) ? seg : nullptr;
  }
  // The owner of every segment so far while there has been one owner (see above).
  BlockOwner* sole_owner() const noexcept { return sole_.load(std::memory_order_acquire); }
  // Moves at every erase and owner's end (see above).
  std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }
  // The owner of this thread's hint when address lies in its segment and generation
  // (read before) is the hint's, else nullptr.
  static BlockOwner* hinted_owner(std::uint64_t generation, std::uintptr_t address) noexcept {
    const OwnerHint& h = tls_owner_hints.slot[OwnerHints::of(address)];
    return h.generation == generation && address - h.base < h.size ? h.owner : nullptr;
  }
  // Records segment (found under generation, read before the lookup) and its owner as
  // this thread's hint. Another thread may be recycling the segment object meanwhile
  // (it was erased, so generation() has moved on): its range is read atomically, and
  // a range of the object's next use, read with acquire, makes this thread's later
  // generation() reads see that move, so such a hint never matches.
  // address: the freed pointer (its page slot keeps the hint).
  static void remember(std::uint64_t generation, std::uintptr_t address, const Segment* segment,
                       BlockOwner* owner) noexcept {
    tls_owner_hints.slot[OwnerHints::of(address)] = {generation, segment->base_now(),
                                                     segment->size_now(), owner};
  }
  // owner is going away: it is no longer the sole owner (nor will any be).
  void owner_gone(BlockOwner* owner);
  // pre: segment's range overlaps no registered segment, segment->owner is set.
  void insert(Segment* segment);
  void erase(Segment* segment);
  // The same for the part [address, address + bytes) of segment's range: a segment
  // whose range is far larger than what it uses (a policy:compact arena) is
  // registered as its use grows, and find() answers for the registered part.
  void insert(Segment* segment, std::uintptr_t address, std::size_t bytes);
  void erase(Segment* segment, std::uintptr_t address, std::size_t bytes);

 private:
  static constexpr int kPageBits = 21;
  static constexpr int kLevelBits = 12;
  static constexpr std::size_t kFanout = std::size_t{1} << kLevelBits;
  struct Slot {
    std::atomic<Segment*> first{nullptr};
    std::atomic<Segment*> second{nullptr};
  };
  struct Leaf {
    Slot slots[kFanout];
  };
  struct Middle {
    std::atomic<Leaf*> leaves[kFanout];
  };

  Slot* slot(std::uint64_t page, bool create);

  std::atomic<Middle*> root_[kFanout];
  std::mutex write_mutex_;
  std::atomic<BlockOwner*> sole_{nullptr};
  bool owners_differ_ = false;  // under write_mutex_: sole_ stays nullptr for good
  std::atomic<std::uint64_t> generation_;
  void next_generation();  // under write_mutex_
};

}  // namespace reservoir::detail
