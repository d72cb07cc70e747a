// TraceRecorder: trace format v2 from a live process (docs/trace_format.md).
//
// Lines go to a TraceFile, which keeps the file complete on disk and writes it out
// at exit (trace_file.hpp). One mutex serializes lines: the recorder is only active
// while a user captures a workload, where a consistent order of events matters more
// than contention.
#include "front/trace_recorder.hpp"

#include <charconv>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "front/trace_file.hpp"

namespace reservoir::detail {

namespace {

constexpr std::string_view kHeader =
    "# trace v2: a,ID,SIZE,STREAM[,TAG[,POOL]] | f,ID | u,ID,STREAM | s,STREAM | n,TAG,NAME | "
    "z,TAG,MODE | w,TAG[,STREAM] | c | p,POOL[,OPTIONS] | x,POOL[,empty] | g,POOL[,STREAM] | "
    "t,POOL | e,POOL | k,CKPT,POOL | r,CKPT | y,ID | o,ID,OLDID\n";

std::string_view options_word(const PoolOptions& o) {
  if (o.use_on_oom && o.no_split) return "use_on_oom+no_split";
  if (o.use_on_oom) return "use_on_oom";
  if (o.no_split) return "no_split";
  return "";
}

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
  struct LiveBlock {
    std::uint64_t id;
    std::uint64_t pool;  // the pool number it was routed to; 0: none
  };
  std::unordered_map<const void*, LiveBlock> live;          // pointer -> its block
  std::unordered_map<StreamHandle, std::uint64_t> streams;  // handle -> number
  std::unordered_map<TagId, std::uint64_t> tags;            // tag -> number (from 1)
  struct PoolBook {
    std::uint64_t number;
    bool routed = false;
  };
  struct PoolOrder {
    bool operator()(const PoolId& a, const PoolId& b) const {
      return a.first != b.first ? a.first < b.first : a.second < b.second;
    }
  };
  std::map<PoolId, PoolBook, PoolOrder> pools;
  struct CheckpointBook {
    std::uint64_t number;                                // CKPT, from 1
    std::unordered_map<const void*, std::uint64_t> ids;  // its pool's blocks -> ID then
  };
  std::unordered_map<std::uint64_t, CheckpointBook> checkpoints;  // by PoolCheckpoint::number

  // Caller holds mutex. A pool's number; at its first line, a pool that existed
  // already (before) is written as made now: its uses, then its route.
  PoolBook& pool_book(PoolId id, const std::optional<PoolFacts>& before) {
    auto [it, inserted] = pools.try_emplace(id, PoolBook{pools.size() + 1});
    if (inserted && before) {
      const std::string_view options = options_word(before->options);
      const int uses = before->use_count - (before->routed ? 1 : 0);
      for (int k = 0; k < uses; ++k) {
        Line line('p');
        line.add(it->second.number);
        if (!options.empty()) line.add(options);
        write(line.finish());
      }
      if (before->routed) {
        write(Line(before->capture ? 'g' : 't').add(it->second.number).finish());
        it->second.routed = true;
      }
    }
    return it->second;
  }

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

void TraceRecorder::on_allocate(const void* ptr, std::size_t size, StreamHandle stream, TagId tag,
                                PoolId pool, const std::optional<PoolFacts>& before) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::uint64_t id = impl_->next_id++;
  const std::uint64_t pool_number = pool.is_default() ? 0 : impl_->pool_book(pool, before).number;
  // A zero-size request returns nullptr: it is recorded but never mapped, since
  // every such request shares that pointer and none is ever freed by pointer.
  if (ptr != nullptr) impl_->live[ptr] = Impl::LiveBlock{id, pool_number};
  Line line('a');
  line.add(id).add(size).add(impl_->stream_number(stream));
  if (tag != kNoTag || pool_number != 0) line.add(tag == kNoTag ? 0 : impl_->tag_number(tag));
  if (pool_number != 0) line.add(pool_number);
  impl_->write(line.finish());
}

void TraceRecorder::on_pool_retain(PoolId pool, const PoolOptions& options,
                                   const std::optional<PoolFacts>& before) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Line line('p');
  line.add(impl_->pool_book(pool, before).number);
  if (const std::string_view word = options_word(options); !word.empty()) line.add(word);
  impl_->write(line.finish());
}

