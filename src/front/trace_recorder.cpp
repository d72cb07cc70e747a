// TraceRecorder: trace format v1 from a live process (docs/trace_format.md).
//
// Writes go through zlib in both modes ("wT" is zlib's transparent, uncompressed
// write), so plain and .gz files share one path. One mutex serializes lines: the
// recorder is only active while a user captures a workload, where a consistent
// order of events matters more than contention.
#include "front/trace_recorder.hpp"

#include <zlib.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

namespace reservoir::detail {

namespace {

constexpr std::string_view kHeader =
    "# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM\n";

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
}

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
  std::string path;
  std::mutex mutex;
  gzFile file = nullptr;
  bool failed = false;  // a write failed: stop writing, warn once
  std::uint64_t next_id = 0;
  std::unordered_map<const void*, std::uint64_t> live;      // pointer -> ID
  std::unordered_map<StreamHandle, std::uint64_t> streams;  // handle -> number

  // Caller holds mutex.
  std::uint64_t stream_number(StreamHandle s) {
    auto [it, inserted] = streams.try_emplace(s, streams.size());
    return it->second;
  }

  // Caller holds mutex. A full disk must not turn into an allocator failure, so a
  // failed write is reported once on stderr and recording stops.
  void write(std::string_view text) {
    if (failed || file == nullptr) return;
    if (gzwrite(file, text.data(), static_cast<unsigned>(text.size())) !=
        static_cast<int>(text.size())) {
      failed = true;
      int err = 0;
      const char* msg = gzerror(file, &err);
      std::fprintf(stderr, "reservoir: trace recording to '%s' stopped: write failed: %s\n",
                   path.c_str(), err == Z_ERRNO ? std::strerror(errno) : msg);
    }
  }
};

TraceRecorder::TraceRecorder(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  errno = 0;
  impl_->file = gzopen(path.c_str(), ends_with(path, ".gz") ? "wb" : "wT");
  if (impl_->file == nullptr)
    throw std::runtime_error("reservoir: cannot open trace file '" + path +
                             "' for writing: " + (errno ? std::strerror(errno) : "zlib error"));
  gzbuffer(impl_->file, 1 << 17);
  impl_->write(kHeader);
}

TraceRecorder::~TraceRecorder() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->file != nullptr && gzclose(impl_->file) != Z_OK && !impl_->failed)
    std::fprintf(stderr, "reservoir: closing trace file '%s' failed; it may be incomplete\n",
                 impl_->path.c_str());
  impl_->file = nullptr;
}

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
  std::lock_guard<std::mutex> lock(impl_->mutex);
  // Z_SYNC_FLUSH makes everything so far readable without closing the stream.
  if (impl_->file != nullptr && !impl_->failed) gzflush(impl_->file, Z_SYNC_FLUSH);
}

const std::string& TraceRecorder::path() const {
  return impl_->path;
}

}  // namespace reservoir::detail
