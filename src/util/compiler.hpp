// Compiler hints for the allocation hot path, in one place.
#pragma once

// Forces inlining of a small helper into the hot path (a call costs more than it).
#define RESERVOIR_INLINE inline __attribute__((always_inline))
// Keeps rarely taken code out of the hot path's instruction stream.
#define RESERVOIR_COLD __attribute__((cold, noinline))
#define RESERVOIR_LIKELY(x) __builtin_expect(!!(x), 1)
#define RESERVOIR_UNLIKELY(x) __builtin_expect(!!(x), 0)
