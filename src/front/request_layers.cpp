#include "front/request_layers.hpp"

#include <pthread.h>

#include <algorithm>
#include <vector>

#include "reservoir/errors.hpp"

namespace reservoir::detail {

namespace {
// Fork: a child must not inherit a recording layer's mutex locked by another thread
// (its next allocation would wait forever). Layers are never destroyed before the
// allocator, which the process-wide one never is, so the registry holds plain pointers.
std::mutex g_layers_mutex;
std::vector<std::mutex*> g_layer_mutexes;

void lock_layers() {
  g_layers_mutex.lock();
  for (std::mutex* m : g_layer_mutexes) m->lock();
}
void unlock_layers() {
  for (std::mutex* m : g_layer_mutexes) m->unlock();
  g_layers_mutex.unlock();
}
}  // namespace

TraceRecordingLayer::TraceRecordingLayer(MemoryResource& upstream, const std::string& path,
                                         const void* tag_owner, PoolQueries pools)
    : upstream_(upstream),
      tag_owner_(tag_owner),
      pools_(std::move(pools)),
      recorder_(std::make_unique<TraceRecorder>(path)) {
  // Registered after the recorder's own handlers, so that at a fork the layers are
  // locked first (the order in which requests take them: layer, then file).
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(lock_layers, unlock_layers, unlock_layers); });
  std::lock_guard<std::mutex> guard(g_layers_mutex);
  g_layer_mutexes.push_back(&mutex_);
}

TraceRecordingLayer::~TraceRecordingLayer() {
  std::lock_guard<std::mutex> guard(g_layers_mutex);
  std::erase(g_layer_mutexes, &mutex_);
}

void* TraceRecordingLayer::allocate(std::size_t size, StreamHandle stream, int device) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (!recorder_) return upstream_.allocate(size, stream, device);
  const PoolId pool = pools_.routed(stream, device);
  const PoolBefore before = pool.is_default() ? std::nullopt : pools_.facts(pool, device);
  void* ptr = upstream_.allocate(size, stream, device);
  recorder_->on_allocate(ptr, size, stream, thread_tag_for(tag_owner_), pool, before);
  return ptr;
}

void TraceRecordingLayer::deallocate(void* ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  upstream_.deallocate(ptr);
  if (recorder_) recorder_->on_free(ptr);
}

void TraceRecordingLayer::record_stream(void* ptr, StreamHandle stream) {
  upstream_.record_stream(ptr, stream);
  std::lock_guard<std::mutex> guard(mutex_);
  if (recorder_) recorder_->on_record_stream(ptr, stream);
}

void TraceRecordingLayer::notify_host_wait(StreamHandle stream, int device) {
  upstream_.notify_host_wait(stream, device);
  std::lock_guard<std::mutex> guard(mutex_);
  if (recorder_) recorder_->on_host_wait(stream);
}

void TraceRecordingLayer::run_recorded(const std::function<void()>& op,
                                       const std::function<void(TraceRecorder&)>& record) {
  std::lock_guard<std::mutex> guard(mutex_);
  op();
  if (recorder_) record(*recorder_);
}

void TraceRecordingLayer::close() {
  std::lock_guard<std::mutex> guard(mutex_);
  recorder_.reset();
}

void* OomSnapshotLayer::allocate(std::size_t size, StreamHandle stream, int device) {
  try {
    return upstream_.allocate(size, stream, device);
  } catch (const OutOfMemoryError& oom) {
    std::string message = oom.what();
    try {
      dump_(path_);
      message += " A snapshot was written to " + path_ + ".";
    } catch (const std::exception& error) {
      message += " (writing the OOM snapshot to " + path_ + " failed: " + error.what() + ")";
    }
    throw OutOfMemoryError(message);
  }
}

}  // namespace reservoir::detail
