// Symbol visibility for the reservoir shared library. The library is built with
// hidden visibility; only what is marked RESERVOIR_API is exported.
#pragma once

#if defined(RESERVOIR_STATIC)
#define RESERVOIR_API
#elif defined(_WIN32)
#if defined(RESERVOIR_BUILDING)
#define RESERVOIR_API __declspec(dllexport)
#else
#define RESERVOIR_API __declspec(dllimport)
#endif
#else
#define RESERVOIR_API __attribute__((visibility("default")))
#endif
