// Lock: a mutex for short critical sections (the per-stream pools). The uncontended
// path is one compare-exchange to lock and one exchange to unlock; under contention
// it spins briefly, then sleeps on a futex, so a holder blocked in a device call
// does not burn the waiters' CPUs.
//
// State: 0 = unlocked, 1 = locked, 2 = locked and a thread may be sleeping.
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
    if (__builtin_expect(state_.exchange(0, std::memory_order_release) == 2, 0)) wake();
  }

 private:
  void lock_slow() noexcept;
  void wake() noexcept;
  std::atomic<std::uint32_t> state_{0};
};

}  // namespace reservoir::detail
