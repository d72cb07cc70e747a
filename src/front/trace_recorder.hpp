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
#include <optional>
#include <string>

#include "engine/device/private_pools.hpp"
#include "engine/tags/tags.hpp"
#include "reservoir/backend.hpp"
#include "reservoir/pools.hpp"
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

  // "a,ID,SIZE,STREAM", or "a,ID,SIZE,STREAM,TAG" under a tag, "a,ID,SIZE,STREAM,TAG,POOL"
  // routed to a private pool: IDs number allocations in order; streams are numbered
  // from 0, tags and pools from 1 in order of first use, a tag's first use preceded by
  // its "n,TAG,NAME".
  //
  // Pool lines pass the pool's facts before the event (nullopt: it did not exist). A
  // pool made before the recording is written, at its first line, as made then: its
  // uses as "p" lines and its route as a "g" or "t" line.
  void on_allocate(const void* ptr, std::size_t size, StreamHandle stream, TagId tag = kNoTag,
                   PoolId pool = {}, const std::optional<PoolFacts>& before = std::nullopt);
  // "p,POOL[,OPTIONS]": a use added (the pool made when new).
  void on_pool_retain(PoolId pool, const PoolOptions& options,
                      const std::optional<PoolFacts>& before);
  // "x,POOL[,empty]": a use dropped (empty: the pool's cache given back at the last).
  void on_pool_release(PoolId pool, bool empty_cache, const std::optional<PoolFacts>& before);
  // "g,POOL[,STREAM]" (a capture's route; the stream where the allocator was told it),
  // "t,POOL" (a thread's, not a capture).
  void on_route_begin(PoolId pool, bool capture, const StreamHandle* stream,
                      const std::optional<PoolFacts>& before);
  // "e,POOL"
  void on_route_end(PoolId pool, const std::optional<PoolFacts>& before);
  // "k,CKPT,POOL": checkpoint numbered from 1, known later by checkpoint.number.
  void on_checkpoint(const PoolCheckpoint& checkpoint, const std::optional<PoolFacts>& before);
  // "r,CKPT" then "y,ID" for each block it freed and "o,ID,OLDID" for each it allocated
  // (the block OLDID was at the checkpoint). A checkpoint the recorder did not see:
  // its frees as "f" lines, its blocks unknown (as those allocated before recording).
  void on_restore(const PoolCheckpoint& checkpoint, const PoolRestore& restore);
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
