#include "util/lock.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

namespace reservoir::detail {

namespace {
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t value) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, nullptr,
          nullptr, 0);
}
void futex_wake_one(std::atomic<std::uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE_PRIVATE, 1, nullptr,
          nullptr, 0);
}
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

void Lock::lock_slow() noexcept {
  // Spin a little: critical sections are tens of nanoseconds.
  for (int i = 0; i < 100; ++i) {
    std::uint32_t expected = 0;
    if (state_.load(std::memory_order_relaxed) == 0 &&
        state_.compare_exchange_weak(expected, 1, std::memory_order_acquire,
                                     std::memory_order_relaxed))
      return;
    cpu_relax();
  }
  // Announce a sleeper (state 2) and sleep until the holder wakes us.
  while (state_.exchange(2, std::memory_order_acquire) != 0) futex_wait(&state_, 2);
}

void Lock::wake() noexcept {
  futex_wake_one(&state_);
}

}  // namespace reservoir::detail