void TraceRecorder::on_pool_release(PoolId pool, bool empty_cache,
                                    const std::optional<PoolFacts>& before) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Line line('x');
  line.add(impl_->pool_book(pool, before).number);
  if (empty_cache) line.add("empty");
  impl_->write(line.finish());
}

void TraceRecorder::on_route_begin(PoolId pool, bool capture, const StreamHandle* stream,
                                   const std::optional<PoolFacts>& before) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Impl::PoolBook& book = impl_->pool_book(pool, before);
  book.routed = true;
  Line line(capture ? 'g' : 't');
  line.add(book.number);
  if (capture && stream != nullptr) line.add(impl_->stream_number(*stream));
  impl_->write(line.finish());
}

void TraceRecorder::on_route_end(PoolId pool, const std::optional<PoolFacts>& before) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Impl::PoolBook& book = impl_->pool_book(pool, before);
  book.routed = false;
  impl_->write(Line('e').add(book.number).finish());
}

void TraceRecorder::on_checkpoint(const PoolCheckpoint& checkpoint,
                                  const std::optional<PoolFacts>& before) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::uint64_t pool = impl_->pool_book(checkpoint.pool, before).number;
  Impl::CheckpointBook book{impl_->checkpoints.size() + 1, {}};
  // The blocks routed to the pool that it holds allocated: a restore gives them back.
  for (const CheckpointSegment& segment : checkpoint.segments)
    for (const CheckpointBlock& block : segment.blocks) {
      if (!block.allocated) continue;
      const void* ptr = reinterpret_cast<const void*>(block.address);
      auto it = impl_->live.find(ptr);
      if (it != impl_->live.end() && it->second.pool == pool) book.ids[ptr] = it->second.id;
    }
  const std::uint64_t number = book.number;
  impl_->checkpoints[checkpoint.number] = std::move(book);
  impl_->write(Line('k').add(number).add(pool).finish());
}

void TraceRecorder::on_restore(const PoolCheckpoint& checkpoint, const PoolRestore& restore) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto ckpt = impl_->checkpoints.find(checkpoint.number);
  const bool known = ckpt != impl_->checkpoints.end();
  if (known) impl_->write(Line('r').add(ckpt->second.number).finish());
  for (void* ptr : restore.freed) {
    auto it = impl_->live.find(ptr);
    if (it == impl_->live.end()) continue;
    impl_->write(Line(known ? 'y' : 'f').add(it->second.id).finish());
    impl_->live.erase(it);
  }
  if (!known) return;  // its blocks are unknown, as those allocated before recording
  const auto pool = impl_->pools.find(checkpoint.pool);
  for (void* ptr : restore.allocated) {
    auto old = ckpt->second.ids.find(ptr);
    if (old == ckpt->second.ids.end() || pool == impl_->pools.end()) continue;
    const std::uint64_t id = impl_->next_id++;
    impl_->live[ptr] = Impl::LiveBlock{id, pool->second.number};
    impl_->write(Line('o').add(id).add(old->second).finish());
  }
}

void TraceRecorder::on_free(const void* ptr) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->live.find(ptr);
  if (it == impl_->live.end()) return;  // allocated before recording started
  const std::uint64_t id = it->second.id;
  impl_->live.erase(it);
  impl_->write(Line('f').add(id).finish());
}

void TraceRecorder::on_record_stream(const void* ptr, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->live.find(ptr);
  if (it == impl_->live.end()) return;
  impl_->write(Line('u').add(it->second.id).add(impl_->stream_number(stream)).finish());
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
