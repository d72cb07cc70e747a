// Tiered checks (as mimalloc's MI_DEBUG levels):
//   RESERVOIR_CHECK(c, msg)           always on; throws InvariantError.
//   RESERVOIR_ASSERT(c)               debug builds (level >= 2) and checks builds.
//   RESERVOIR_ASSERT_EXPENSIVE(...)   only in the checks build (level 3), where the
//                                     engine also runs the full validator after
//                                     every operation.
// RESERVOIR_CHECK_LEVEL: 1 = release (default), 2 = debug, 3 = full checks
// (CMake option RESERVOIR_CHECKS).
#pragma once

#include <string>

#include "reservoir/errors.hpp"

#ifndef RESERVOIR_CHECK_LEVEL
#ifdef NDEBUG
#define RESERVOIR_CHECK_LEVEL 1
#else
#define RESERVOIR_CHECK_LEVEL 2
#endif
#endif

namespace reservoir::detail {
[[noreturn]] void invariant_failure(const char* condition, const char* file, int line,
                                    const std::string& message);
inline constexpr int kCheckLevel = RESERVOIR_CHECK_LEVEL;
}  // namespace reservoir::detail

#define RESERVOIR_CHECK(cond, msg)                                              \
  do {                                                                          \
    if (__builtin_expect(!(cond), 0))                                           \
      ::reservoir::detail::invariant_failure(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)

#if RESERVOIR_CHECK_LEVEL >= 2
#define RESERVOIR_ASSERT(cond) RESERVOIR_CHECK(cond, "")
#else
#define RESERVOIR_ASSERT(cond) \
  do {                         \
  } while (0)
#endif

#if RESERVOIR_CHECK_LEVEL >= 3
#define RESERVOIR_ASSERT_EXPENSIVE(stmt) \
  do {                                   \
    stmt;                                \
  } while (0)
#else
#define RESERVOIR_ASSERT_EXPENSIVE(stmt) \
  do {                                   \
  } while (0)
#endif
