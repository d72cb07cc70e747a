// Trace format v1 and v2 parser (docs/trace_format.md). Strict on purpose: a trace that
// replays "almost" right gives memory figures nobody can trust, so every malformed
// line stops the read with its file and line number.
#include "trace_reader.hpp"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <vector>

#include "reservoir/sleep.hpp"
#include "trace_text.hpp"

namespace reservoir::replay {

namespace {

constexpr const char* kExpectAlloc = "expected a,ID,SIZE,STREAM[,TAG[,POOL]]";
constexpr const char* kExpectFree = "expected f,ID";
constexpr const char* kExpectUse = "expected u,ID,STREAM";
constexpr const char* kExpectWait = "expected s,STREAM";
constexpr const char* kExpectName = "expected n,TAG,NAME";
constexpr const char* kExpectSleep = "expected z,TAG,MODE (MODE offload or discard)";
constexpr const char* kExpectWake = "expected w,TAG[,STREAM]";
constexpr const char* kExpectEmpty = "expected c";
constexpr const char* kLines =
    "a,ID,SIZE,STREAM[,TAG[,POOL]] | f,ID | u,ID,STREAM | s,STREAM | n,TAG,NAME | z,TAG,MODE | "
    "w,TAG[,STREAM] | c | p,POOL[,OPTIONS] | x,POOL[,empty] | g,POOL[,STREAM] | t,POOL | "
    "e,POOL | k,CKPT,POOL | r,CKPT | y,ID | o,ID,OLDID | # comment";
// Tag numbers are below this (0 is no tag), as the engine's tags.
constexpr std::uint64_t kMaxTags = 1u << 16;

// Splits line at commas into at most N fields; returns the number found, or N + 1
// when there are more (so "too many fields" is detected without a vector).
template <std::size_t N>
std::size_t split(std::string_view line, std::array<std::string_view, N>& out) {
  std::size_t count = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    const std::string_view field = line.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (count == N) return N + 1;
    out[count++] = field;
    if (comma == std::string_view::npos) return count;
    start = comma + 1;
  }
}

// Plain data is clearly not text when its first bytes hold a control byte that no
// text file has (NUL, ESC, ...): tab, line ends, form feed and vertical tab excepted.
bool looks_binary(std::string_view start) {
  constexpr std::size_t kSniff = 512;
  for (const char c : start.substr(0, kSniff)) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') || u == 0x7f)
      return true;
  }
  return false;
}

std::string_view trim_right(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

// "# trace vN..." names the format version; v1 and v2 are known.
void check_version_comment(std::string_view line, int* version) {
  constexpr std::string_view kPrefix = "# trace v";
  if (line.substr(0, kPrefix.size()) != kPrefix) return;
  std::string_view rest = line.substr(kPrefix.size());
  int v = 0;
  auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
  if (ec == std::errc{} && ptr != rest.data()) *version = v;
}

}  // namespace

TraceParser::TraceParser(std::string path) {
  trace_.path = std::move(path);
}

void TraceParser::fail(std::uint64_t line_number, const std::string& reason) const {
  throw TraceError(trace_.path + ":" + std::to_string(line_number) + ": " + reason);
}

std::uint16_t TraceParser::stream_or_fail(std::string_view field, std::uint64_t line_number,
                                          const char* expected) const {
  std::uint64_t stream = 0;
  if (!parse_u64(field, stream)) fail(line_number, expected);
  if (stream >= kMaxStreams)
    fail(line_number, "stream " + std::to_string(stream) + " is too large (streams are " +
                          "numbered from 0, below " + std::to_string(kMaxStreams) + ")");
  return static_cast<std::uint16_t>(stream);
}

