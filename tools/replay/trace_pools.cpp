// Trace format v2's private-pool lines (docs/trace_format.md): p (a use, the pool made
// when new), x (a use dropped), g and t (a route begins: a capture's, a thread's),
// e (it ends), k (checkpoint), r (restore) with its y (freed) and o (allocated again)
// lines. The rules are the engine's: a pool is not used after its last use is
// dropped, one route per pool at a time, no restore while a capture is under way.
#include <algorithm>
#include <limits>
#include <string>

#include "trace_reader.hpp"
#include "trace_text.hpp"

namespace reservoir::replay {

namespace {
constexpr const char* kExpectRetain =
    "expected p,POOL[,OPTIONS] (OPTIONS use_on_oom, no_split or use_on_oom+no_split)";
constexpr const char* kExpectRelease = "expected x,POOL[,empty]";
constexpr const char* kExpectCapture = "expected g,POOL[,STREAM]";
constexpr const char* kExpectThread = "expected t,POOL";
constexpr const char* kExpectEnd = "expected e,POOL";
constexpr const char* kExpectCheckpoint = "expected k,CKPT,POOL";
constexpr const char* kExpectRestore = "expected r,CKPT";
constexpr const char* kExpectRestoreFree = "expected y,ID";
constexpr const char* kExpectRestoreAlloc = "expected o,ID,OLDID";
// Pool numbers are below this (0 is no pool), as stream and tag numbers.
constexpr std::uint64_t kMaxPools = 1u << 16;

const char* expectation(char kind) {
  switch (kind) {
    case 'p':
      return kExpectRetain;
    case 'x':
      return kExpectRelease;
    case 'g':
      return kExpectCapture;
    case 't':
      return kExpectThread;
    case 'e':
      return kExpectEnd;
    case 'k':
      return kExpectCheckpoint;
    case 'r':
      return kExpectRestore;
    case 'y':
      return kExpectRestoreFree;
    default:
      return kExpectRestoreAlloc;
  }
}
}  // namespace

std::uint16_t TraceParser::pool_or_fail(std::string_view field, std::uint64_t line_number,
                                        const char* expected, std::string_view line,
                                        bool may_be_new, bool none_allowed) {
  std::uint64_t pool = 0;
  if (!parse_u64(field, pool)) fail(line_number, std::string(expected) + ", got " + quoted(line));
  if (pool == 0 && none_allowed) return 0;
  if (pool == 0 || pool >= kMaxPools)
    fail(line_number, "pool number " + std::to_string(pool) + " is out of range (1 to " +
                          std::to_string(kMaxPools - 1) + "; 0 is no pool)");
  if (pool >= pools_.size()) {
    pools_.resize(pool + 1);
    trace_.pool_peak_live.resize(pool + 1, 0);
    trace_.pools = std::max<std::uint32_t>(trace_.pools, static_cast<std::uint32_t>(pool));
  }
  PoolBook& book = pools_[pool];
  if (book.first_line == 0 && !may_be_new)
    fail(line_number, "pool " + std::to_string(pool) +
                          " is not known (a p, g or t line names a pool before its other lines)");
  if (book.released_line != 0)
    fail(line_number, "pool " + std::to_string(pool) + " was released at line " +
                          std::to_string(book.released_line) +
                          " (its last use dropped: a released pool is not used again)");
  if (book.first_line == 0) book.first_line = line_number;
  return static_cast<std::uint16_t>(pool);
}

void TraceParser::add_pool_line(char kind, std::span<const std::string_view> f,
                                std::uint64_t line_number, std::string_view line) {
  const char* expected = expectation(kind);
  auto malformed = [&] { fail(line_number, std::string(expected) + ", got " + quoted(line)); };
  Event ev;
  switch (kind) {
    case 'p': {
      if (f.size() != 2 && f.size() != 3) malformed();
      if (f.size() == 3) {
        if (f[2] == "use_on_oom")
          ev.size = kPoolUseOnOom;
        else if (f[2] == "no_split")
          ev.size = kPoolNoSplit;
        else if (f[2] == "use_on_oom+no_split")
          ev.size = kPoolUseOnOom | kPoolNoSplit;
        else
          malformed();
      }
      ev.kind = EventKind::pool_retain;
      ev.slot = pool_or_fail(f[1], line_number, expected, line, true);
      ++pools_[ev.slot].uses;
      break;
    }
    case 'x': {
      if ((f.size() != 2 && f.size() != 3) || (f.size() == 3 && f[2] != "empty")) malformed();
      ev.kind = EventKind::pool_release;
      ev.slot = pool_or_fail(f[1], line_number, expected, line, false);
      ev.size = f.size() == 3 ? 1 : 0;
      PoolBook& book = pools_[ev.slot];
      if (--book.uses == 0) book.released_line = line_number;
      break;
    }
    case 'g':
    case 't': {
      const bool capture = kind == 'g';
      if (capture ? (f.size() != 2 && f.size() != 3) : f.size() != 2) malformed();
      ev.kind = EventKind::route_begin;
      ev.slot = pool_or_fail(f[1], line_number, expected, line, true);
      ev.size = capture ? kRouteCapture : kRouteThread;
      if (f.size() == 3) {
        ev.stream = stream_or_fail(f[2], line_number, expected);
        ev.size = kRouteCaptureOnStream;
        note_stream(ev.stream);
      }
      PoolBook& book = pools_[ev.slot];
      if (book.route_line != 0)
        fail(line_number, "a route to pool " + std::to_string(ev.slot) + " is on already (line " +
                              std::to_string(book.route_line) + "; one route per pool)");
      book.route_line = line_number;
      book.capture = capture;
      ++book.uses;
      if (capture) {
        ++captures_on_;
        ++trace_.captures;
      }
      break;
    }
    case 'e': {
      if (f.size() != 2) malformed();
      ev.kind = EventKind::route_end;
      ev.slot = pool_or_fail(f[1], line_number, expected, line, false);
      PoolBook& book = pools_[ev.slot];
      if (book.route_line == 0)
        fail(line_number,
             "end of a route to pool " + std::to_string(ev.slot) + ", which has none on");
      book.route_line = 0;
      if (book.capture) --captures_on_;
      break;
    }
    case 'k': {
      std::uint64_t number = 0;
      if (f.size() != 3 || !parse_u64(f[1], number) || number == 0) malformed();
      if (number > std::numeric_limits<std::uint32_t>::max())
        fail(line_number, "checkpoint number " + std::to_string(number) + " is too large");
      ev.kind = EventKind::checkpoint;
      ev.slot = static_cast<std::uint32_t>(number);
      const std::uint16_t pool = pool_or_fail(f[2], line_number, expected, line, false);
      ev.size = pool;
      CheckpointBook& book = checkpoints_[number];
      if (book.line != 0)
        fail(line_number, "checkpoint " + std::to_string(number) + " is already declared (line " +
                              std::to_string(book.line) + ")");
      book.line = line_number;
      book.pool = pool;
      for (const auto& [id, live] : live_)
        if (live.pool == pool) book.blocks.emplace(id, live);
      ++trace_.checkpoints;
      break;
    }
    case 'r': {
      std::uint64_t number = 0;
      if (f.size() != 2 || !parse_u64(f[1], number)) malformed();
      const auto it = checkpoints_.find(number);
      if (it == checkpoints_.end())
        fail(line_number,
             "restore of checkpoint " + std::to_string(number) + ", which no k line declared");
      if (captures_on_ != 0)
        fail(line_number, "restore of checkpoint " + std::to_string(number) +
                              " while a capture is under way (restores are refused then)");
      if (const std::uint64_t released = pools_[it->second.pool].released_line; released != 0)
        fail(line_number, "restore of checkpoint " + std::to_string(number) + " of pool " +
                              std::to_string(it->second.pool) + ", released at line " +
                              std::to_string(released));
      ev.kind = EventKind::restore;
      ev.slot = static_cast<std::uint32_t>(number);
      trace_.events.push_back(ev);
      ++trace_.restores;
      restore_event_ = trace_.events.size();
      return;
    }
    case 'y': {
      std::uint64_t id = 0;
      if (f.size() != 2 || !parse_u64(f[1], id)) malformed();
      if (restore_event_ == 0) fail(line_number, "y line outside a restore (it follows an r line)");
      auto it = live_.find(id);
      if (it == live_.end())
        fail(line_number, "restore's free of ID " + std::to_string(id) +
                              ", which is not live (never allocated, or already freed)");
      ev.kind = EventKind::restore_free;
      ev.slot = it->second.slot;
      ev.stream = it->second.stream;
      remove_live(it);
      break;
    }
    default: {  // 'o'
      std::uint64_t id = 0, old = 0;
      if (f.size() != 3 || !parse_u64(f[1], id) || !parse_u64(f[2], old)) malformed();
      if (restore_event_ == 0) fail(line_number, "o line outside a restore (it follows an r line)");
      const std::uint64_t number = trace_.events[restore_event_ - 1].slot;
      const CheckpointBook& book = checkpoints_.at(number);
      const auto then = book.blocks.find(old);
      if (then == book.blocks.end())
        fail(line_number, "ID " + std::to_string(old) + " was not a live block of pool " +
                              std::to_string(book.pool) + " at checkpoint " +
                              std::to_string(number) + " (line " + std::to_string(book.line) + ")");
      Live entry = then->second;
      entry.line = line_number;
      ev.kind = EventKind::restore_alloc;
      ev.stream = entry.stream;
      ev.size = then->second.slot;
      ev.slot = add_live(id, entry, line_number);
      break;
    }
  }
  if (kind == 'y' || kind == 'o') ++trace_.events[restore_event_ - 1].size;
  trace_.events.push_back(ev);
}

}  // namespace reservoir::replay
