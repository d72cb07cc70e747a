// Allocator::dump_snapshot: the snapshot as a pickle in the layout of PyTorch's
// torch.cuda.memory._snapshot() (torch/csrc/cuda/memory_snapshot.cpp): the keys,
// action strings and block states that torch.cuda._memory_viz and the JavaScript
// viewer (pytorch.org/memory_viz) read. Written by hand (protocol 2) with only the
// opcodes that the viewer's own unpickler implements.
#include "front/snapshot_pickle.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "reservoir/allocator.hpp"

namespace reservoir {
namespace detail {
namespace {

// Pickle opcodes.
constexpr char kProto = '\x80', kStop = '.', kMark = '(', kEmptyDict = '}', kSetItems = 'u',
               kEmptyList = ']', kAppends = 'e', kBinUnicode = 'X', kBinInt = 'J', kBinInt1 = 'K',
               kBinInt2 = 'M', kLong1 = '\x8a', kNewTrue = '\x88', kNewFalse = '\x89',
               kBinFloat = 'G', kTuple2 = '\x86', kBinPut = 'q', kLongBinPut = 'r', kBinGet = 'h',
               kLongBinGet = 'j';

// Items per APPENDS, as Python's pickler batches: the viewer pushes a batch as the
// arguments of one call, which JavaScript engines cap (a million would throw).
constexpr std::size_t kBatch = 1000;
constexpr std::size_t kFlushBytes = std::size_t{1} << 20;

// Length of the valid UTF-8 sequence at p (0 if invalid): overlong forms and
// surrogates are invalid, as in Python's decoder.
std::size_t utf8_sequence(const unsigned char* p, std::size_t n) {
  const unsigned c = p[0];
  if (c < 0x80) return 1;
  std::size_t len = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (n < len || p[1] < lo || p[1] > hi) return 0;
  for (std::size_t i = 2; i < len; ++i)
    if ((p[i] & 0xC0) != 0x80) return 0;
  return len;
}

// Context strings come from user code and may hold any bytes; the pickle's strings
// must be UTF-8, so invalid bytes become U+FFFD.
std::string valid_utf8(std::string_view s) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_sequence(p + i, s.size() - i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
  return out;
}

// Parses "file:line name" (or "file:line:name", PyTorch's own frame text).
bool parse_frame(std::string_view line, Frame* out) {
  for (std::size_t colon = line.find(':'); colon != std::string_view::npos;
       colon = line.find(':', colon + 1)) {
    std::size_t end = colon + 1;
    while (end < line.size() && line[end] >= '0' && line[end] <= '9') ++end;
    const std::size_t digits = end - colon - 1;
    if (colon == 0 || digits == 0 || digits > 18) continue;
    if (end < line.size() && line[end] != ' ' && line[end] != ':') continue;
    out->filename.assign(line.substr(0, colon));
    out->line = std::stoll(std::string(line.substr(colon + 1, digits)));
    out->name.assign(end < line.size() ? line.substr(end + 1) : std::string_view());
    return true;
  }
  return false;
}

class Pickler {
 public:
  explicit Pickler(std::FILE* file) : file_(file) {}

  std::string& buffer() { return buf_; }
  bool failed() const { return failed_; }
  int error() const { return error_; }

  void flush() {
    if (!file_ || buf_.empty()) return;
    if (!failed_ && std::fwrite(buf_.data(), 1, buf_.size(), file_) != buf_.size()) {
      failed_ = true;
      error_ = errno;
    }
    buf_.clear();
  }

  void snapshot(const Snapshot& s) {
    op(kProto);
    op('\x02');
    begin_dict();
    key("segments");
    list(s.segments, [&](const SegmentInfo& seg) { segment(seg); });
    key("device_traces");
    list(s.device_traces, [&](const std::vector<TraceEntry>& trace) {
      list(trace, [&](const TraceEntry& e) { entry(e); });
    });
    key("allocator_settings");
    settings(s);
    key("external_annotations");
    list(s.annotations, [&](const Annotation& a) {
      // PyTorch's annotations are {name, stage} pairs from record_function.
      begin_dict();
      key("name");
      text(a.name);
      key("stage");
      text(a.value);
      key("device");
      integer(a.device);
      key("time_us");
      number(a.time_us);
      end_dict();
    });
    end_dict();
    op(kStop);
    flush();
  }

 private:
  void op(char c) { buf_ += c; }
  void le(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) buf_ += static_cast<char>((v >> (8 * i)) & 0xFF);
  }