void TraceParser::add_line(std::string_view raw, std::uint64_t line_number) {
  if (raw.size() > kMaxLineBytes)
    fail(line_number, "line longer than " + std::to_string(kMaxLineBytes) +
                          " bytes (a trace line has at most 71, comments at most " +
                          std::to_string(kMaxLineBytes) + "): " + quoted(raw));
  const std::string_view line = trim_right(raw);
  if (line.empty()) return;
  if (line.front() == '#') {
    int version = 1;
    check_version_comment(line, &version);
    if (version != 1 && version != 2)
      fail(line_number, "trace format v" + std::to_string(version) +
                            " is not supported (this reader knows v1 and v2)");
    return;
  }
  std::array<std::string_view, 6> f;
  const std::size_t n = split(line, f);
  const std::string_view kind = f[0];
  // The blocks of a restore follow its r line; any other line ends it.
  if (kind != "y" && kind != "o") restore_event_ = 0;
  Event ev;
  if (kind == "a") {
    std::uint64_t id = 0;
    if (n < 4 || n > 6 || !parse_u64(f[1], id) || !parse_u64(f[2], ev.size))
      fail(line_number, std::string(kExpectAlloc) + ", got " + quoted(line));
    ev.stream = stream_or_fail(f[3], line_number, kExpectAlloc);
    const std::uint16_t tag = n >= 5 ? tag_or_fail(f[4], line_number, kExpectAlloc, line) : 0;
    const std::uint16_t pool =
        n == 6 ? pool_or_fail(f[5], line_number, kExpectAlloc, line, false, true) : 0;
    if (pool != 0 && pools_[pool].route_line == 0)
      fail(line_number, "allocation routed to pool " + std::to_string(pool) +
                            ", to which no route is on (a g or t line begins one)");
    ev.kind = EventKind::alloc;
    ev.slot = add_live(id, Live{0, ev.stream, tag, ev.size, line_number, pool}, line_number);
  } else if (kind == "f" || kind == "u") {
    const bool is_free = kind == "f";
    const char* expected = is_free ? kExpectFree : kExpectUse;
    std::uint64_t id = 0;
    if (n != (is_free ? 2u : 3u) || !parse_u64(f[1], id))
      fail(line_number, std::string(expected) + ", got " + quoted(line));
    if (!is_free) ev.stream = stream_or_fail(f[2], line_number, expected);
    auto it = live_.find(id);
    if (it == live_.end())
      fail(line_number, std::string(is_free ? "free" : "use") + " of ID " + std::to_string(id) +
                            ", which is not live (never allocated, or already freed)");
    ev.slot = it->second.slot;
    if (is_free) {
      ev.kind = EventKind::free;
      ev.stream = it->second.stream;
      remove_live(it);
      ++trace_.frees;
    } else {
      ev.kind = EventKind::use;
      ++trace_.uses;
    }
  } else if (kind == "s") {
    if (n != 2) fail(line_number, std::string(kExpectWait) + ", got " + quoted(line));
    ev.kind = EventKind::host_wait;
    ev.stream = stream_or_fail(f[1], line_number, kExpectWait);
    ++trace_.host_waits;
  } else if (kind == "c") {
    if (n != 1) fail(line_number, std::string(kExpectEmpty) + ", got " + quoted(line));
    ev.kind = EventKind::empty_cache;
    ++trace_.empty_caches;
  } else if (kind == "n" || kind == "z" || kind == "w") {
    add_tag_line(kind.front(), std::span<const std::string_view>(f.data(), std::min(n, f.size())),
                 line_number, line);
    return;
  } else if (kind.size() == 1 &&
             std::string_view("pxgtekryo").find(kind.front()) != std::string_view::npos) {
    add_pool_line(kind.front(), std::span<const std::string_view>(f.data(), std::min(n, f.size())),
                  line_number, line);
    return;
  } else {
    fail(line_number, "unknown event " + quoted(line) + " (lines are " + kLines + ")");
  }
  if (ev.kind != EventKind::free) note_stream(ev.stream);
  trace_.events.push_back(ev);
}

void TraceParser::note_stream(std::uint16_t stream) {
  if (stream >= stream_seen_.size()) stream_seen_.resize(stream + 1u);
  stream_seen_[stream] = true;
}

