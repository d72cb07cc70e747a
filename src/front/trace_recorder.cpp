// TraceRecorder: trace format v1 from a live process (docs/trace_format.md).
//
// Lines go to a TraceFile, which keeps the file complete on disk and writes it out
// at exit (trace_file.hpp). One mutex serializes lines: the recorder is only active
// while a user captures a workload, where a consistent order of events matters more
// than contention.
#include "front/trace_recorder.hpp"

#include <charconv>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "front/trace_file.hpp"

namespace reservoir::detail {

namespace {

constexpr std::string_view kHeader =
    "# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM\n";

// A line is built in a fixed buffer: a tag, then up to 3 fields of ',' + at most 20
// digits, then '\n' (66 bytes at most).
class Line {
 public:
  explicit Line(char tag) { buf_[len_++] = tag; }
  Line& add(std::uint64_t v) {
    // Never taken (see above); the bound lets the compiler see the writes fit.
    if (len_ > sizeof(buf_) - 22) return *this;
    buf_[len_++] = ',';
    auto res = std::to_chars(buf_ + len_, buf_ + sizeof(buf_), v);
    len_ = static_cast<std::size_t>(res.ptr - buf_);
    return *this;
  }
  std::string_view finish() {
    if (len_ < sizeof(buf_)) buf_[len_++] = '\n';
    return {buf_, len_};
  }

 private:
  char buf_[80];
  std::size_t len_ = 0;
};

}  // namespace

struct TraceRecorder::Impl {
  explicit Impl(const std::string& path) : file(path, kHeader) {}
  TraceFile file;
  std::mutex mutex;
  std::uint64_t next_id = 0;
  std::unordered_map<const void*, std::uint64_t> live;      // pointer -> ID
  std::unordered_map<StreamHandle, std::uint64_t> streams;  // handle -> number

  // Caller holds mutex.
  std::uint64_t stream_number(StreamHandle s) {
    auto [it, inserted] = streams.try_emplace(s, streams.size());
    return it->second;
  }

  // Caller holds mutex (lines stay in the order of the events).
  void write(std::string_view text) { file.append(text); }
};

TraceRecorder::TraceRecorder(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}

TraceRecorder::~TraceRecorder() = default;

void TraceRecorder::on_allocate(const void* ptr, std::size_t size, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::uint64_t id = impl_->next_id++;
  // A zero-size request returns nullptr: it is recorded but never mapped, since
  // every such request shares that pointer and none is ever freed by pointer.
  if (ptr != nullptr) impl_->live[ptr] = id;
  impl_->write(Line('a').add(id).add(size).add(impl_->stream_number(stream)).finish());
}

void TraceRecorder::on_free(const void* ptr) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->live.find(ptr);
  if (it == impl_->live.end()) return;  // allocated before recording started
  const std::uint64_t id = it->second;
  impl_->live.erase(it);
  impl_->write(Line('f').add(id).finish());
}

void TraceRecorder::on_record_stream(const void* ptr, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->live.find(ptr);
  if (it == impl_->live.end()) return;
  impl_->write(Line('u').add(it->second).add(impl_->stream_number(stream)).finish());
}

void TraceRecorder::on_host_wait(StreamHandle stream) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->write(Line('s').add(impl_->stream_number(stream)).finish());
}

void TraceRecorder::flush() {
  impl_->file.flush();
}

const std::string& TraceRecorder::path() const {
  return impl_->file.path();
}

}  // namespace reservoir::detail
