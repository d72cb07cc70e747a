// Errors of the C++ API. The engine and backends report status codes; the front
// (reservoir::Allocator) turns them into these exceptions.
#pragma once

#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "reservoir/export.hpp"

namespace reservoir {

// The device has no memory for the request after the whole out-of-memory ladder
// (callbacks, garbage collection, releasing cached blocks, synchronizing). The
// message says what was asked, what the device has, what the cache holds, and
// what to try.
class RESERVOIR_API OutOfMemoryError : public std::bad_alloc {
 public:
  explicit OutOfMemoryError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// A pointer that Reservoir did not hand out, or no longer holds as allocated:
// never allocated, freed twice, or pointing inside a block. Nothing was changed.
class RESERVOIR_API InvalidPointerError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A malformed configuration string: names the key and what is allowed.
class RESERVOIR_API ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Another bad argument: an unknown device index, a fraction outside [0, 1], ...
class RESERVOIR_API InvalidArgumentError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A device call failed for a reason other than memory; names the call.
class RESERVOIR_API DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reading or writing a file failed (a trace, a snapshot): the message names the path
// and the operating system's reason. The allocator itself is unaffected and keeps
// working.
class RESERVOIR_API IoError : public std::runtime_error {
 public:
  IoError(const std::string& message, std::string path, int os_error)
      : std::runtime_error(message), path_(std::move(path)), os_error_(os_error) {}
  const std::string& path() const noexcept { return path_; }
  // The errno value of the failure (0 when the OS gave none, e.g. a zlib error).
  int os_error() const noexcept { return os_error_; }

 private:
  std::string path_;
  int os_error_;
};

// The validator found allocator books that contradict each other (a bug).
class RESERVOIR_API InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace reservoir