std::uint32_t TraceParser::add_live(std::uint64_t id, const Live& entry,
                                    std::uint64_t line_number) {
  if (trace_.allocations == std::numeric_limits<std::uint32_t>::max())
    fail(line_number, "too many allocations (more than 2^32 - 1)");
  Live live = entry;
  live.slot = trace_.allocations;
  auto [it, inserted] = live_.try_emplace(id, live);
  if (!inserted)
    fail(line_number, "ID " + std::to_string(id) + " is already live (allocated at line " +
                          std::to_string(it->second.line) + " and not freed)");
  const std::uint16_t tag = live.tag;
  if (tag != 0) {
    TagBook& book = tags_[tag];
    if (book.asleep_line != 0)
      fail(line_number, "allocation under tag " + tag_label(tag) + ", asleep since line " +
                            std::to_string(book.asleep_line) +
                            " (requests under a sleeping tag are refused)");
    book.known = true;
    book.live_bytes += live.size;
  }
  if (tag != 0 || !trace_.alloc_tags.empty()) {  // from the first tagged allocation on
    trace_.alloc_tags.resize(trace_.allocations, 0);
    trace_.alloc_tags.push_back(tag);
  }
  if (live.pool != 0 || !trace_.alloc_pools.empty()) {  // from the first routed one on
    trace_.alloc_pools.resize(trace_.allocations, 0);
    trace_.alloc_pools.push_back(live.pool);
  }
  if (live.pool != 0) {
    PoolBook& book = pools_[live.pool];
    book.live_bytes += live.size;
    trace_.pool_peak_live[live.pool] = std::max(trace_.pool_peak_live[live.pool], book.live_bytes);
  }
  ++trace_.allocations;
  live_bytes_ += live.size;
  if (live_bytes_ > trace_.peak_live_bytes) trace_.peak_live_bytes = live_bytes_;
  return live.slot;
}

void TraceParser::remove_live(std::unordered_map<std::uint64_t, Live>::iterator it) {
  // A sleeping tag's blocks may be freed (the books only): its bytes left the awake
  // sum at the sleep.
  const Live& live = it->second;
  if (live.tag == 0 || tags_[live.tag].asleep_line == 0) live_bytes_ -= live.size;
  if (live.tag != 0) tags_[live.tag].live_bytes -= live.size;
  if (live.pool != 0) pools_[live.pool].live_bytes -= live.size;
  live_.erase(it);
}

std::string TraceParser::tag_label(std::uint16_t tag) const {
  return "'" + trace_.tag_names[tag] + "' (number " + std::to_string(tag) + ")";
}

std::uint16_t TraceParser::tag_or_fail(std::string_view field, std::uint64_t line_number,
                                       const char* expected, std::string_view line) const {
  std::uint64_t tag = 0;
  if (!parse_u64(field, tag)) fail(line_number, std::string(expected) + ", got " + quoted(line));
  if (tag != 0 && (tag >= tags_.size() || tags_[tag].declared_line == 0))
    fail(line_number, "tag " + std::to_string(tag) +
                          " is not declared (an n,TAG,NAME line names a tag before its use)");
  return static_cast<std::uint16_t>(tag);
}

