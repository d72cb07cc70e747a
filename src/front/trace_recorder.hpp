// TraceRecorder: writes trace format v2 (docs/trace_format.md) from a live process,
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

#include "engine/tags/tags.hpp"
#include "reservoir/backend.hpp"
#include "reservoir/sleep.hpp"

namespace reservoir::detail {

class TraceRecorder {
 public:
  // Creates path (gzip-compressed when it ends in ".gz") and writes the header;
  // throws IoError naming the path and the OS reason when it cannot.
  explicit TraceRecorder(const std::string& path);
  ~TraceRecorder();  // writes out and closes
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // "a,ID,SIZE,STREAM", or "a,ID,SIZE,STREAM,TAG" under a tag: IDs number allocations
  // in order; streams are numbered from 0 and tags from 1 in order of first use, a
  // tag's first use preceded by its "n,TAG,NAME".
  void on_allocate(const void* ptr, std::size_t size, StreamHandle stream, TagId tag = kNoTag);
  // "f,ID" (a pointer the recorder never saw is ignored).
  void on_free(const void* ptr);
  // "u,ID,STREAM"
  void on_record_stream(const void* ptr, StreamHandle stream);
  // "s,STREAM"
  void on_host_wait(StreamHandle stream);
  // "z,TAG,MODE" (MODE offload or discard): tag was put to sleep.
  void on_sleep(TagId tag, SleepMode mode);
  // "w,TAG", or "w,TAG,STREAM" for a wake whose copies went on stream.
  void on_wake(TagId tag, const StreamHandle* stream);
  // "c": the program emptied the cache.
  void on_empty_cache();
  // Writes out the buffered lines: the file then holds the whole trace so far.
  void flush();
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace reservoir::detail
