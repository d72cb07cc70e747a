// AllocatedStripes: policy:compact's allocated blocks by address, in stripes that each
// have their own lock, so that a free finds its block without the device-wide pool
// lock (threads freeing different blocks rarely meet on one stripe).
//
// Invariants (the pool's validator, under every stripe's lock): each allocated block
// that no stream cache holds is in exactly one stripe, the one its address hashes to;
// size() == the number of such blocks.
// Locking: a stripe's lock is the innermost of the pool's locks (device pool lock ->
// stream caches -> stripe); nothing else is taken while one is held.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "engine/books/block.hpp"
#include "util/address_map.hpp"
#include "util/lock.hpp"

namespace reservoir::detail {

class AllocatedStripes {
 public:
  // Threads freeing their own blocks meet on a stripe rarely: 8 threads share one
  // about a tenth of the time.
  static constexpr std::size_t kStripes = 256;

  Block* find(std::uintptr_t address) {
    Stripe& s = of(address);
    std::lock_guard<Lock> guard(s.lock);
    return s.map.find(address);
  }
  void insert(std::uintptr_t address, Block* b) {
    Stripe& s = of(address);
    std::lock_guard<Lock> guard(s.lock);
    s.map.insert(address, b);
  }
  // The block at address, taken out; nullptr when none is allocated there.
  Block* erase(std::uintptr_t address) {
    Stripe& s = of(address);
    std::lock_guard<Lock> guard(s.lock);
    return s.map.erase(address);
  }

  // f(map) with address's stripe locked (its map holds the blocks of that stripe).
  template <typename F>
  auto with_stripe(std::uintptr_t address, F&& f) {
    Stripe& s = of(address);
    std::lock_guard<Lock> guard(s.lock);
    return f(s.map);
  }

  // Every stripe locked, for walks that must see one consistent state (the validator).
  class AllLocked {
   public:
    explicit AllLocked(AllocatedStripes& s) : s_(s) {
      for (Stripe& x : s_.stripes_) x.lock.lock();
    }
    ~AllLocked() {
      for (Stripe& x : s_.stripes_) x.lock.unlock();
    }
    AllLocked(const AllLocked&) = delete;
    AllLocked& operator=(const AllLocked&) = delete;
    Block* find(std::uintptr_t address) const { return s_.of(address).map.find(address); }
    std::size_t size() const {
      std::size_t n = 0;
      for (const Stripe& x : s_.stripes_) n += x.map.size();
      return n;
    }

   private:
    AllocatedStripes& s_;
  };

  // Each block (address, Block*), each stripe locked in turn (sums, not a snapshot).
  template <typename F>
  void for_each(F&& f) {
    for (Stripe& x : stripes_) {
      std::lock_guard<Lock> guard(x.lock);
      x.map.for_each(f);
    }
  }

 private:
  struct alignas(64) Stripe {
    Lock lock;
    AddressMap<Block> map;
  };
  // Blocks are at least 512 bytes apart: the bits above those pick the stripe, mixed
  // by another multiplier than AddressMap's (with its own, a stripe's keys would share
  // the top bits that pick their home slot: one probe run).
  Stripe& of(std::uintptr_t address) {
    const std::uint64_t h = (static_cast<std::uint64_t>(address) >> 9) * 0xFF51AFD7ED558CCDull;
    return stripes_[static_cast<std::size_t>(h >> 56)];
  }
  std::array<Stripe, kStripes> stripes_;
};

}  // namespace reservoir::detail
