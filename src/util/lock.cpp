#include "util/lock.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace reservoir::detail {

namespace {
// Sleeps while *word == value, at most kSleepMicros.
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t value) {
  timespec timeout{0, Lock::kSleepMicros * 1000};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, &timeout,
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
  // Announce a sleeper, then sleep until a holder wakes us (or the bounded sleep ends).
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  for (;;) {
    std::uint32_t expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire,
                                       std::memory_order_relaxed))
      break;
    futex_wait(&state_, 1);
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);
}

void Lock::wake() noexcept {
  futex_wake_one(&state_);
}

}  // namespace reservoir::detail