  void integer(std::int64_t v) {
    if (v >= 0 && v < 0x100) {
      op(kBinInt1);
      le(static_cast<std::uint64_t>(v), 1);
    } else if (v >= 0 && v < 0x10000) {
      op(kBinInt2);
      le(static_cast<std::uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op(kBinInt);
      le(static_cast<std::uint64_t>(v), 4);
    } else {
      // LONG1: little-endian two's complement, shortest form.
      std::uint8_t b[8];
      for (int i = 0; i < 8; ++i)
        b[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(v) >> (8 * i));
      int n = 8;
      while (n > 1 &&
             ((b[n - 1] == 0x00 && !(b[n - 2] & 0x80)) || (b[n - 1] == 0xFF && (b[n - 2] & 0x80))))
        --n;
      op(kLong1);
      buf_ += static_cast<char>(n);
      buf_.append(reinterpret_cast<const char*>(b), static_cast<std::size_t>(n));
    }
  }
  // Sizes, addresses and streams (PyTorch writes them as int64 too).
  void number(std::uint64_t v) {
    if (v <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(v));
    op(kLong1);
    buf_ += '\x09';
    le(v, 8);
    buf_ += '\0';
  }
  void boolean(bool b) { op(b ? kNewTrue : kNewFalse); }
  void real(double d) {
    std::uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    op(kBinFloat);
    for (int i = 7; i >= 0; --i) buf_ += static_cast<char>((bits >> (8 * i)) & 0xFF);
  }
  void text(std::string_view s) {
    bool valid = true;
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    for (std::size_t i = 0; i < s.size() && valid;) {
      const std::size_t len = utf8_sequence(p + i, s.size() - i);
      valid = len != 0;
      i += len;
    }
    const std::string repaired = valid ? std::string() : valid_utf8(s);
    const std::string_view t = valid ? s : std::string_view(repaired);
    op(kBinUnicode);
    le(t.size(), 4);
    buf_.append(t);
  }

  // The memo makes repeated keys and frame lists 2-5 bytes each instead of a copy.
  void put(std::uint32_t id) {
    if (id < 0x100) {
      op(kBinPut);
      le(id, 1);
    } else {
      op(kLongBinPut);
      le(id, 4);
    }
  }
  void get(std::uint32_t id) {
    if (id < 0x100) {
      op(kBinGet);
      le(id, 1);
    } else {
      op(kLongBinGet);
      le(id, 4);
    }
  }
  // A constant string (dictionary keys, action and state names).
  void key(const char* s) {
    auto it = keys_.find(s);
    if (it != keys_.end()) return get(it->second);
    text(s);
    keys_.emplace(s, next_id_);
    put(next_id_++);
  }

  void begin_dict() {
    op(kEmptyDict);
    op(kMark);
  }
  void end_dict() { op(kSetItems); }
  template <class Range, class Item>
  void list(const Range& range, Item&& item) {
    op(kEmptyList);
    std::size_t n = 0;
    for (const auto& x : range) {
      if (n % kBatch == 0) op(kMark);
      item(x);
      if (++n % kBatch == 0) op(kAppends);
      if (buf_.size() >= kFlushBytes) flush();
    }
    if (n % kBatch != 0) op(kAppends);
  }

  void frames(const Context& context) {
    if (!context) return op(kEmptyList);
    auto by_pointer = by_pointer_.find(context.get());
    if (by_pointer != by_pointer_.end()) return get(by_pointer->second);
    // Recorders return a fresh string per call: share lists of equal text too.
    auto by_text = by_text_.find(*context);
    if (by_text != by_text_.end()) {
      by_pointer_.emplace(context.get(), by_text->second);
      return get(by_text->second);
    }
    list(context_frames(*context), [&](const Frame& f) {
      begin_dict();
      key("name");
      text(f.name);
      key("filename");
      text(f.filename);
      key("line");
      integer(f.line);
      end_dict();
    });
    by_pointer_.emplace(context.get(), next_id_);
    by_text_.emplace(*context, next_id_);
    put(next_id_++);
  }

  void segment(const SegmentInfo& seg) {
    begin_dict();
    key("device");
    integer(seg.device);
    key("address");
    number(seg.address);
    key("total_size");
    number(seg.total_size);
    key("allocated_size");
    number(seg.allocated_size);
    key("active_size");
    number(seg.active_size);
    key("requested_size");
    number(seg.requested_size);
    key("stream");
    number(seg.stream);
    key("segment_type");
    key(seg.is_large ? "large" : "small");
    key("segment_pool_id");  // PyTorch's MempoolId_t: (capture id, pool id)
    number(seg.pool.first);
    number(seg.pool.second);
    op(kTuple2);
    key("is_expandable");
    boolean(seg.is_expandable);
    if (!seg.tag.empty()) {  // tagged memory only, so an untagged snapshot is PyTorch's
      key("tag");
      text(seg.tag);  // not memoized: the key table holds views of literals
      key("asleep");
      boolean(seg.asleep);
    }
    key("frames");
    frames(seg.context);
    key("blocks");
    list(seg.blocks, [&](const BlockInfo& b) {
      begin_dict();
      key("address");
      number(b.address);
      key("size");
      number(b.size);
      key("requested_size");
      number(b.requested_size);
      key("state");
      key(to_string(b.state));
      key("frames");
      frames(b.context);
      end_dict();
    });
    end_dict();
  }

  void entry(const TraceEntry& e) {
    begin_dict();
    key("action");
    key(to_string(e.action));
    key(e.action == TraceAction::oom ? "device_free" : "addr");
    number(e.address);
    key("size");
    number(e.size);
    key("stream");
    number(e.stream);
    key("compile_context");
    key("");
    key("user_metadata");
    key("");
    key("frames");
    frames(e.context);
    key("time_us");
    number(e.time_us);
    end_dict();
  }

  void settings(const Snapshot& s) {
    begin_dict();
    key("PYTORCH_CUDA_ALLOC_CONF");
    text(s.settings);
    key("max_split_size");  // "unlimited" is SIZE_MAX, which PyTorch writes as -1
    integer(static_cast<std::int64_t>(s.max_split_size));
    key("garbage_collection_threshold");
    real(s.garbage_collection_threshold);
    key("expandable_segments");
    boolean(s.expandable_segments);
    key("pinned_num_register_threads");  // host-memory settings Reservoir lacks: defaults
    integer(1);
    key("release_lock_on_cudamalloc");
    boolean(s.release_lock_on_cudamalloc);
    key("pinned_use_cuda_host_register");
    boolean(false);
    key("graph_capture_record_stream_reuse");
    boolean(s.graph_capture_record_stream_reuse);
    key("roundup_power2_divisions");
    begin_dict();
    std::uint64_t interval_mib = 1;  // keyed by the interval's start in MiB: "1", "2", "4"...
    for (std::size_t divisions : s.roundup_power2_divisions) {
      text(std::to_string(interval_mib));
      number(divisions);
      interval_mib *= 2;
    }
    end_dict();
    end_dict();
  }

  std::FILE* file_;
  std::string buf_;
  bool failed_ = false;
  int error_ = 0;
  std::uint32_t next_id_ = 0;
  std::unordered_map<std::string_view, std::uint32_t> keys_;
  std::unordered_map<const std::string*, std::uint32_t> by_pointer_;
  std::unordered_map<std::string, std::uint32_t> by_text_;
};

IoError write_error(const std::string& path, const char* what, int error) {
  return IoError("reservoir: cannot write the memory snapshot to '" + path + "': " + what + ": " +
                     std::strerror(error),
                 path, error);
}

}  // namespace

std::vector<Frame> context_frames(const std::string& context) {
  std::vector<Frame> out;
  std::string_view rest(context);
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty()) continue;
    Frame f;
    if (!parse_frame(line, &f)) {
      std::string_view whole(context);
      while (!whole.empty() && (whole.back() == '\n' || whole.back() == '\r'))
        whole.remove_suffix(1);
      return {Frame{std::string(whole), 0, std::string()}};
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::string snapshot_pickle(const Snapshot& snapshot) {
  Pickler p(nullptr);
  p.snapshot(snapshot);
  return std::move(p.buffer());
}

void write_snapshot_pickle(const Snapshot& snapshot, const std::string& path) {
  static std::atomic<unsigned> serial{0};
  const std::string temp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial++);
  std::FILE* file = std::fopen(temp.c_str(), "wb");
  if (!file) throw write_error(path, ("creating " + temp).c_str(), errno);
  Pickler p(file);
  try {
    p.snapshot(snapshot);
  } catch (...) {
    std::fclose(file);
    std::remove(temp.c_str());
    throw;
  }
  const int close_failed = std::fclose(file);
  const int close_error = errno;
  if (p.failed() || close_failed != 0) {
    std::remove(temp.c_str());
    throw write_error(path, "writing", p.failed() ? p.error() : close_error);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temp.c_str());
    throw write_error(path, ("renaming " + temp + " to it").c_str(), error);
  }
}

}  // namespace detail

void Allocator::dump_snapshot(const std::string& path) {
  detail::write_snapshot_pickle(snapshot(), path);
}

}  // namespace reservoir
