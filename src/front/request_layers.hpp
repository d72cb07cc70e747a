// Layers around the engine's request path (RMM's resource adaptors): each wraps an
// upstream MemoryResource and adds one concern. The front puts a layer in the chain
// only while its concern is on, so a program that records nothing pays nothing.
//   TraceRecordingLayer: writes every request, with the calling thread's tag, and every
//     sleep, wake and empty_cache to a trace (record_trace:PATH, start_trace_recording),
//     serializing them with their records so a reused address cannot be recorded out
//     of order, nor a request on the wrong side of a sleep.
//   OomSnapshotLayer: on OutOfMemoryError writes a snapshot for PyTorch's viewer
//     (oom_snapshot:PATH) and says so in the error; a failed write is reported in the
//     message and never replaces the out-of-memory error.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "engine/allocators/memory_resource.hpp"
#include "front/trace_recorder.hpp"

namespace reservoir::detail {

// How the recording layer learns which private pool a request goes to (asked before
// the request, under the layer's lock, which pool calls also take).
struct PoolQueries {
  // The pool a request on stream from this thread goes to ({0, 0}: none).
  std::function<PoolId(StreamHandle stream, int device)> routed;
  std::function<PoolBefore(PoolId pool, int device)> facts;
};

class TraceRecordingLayer final : public MemoryResource {
 public:
  // Opens path (throws std::runtime_error naming it when it cannot). tag_owner: the
  // allocator's hooks, whose thread tags (thread_tag_for) requests carry.
  TraceRecordingLayer(MemoryResource& upstream, const std::string& path, const void* tag_owner,
                      PoolQueries pools);
  ~TraceRecordingLayer() override;
  void* allocate(std::size_t size, StreamHandle stream, int device) override;
  void deallocate(void* ptr) override;
  void record_stream(void* ptr, StreamHandle stream) override;
  void notify_host_wait(StreamHandle stream, int device) override;
  // Runs op (a sleep, a wake, an empty_cache) with no request between it and its
  // record, which record writes once op returned.
  void run_recorded(const std::function<void()>& op,
                    const std::function<void(TraceRecorder&)>& record);
  // Flushes and closes the trace; later requests pass through unrecorded (threads
  // that entered the layer before it was taken out of the chain may still arrive).
  void close();

 private:
  MemoryResource& upstream_;
  const void* const tag_owner_;
  const PoolQueries pools_;
  std::mutex mutex_;
  std::unique_ptr<TraceRecorder> recorder_;  // null once closed
};

class OomSnapshotLayer final : public MemoryResource {
 public:
  using Dump = std::function<void(const std::string& path)>;
  OomSnapshotLayer(MemoryResource& upstream, std::string path, Dump dump)
      : upstream_(upstream), path_(std::move(path)), dump_(std::move(dump)) {}
  void* allocate(std::size_t size, StreamHandle stream, int device) override;
  void deallocate(void* ptr) override { upstream_.deallocate(ptr); }
  void record_stream(void* ptr, StreamHandle stream) override {
    upstream_.record_stream(ptr, stream);
  }
  void notify_host_wait(StreamHandle stream, int device) override {
    upstream_.notify_host_wait(stream, device);
  }

 private:
  MemoryResource& upstream_;
  const std::string path_;
  Dump dump_;
};

}  // namespace reservoir::detail