void TraceParser::add_tag_line(char kind, std::span<const std::string_view> f,
                               std::uint64_t line_number, std::string_view line) {
  if (kind == 'n') {
    std::uint64_t tag = 0;
    if (f.size() != 3 || !parse_u64(f[1], tag))
      fail(line_number, std::string(kExpectName) + ", got " + quoted(line));
    if (tag == 0 || tag >= kMaxTags)
      fail(line_number, "tag number " + std::to_string(tag) + " is out of range (1 to " +
                            std::to_string(kMaxTags - 1) + "; 0 is no tag)");
    const std::string problem = tag_name_problem(f[2]);
    if (!problem.empty())
      fail(line_number, "tag name " + quoted(f[2]) + " cannot be a tag: " + problem);
    if (tag >= tags_.size()) {
      tags_.resize(tag + 1);
      trace_.tag_names.resize(tag + 1);
    }
    if (tags_[tag].declared_line != 0)
      fail(line_number, "tag number " + std::to_string(tag) + " is already declared (line " +
                            std::to_string(tags_[tag].declared_line) + ")");
    const std::string name(f[2]);
    auto [it, inserted] = tag_numbers_.try_emplace(name, static_cast<std::uint16_t>(tag));
    if (!inserted)
      fail(line_number, "tag " + quoted(f[2]) + " is already number " + std::to_string(it->second) +
                            " (line " + std::to_string(tags_[it->second].declared_line) + ")");
    tags_[tag].declared_line = line_number;
    trace_.tag_names[tag] = name;
    return;
  }
  const bool sleep = kind == 'z';
  const char* expected = sleep ? kExpectSleep : kExpectWake;
  if (sleep ? f.size() != 3 : (f.size() != 2 && f.size() != 3))
    fail(line_number, std::string(expected) + ", got " + quoted(line));
  const std::uint16_t tag = tag_or_fail(f[1], line_number, expected, line);
  if (tag == 0) fail(line_number, "tag 0 is no tag: it cannot sleep or wake");
  TagBook& book = tags_[tag];
  const bool known = book.known;
  book.known = true;
  Event ev;
  ev.slot = tag;
  if (sleep) {
    if (f[2] != "offload" && f[2] != "discard")
      fail(line_number, std::string(expected) + ", got " + quoted(line));
    if (book.asleep_line != 0)
      fail(line_number, "sleep of tag " + tag_label(tag) + ", asleep already since line " +
                            std::to_string(book.asleep_line));
    ev.kind = EventKind::sleep;
    ev.size = f[2] == "discard" ? kSleepDiscard : kSleepOffload;
    book.asleep_line = line_number;
    live_bytes_ -= book.live_bytes;
    ++trace_.sleeps;
  } else {
    // A tag's first line may wake it: it slept when the recording began.
    if (book.asleep_line == 0 && known)
      fail(line_number, "wake of tag " + tag_label(tag) + ", which is not asleep");
    ev.kind = EventKind::wake;
    ev.size = book.asleep_line == 0 ? kWakeNotAsleep : kWakeOnHost;
    if (f.size() == 3) {
      ev.stream = stream_or_fail(f[2], line_number, expected);
      if (ev.size == kWakeOnHost) ev.size = kWakeOnStream;
      note_stream(ev.stream);
    }
    book.asleep_line = 0;
    live_bytes_ += book.live_bytes;
    trace_.peak_live_bytes = std::max(trace_.peak_live_bytes, live_bytes_);
    ++trace_.wakes;
  }
  trace_.events.push_back(ev);
}

Trace TraceParser::finish() {
  trace_.live_at_end = live_.size();
  if (!trace_.alloc_tags.empty()) trace_.alloc_tags.resize(trace_.allocations, 0);
  if (!trace_.alloc_pools.empty()) trace_.alloc_pools.resize(trace_.allocations, 0);
  tags_.clear();
  pools_.clear();
  checkpoints_.clear();
  captures_on_ = 0;
  restore_event_ = 0;
  tag_numbers_.clear();
  for (std::size_t k = 0; k < stream_seen_.size(); ++k)
    if (stream_seen_[k]) trace_.stream_ids.push_back(static_cast<std::uint16_t>(k));
  trace_.streams = static_cast<std::uint32_t>(trace_.stream_ids.size());
  stream_seen_.clear();
  live_.clear();
  live_bytes_ = 0;
  trace_.events.shrink_to_fit();
  Trace out = std::move(trace_);
  trace_ = Trace{};
  return out;
}

Trace parse_trace_text(std::string_view text, const std::string& name) {
  TraceParser parser(name);
  std::uint64_t line_number = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    parser.add_line(text.substr(0, nl), ++line_number);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return parser.finish();
}

