// Lock: a mutex for short critical sections (the per-stream pools). The uncontended
// path is one compare-exchange to lock and a plain store to unlock (a pair of locked
// read-modify-writes costs about as much as the rest of a cache hit); under
// contention it spins briefly, then sleeps on a futex, so a holder blocked in a
// device call does not burn the waiters' CPUs.
//
// State: state_ 0 = unlocked, 1 = locked; waiters_ = threads in the sleeping part of
// lock_slow(). unlock() stores 0, then reads waiters_ with no fence between the two,
// so it can miss a waiter that announced itself at that very moment: every sleep is
// therefore bounded (Lock::kSleepMicros) and rechecks the lock, and a missed wake
// costs at most that, never a hang.
#pragma once

#include <atomic>
#include <cstdint>

namespace reservoir::detail {

class Lock {
 public:
  void lock() noexcept {
    std::uint32_t expected = 0;
    if (__builtin_expect(state_.compare_exchange_strong(expected, 1, std::memory_order_acquire,
                                                        std::memory_order_relaxed),
                         1))
      return;
    lock_slow();
  }
  bool try_lock() noexcept {
    std::uint32_t expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }
  void unlock() noexcept {
    state_.store(0, std::memory_order_release);
    if (__builtin_expect(waiters_.load(std::memory_order_relaxed) != 0, 0)) wake();
  }

  // The longest sleep in lock_slow() before the lock is tried again.
  static constexpr long kSleepMicros = 200;

 private:
  void lock_slow() noexcept;
  void wake() noexcept;
  std::atomic<std::uint32_t> state_{0};
  std::atomic<std::uint32_t> waiters_{0};
};

}  // namespace reservoir::detail
