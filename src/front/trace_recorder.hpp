// TraceRecorder: writes trace format v1 (docs/trace_format.md) from a live process,
// so users capture their own workloads on a GPU and replay them with
// reservoir-replay. Enabled by the config key record_trace:PATH or by
// Allocator::start_trace_recording(). Thread-safe (one lock; only when recording).
//
// The file is complete on disk at every moment and written out at exit, on
// termination signals, and never by a fork child: see trace_file.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "reservoir/backend.hpp"

namespace reservoir::detail {

class TraceRecorder {
 public:
  // Creates path (gzip-compressed when it ends in ".gz") and writes the header;
  // throws IoError naming the path and the OS reason when it cannot.
  explicit TraceRecorder(const std::string& path);
  ~TraceRecorder();  // writes out and closes
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // "a,ID,SIZE,STREAM": IDs number allocations in order; streams are numbered from 0
  // in order of first use.
  void on_allocate(const void* ptr, std::size_t size, StreamHandle stream);
  // "f,ID" (a pointer the recorder never saw is ignored).
  void on_free(const void* ptr);
  // "u,ID,STREAM"
  void on_record_stream(const void* ptr, StreamHandle stream);
  // "s,STREAM"
  void on_host_wait(StreamHandle stream);
  // Writes out the buffered lines: the file then holds the whole trace so far.
  void flush();
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace reservoir::detail