namespace {

// Bytes per read, and zlib's input buffer. Small on purpose: on damaged data zlib
// drops the whole chunk it was decompressing (up to twice its buffer, or one read),
// so the line a damage report names is at most this far before the damage.
constexpr std::size_t kChunk = std::size_t{1} << 14;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// gzopen and gzdopen read plain data transparently, so one code path serves both.
GzFile open_trace(const std::string& path, const std::string& name) {
  errno = 0;
  GzFile file;
  if (path == kStdinPath) {
    const int fd = dup(STDIN_FILENO);  // gzclose closes it, not standard input
    if (fd >= 0) {
      file.reset(gzdopen(fd, "rb"));
      if (!file) close(fd);
    }
  } else {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw TraceError(path + ": no such file");
    if (std::filesystem::is_directory(path, ec)) throw TraceError(path + ": is a directory");
    file.reset(gzopen(path.c_str(), "rb"));
  }
  if (!file)
    throw TraceError(name +
                     ": cannot open: " + (errno ? std::strerror(errno) : "out of memory in zlib"));
  gzbuffer(file.get(), static_cast<unsigned>(kChunk));
  return file;
}

// zlib's complaint about the stream so far ("" while it is sound), without the
// "PATH: " zlib puts before it. A truncated stream shows only here: gzread returns
// its data and then 0, as at a proper end.
std::string gzip_problem(gzFile_s* file) {
  int err = Z_OK;
  const char* msg = gzerror(file, &err);
  if (err == Z_OK || err == Z_STREAM_END) return "";
  if (msg == nullptr || *msg == '\0') return "zlib error " + std::to_string(err);
  const std::string_view text = msg;
  const std::size_t colon = text.rfind(": ");
  return std::string(colon == std::string_view::npos ? text : text.substr(colon + 2));
}

[[noreturn]] void throw_corrupt(const std::string& name, std::uint64_t line,
                                const std::string& problem) {
  throw TraceError(name + ": corrupt or truncated gzip data at line " + std::to_string(line) +
                   ": " + problem);
}

}  // namespace

Trace read_trace(const std::string& path) {
  const std::string name = path == kStdinPath ? kStdinName : path;
  GzFile file = open_trace(path, name);
  const bool compressed = gzdirect(file.get()) == 0;

  TraceParser parser(name);
  std::uint64_t line_number = 0;
  // A bad line in gzip data may be garbage from damage further on (the checksum is
  // at the end): read on, and if zlib then objects, report the damage instead.
  auto add_line = [&](std::string_view line) {
    ++line_number;
    try {
      parser.add_line(line, line_number);
    } catch (const TraceError&) {
      if (!compressed) throw;
      std::array<char, kChunk> sink;
      while (gzread(file.get(), sink.data(), static_cast<unsigned>(sink.size())) > 0) {
      }
      if (const std::string problem = gzip_problem(file.get()); !problem.empty())
        throw_corrupt(name, line_number, problem);
      throw;
    }
  };

  std::vector<char> buf(kChunk);
  std::string pending;  // the start of a line that continues in the next read
  bool first_read = true;
  while (true) {
    const int n = gzread(file.get(), buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) throw_corrupt(name, line_number + 1, gzip_problem(file.get()));
    if (n == 0) break;
    std::string_view chunk(buf.data(), static_cast<std::size_t>(n));
    if (first_read && !compressed && looks_binary(chunk))
      throw TraceError(name + ": not a trace (binary data): it starts " + quoted(chunk));
    first_read = false;
    for (std::size_t nl = chunk.find('\n'); nl != std::string_view::npos; nl = chunk.find('\n')) {
      if (pending.empty()) {
        add_line(chunk.substr(0, nl));
      } else {
        pending.append(chunk.substr(0, nl));
        add_line(pending);
        pending.clear();
      }
      chunk.remove_prefix(nl + 1);
    }
    pending.append(chunk);
    // A line that cannot be one: refused now, not held whole (add_line throws).
    if (pending.size() > kMaxLineBytes) add_line(pending);
  }
  // Checked before the last line: a cut stream ends inside a line, which must not
  // be reported as malformed.
  if (const std::string problem = gzip_problem(file.get()); !problem.empty())
    throw_corrupt(name, line_number + 1, problem);
  if (!pending.empty()) add_line(pending);
  return parser.finish();
}

}  // namespace reservoir::replay
