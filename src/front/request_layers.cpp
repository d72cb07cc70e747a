#include "front/request_layers.hpp"

#include "reservoir/errors.hpp"

namespace reservoir::detail {

TraceRecordingLayer::TraceRecordingLayer(MemoryResource& upstream, const std::string& path)
    : upstream_(upstream), recorder_(std::make_unique<TraceRecorder>(path)) {}

void* TraceRecordingLayer::allocate(std::size_t size, StreamHandle stream, int device) {
  std::lock_guard<std::mutex> guard(mutex_);
  void* ptr = upstream_.allocate(size, stream, device);
  if (recorder_) recorder_->on_allocate(ptr, size, stream);
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
