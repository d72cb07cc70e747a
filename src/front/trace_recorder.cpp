// TraceRecorder: trace format v2 from a live process (docs/trace_format.md).
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
    "# trace v2: a,ID,SIZE,STREAM[,TAG] | f,ID | u,ID,STREAM | s,STREAM | n,TAG,NAME | "
    "z,TAG,MODE | w,TAG[,STREAM] | c\n";

// A line is built in a fixed buffer: an event letter, then up to 4 fields of ',' + at
// most 20 digits, or one word of at most 63 characters (a tag's name), then '\n'.
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
  Line& add(std::string_view word) {
    if (len_ + 1 + word.size() >= sizeof(buf_)) return *this;  // names are at most 63
    buf_[len_++] = ',';
    word.copy(buf_ + len_, word.size());
    len_ += word.size();
    return *this;
  }
  std::string_view finish() {
    if (len_ < sizeof(buf_)) buf_[len_++] = '\n';
    return {buf_, len_};
  }

 private:
  char buf_[112];
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
  std::unordered_map<TagId, std::uint64_t> tags;            // tag -> number (from 1)

  // Caller holds mutex.
  std::uint64_t stream_number(StreamHandle s) {
    auto [it, inserted] = streams.try_emplace(s, streams.size());
    return it->second;
  }

  // Caller holds mutex. A tag's first use writes its "n" line.
  std::uint64_t tag_number(TagId tag) {
    auto [it, inserted] = tags.try_emplace(tag, tags.size() + 1);
    if (inserted) write(Line('n').add(it->second).add(TagNames::name(tag)).finish());
    return it->second;
  }

  // Caller holds mutex (lines stay in the order of the events).
  void write(std::string_view text) { file.append(text); }
};

TraceRecorder::TraceRecorder(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}

TraceRecorder::~TraceRecorder() = default;

void TraceRecorder::on_allocate(const void* ptr, std::size_t size, StreamHandle stream, TagId tag) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::uint64_t id = impl_->next_id++;
  // A zero-size request returns nullptr: it is recorded but never mapped, since
  // every such request shares that pointer and none is ever freed by pointer.
  if (ptr != nullptr) impl_->live[ptr] = id;
  Line line('a');
  line.add(id).add(size).add(impl_->stream_number(stream));
  if (tag != kNoTag) line.add(impl_->tag_number(tag));
  impl_->write(line.finish());
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

void TraceRecorder::on_sleep(TagId tag, SleepMode mode) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::uint64_t number = impl_->tag_number(tag);
  impl_->write(
      Line('z').add(number).add(mode == SleepMode::discard ? "discard" : "offload").finish());
}

void TraceRecorder::on_wake(TagId tag, const StreamHandle* stream) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Line line('w');
  line.add(impl_->tag_number(tag));
  if (stream != nullptr) line.add(impl_->stream_number(*stream));
  impl_->write(line.finish());
}

void TraceRecorder::on_empty_cache() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->write(Line('c').finish());
}

void TraceRecorder::flush() {
  impl_->file.flush();
}

const std::string& TraceRecorder::path() const {
  return impl_->file.path();
}

}  // namespace reservoir::detail
