// SizePolicy: how requests become block sizes, which pool serves them, how large a
// new segment is, and when a block is split — the rules of the spec's native
// allocator, read from Config. Immutable; a config change installs a new one while
// every stream pool is locked.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "reservoir/config.hpp"

namespace reservoir::detail {

// The two pools of every cache: blocks of requests up to 1 MiB live in 2 MiB
// segments (small), the rest in larger ones (large). Also the index of per-pool
// arrays (free sets, statistics).
enum PoolIndex : std::uint8_t { kSmallPool = 0, kLargePool = 1 };
inline constexpr int kPoolCount = 2;

class SizePolicy {
 public:
  static constexpr std::size_t kMinBlockSize = 512;         // every size rounds to 512 B
  static constexpr std::size_t kSmallSize = 1u << 20;       // largest small request: 1 MiB
  static constexpr std::size_t kSmallBuffer = 2u << 20;     // small segments: 2 MiB
  static constexpr std::size_t kMinLargeAlloc = 10u << 20;  // 1-10 MiB share 20 MiB segments
  static constexpr std::size_t kLargeBuffer = 20u << 20;
  static constexpr std::size_t kRoundLarge = 2u << 20;  // larger segments: 2 MiB multiples

  explicit SizePolicy(const Config& config)
      : max_split_size_(config.max_split_size),
        max_non_split_rounding_(config.max_non_split_rounding_size),
        divisions_(config.roundup_power2_divisions),
        expandable_(config.expandable_segments) {
    for (std::size_t d : divisions_) any_divisions_ |= d > 1;
  }

  // The block size for a request of size bytes (size > 0).
  std::size_t round(std::size_t size) const noexcept {
    if (size < kMinBlockSize) return kMinBlockSize;
    if (!any_divisions_) return (size + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
    std::size_t divisions = divisions_for(size);
    if (divisions > 1 && size > kMinBlockSize * divisions)
      return round_to_power2_division(size, divisions);
    return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
  }

  static bool is_small(std::size_t rounded) noexcept { return rounded <= kSmallSize; }
  static PoolIndex pool_for(std::size_t rounded) noexcept {
    return rounded <= kSmallSize ? kSmallPool : kLargePool;
  }

  // Size of the device allocation made for a block of rounded bytes.
  static std::size_t segment_size(std::size_t rounded) noexcept {
    if (rounded <= kSmallSize) return kSmallBuffer;
    if (rounded < kMinLargeAlloc) return kLargeBuffer;
    return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
  }

  // Whether serving size bytes from a free block of block_size leaves a remainder
  // worth keeping as a block of its own.
  // vmm: the pool's segments are expandable whatever the settings (a tagged pool's).
  bool should_split(PoolIndex pool, std::size_t block_size, std::size_t size,
                    bool vmm = false) const noexcept {
    std::size_t remaining = block_size - size;
    if (pool == kSmallPool || expandable_ || vmm) return remaining >= kMinBlockSize;
    return size < max_split_size_ && remaining > kSmallSize;
  }

  // Whether a free block of block_size may serve a request of size (oversize rules:
  // blocks >= max_split_size serve only requests that are themselves oversize and
  // within max_non_split_rounding of the block).
  bool may_serve(std::size_t block_size, std::size_t size) const noexcept {
    if (size < max_split_size_ && block_size >= max_split_size_) return false;
    if (size >= max_split_size_ && block_size >= size + max_non_split_rounding_) return false;
    return true;
  }

  std::size_t max_split_size() const noexcept { return max_split_size_; }
  bool has_max_split_size() const noexcept { return max_split_size_ != ~std::size_t{0}; }
  bool expandable() const noexcept { return expandable_; }

  // Rounds size up to the next of `divisions` equal steps between the powers of two
  // around it (1200 with 4 divisions -> 1280).
  static std::size_t round_to_power2_division(std::size_t size, std::size_t divisions) noexcept {
    if ((size & (size - 1)) == 0) return size;
    std::size_t floor = std::size_t{1} << (63 - __builtin_clzll(size));
    std::size_t step = floor >> (63 - __builtin_clzll(divisions));
    if (step == 0) return floor << 1;
    std::size_t rounded = size & ~(step - 1);
    return rounded == size ? size : rounded + step;
  }

 private:
  std::size_t divisions_for(std::size_t size) const noexcept {
    int log2 = 63 - __builtin_clzll(size | 1);
    int index = log2 > 20 ? log2 - 20 : 0;
    if (index >= static_cast<int>(kRoundupIntervals)) index = kRoundupIntervals - 1;
    return divisions_[static_cast<std::size_t>(index)];
  }

  std::size_t max_split_size_;
  std::size_t max_non_split_rounding_;
  std::array<std::size_t, kRoundupIntervals> divisions_;
  bool expandable_;
  bool any_divisions_ = false;  // else round() is plain 512-byte rounding
};

}  // namespace reservoir::detail
