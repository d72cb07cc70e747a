// Trace format v1 parser (docs/trace_format.md). Strict on purpose: a trace that
// replays "almost" right gives memory figures nobody can trust, so every malformed
// line stops the read with its file and line number.
#include "trace_reader.hpp"

#include <zlib.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

namespace reservoir::replay {

namespace {

constexpr const char* kExpectAlloc = "expected a,ID,SIZE,STREAM";
constexpr const char* kExpectFree = "expected f,ID";
constexpr const char* kExpectUse = "expected u,ID,STREAM";
constexpr const char* kExpectWait = "expected s,STREAM";

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

// Unsigned decimal filling the whole field; false on anything else (sign, space,
// overflow, empty).
bool parse_u64(std::string_view field, std::uint64_t& value) {
  if (field.empty()) return false;
  const char* end = field.data() + field.size();
  auto [ptr, ec] = std::from_chars(field.data(), end, value);
  return ec == std::errc{} && ptr == end;
}

std::string quoted(std::string_view line) {
  constexpr std::size_t kMax = 60;
  std::string s = "'";
  s.append(line.substr(0, kMax));
  if (line.size() > kMax) s += "...";
  s += "'";
  return s;
}

std::string_view trim_right(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

// "# trace vN..." names the format version; only v1 is known.
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
  const std::string_view line = trim_right(raw);
  if (line.empty()) return;
  if (line.front() == '#') {
    int version = 1;
    check_version_comment(line, &version);
    if (version != 1)
      fail(line_number,
           "trace format v" + std::to_string(version) + " is not supported (this reader knows v1)");
    return;
  }
  std::array<std::string_view, 4> f;
  const std::size_t n = split(line, f);
  const std::string_view tag = f[0];
  Event ev;
  if (tag == "a") {
    std::uint64_t id = 0;
    if (n != 4 || !parse_u64(f[1], id) || !parse_u64(f[2], ev.size))
      fail(line_number, std::string(kExpectAlloc) + ", got " + quoted(line));
    ev.stream = stream_or_fail(f[3], line_number, kExpectAlloc);
    if (trace_.allocations == std::numeric_limits<std::uint32_t>::max())
      fail(line_number, "too many allocations (more than 2^32 - 1)");
    ev.kind = EventKind::alloc;
    ev.slot = trace_.allocations;
    auto [it, inserted] = live_.try_emplace(id, Live{ev.slot, ev.stream, ev.size, line_number});
    if (!inserted)
      fail(line_number, "ID " + std::to_string(id) + " is already live (allocated at line " +
                            std::to_string(it->second.line) + " and not freed)");
    ++trace_.allocations;
    live_bytes_ += ev.size;
    if (live_bytes_ > trace_.peak_live_bytes) trace_.peak_live_bytes = live_bytes_;
  } else if (tag == "f" || tag == "u") {
    const bool is_free = tag == "f";
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
      live_bytes_ -= it->second.size;
      live_.erase(it);
      ++trace_.frees;
    } else {
      ev.kind = EventKind::use;
      ++trace_.uses;
    }
  } else if (tag == "s") {
    if (n != 2) fail(line_number, std::string(kExpectWait) + ", got " + quoted(line));
    ev.kind = EventKind::host_wait;
    ev.stream = stream_or_fail(f[1], line_number, kExpectWait);
    ++trace_.host_waits;
  } else {
    fail(line_number,
         "unknown event " + quoted(line) +
             " (lines are a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM | # comment)");
  }
  if (ev.kind != EventKind::free && ev.stream >= trace_.streams) trace_.streams = ev.stream + 1u;
  trace_.events.push_back(ev);
}

Trace TraceParser::finish() {
  trace_.live_at_end = live_.size();
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

Trace read_trace(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw TraceError(path + ": no such file");
  if (std::filesystem::is_directory(path, ec)) throw TraceError(path + ": is a directory");
  // gzopen reads plain files transparently, so one code path serves both.
  struct Closer {
    void operator()(gzFile_s* f) const { gzclose(f); }
  };
  errno = 0;
  std::unique_ptr<gzFile_s, Closer> file(gzopen(path.c_str(), "rb"));
  if (!file)
    throw TraceError(path +
                     ": cannot open: " + (errno ? std::strerror(errno) : "out of memory in zlib"));
  gzbuffer(file.get(), 1 << 18);

  TraceParser parser(path);
  std::array<char, 4096> buf;
  std::string long_line;  // only used for lines longer than buf
  std::uint64_t line_number = 0;
  while (gzgets(file.get(), buf.data(), static_cast<int>(buf.size())) != nullptr) {
    std::string_view chunk(buf.data(), std::strlen(buf.data()));
    const bool complete = !chunk.empty() && chunk.back() == '\n';
    if (complete) chunk.remove_suffix(1);
    if (!complete && gzeof(file.get()) == 0) {  // the line continues in the next read
      long_line.append(chunk);
      continue;
    }
    if (!long_line.empty()) {
      long_line.append(chunk);
      parser.add_line(long_line, ++line_number);
      long_line.clear();
    } else {
      parser.add_line(chunk, ++line_number);
    }
  }
  if (!long_line.empty()) parser.add_line(long_line, ++line_number);
  int err = Z_OK;
  const char* msg = gzerror(file.get(), &err);
  if (err != Z_OK && err != Z_STREAM_END)
    throw TraceError(path + ":" + std::to_string(line_number + 1) +
                     ": cannot read (corrupt or truncated gzip data?): " + msg);
  return parser.finish();
}

}  // namespace reservoir::replay
