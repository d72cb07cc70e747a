// Reading trace formats v1 and v2 (docs/trace_format.md) into a compact, replay-ready form.
//
//   reservoir::replay::Trace t = reservoir::replay::read_trace("traces/x.trace.gz");
//
// The file is parsed once; every replay (each config, each fit step) walks the same
// vector of 16-byte events. IDs are turned into dense slots at parse time so a replay
// indexes a plain vector instead of hashing: slot k is the k-th allocation of the file,
// and a free or use names the slot of the allocation it refers to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace reservoir::replay {

// A malformed or unreadable trace. what() is "PATH:LINE: reason" (or "PATH: reason"
// when no line is involved), so the user can open the file at the right place.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class EventKind : std::uint8_t {
  alloc,        // a,ID,SIZE,STREAM[,TAG]
  free,         // f,ID
  use,          // u,ID,STREAM (record_stream)
  host_wait,    // s,STREAM
  sleep,        // z,TAG,MODE (v2)
  wake,         // w,TAG[,STREAM] (v2)
  empty_cache,  // c (v2)
  // Private pools (v2; docs/trace_format.md):
  pool_retain,    // p,POOL[,OPTIONS]: slot = pool; size = kPoolUseOnOom | kPoolNoSplit bits
  pool_release,   // x,POOL[,empty]: slot = pool; size = 1 with empty
  route_begin,    // g,POOL[,STREAM] | t,POOL: slot = pool; size = kRoute*; stream
  route_end,      // e,POOL: slot = pool
  checkpoint,     // k,CKPT,POOL: slot = CKPT; size = pool
  restore,        // r,CKPT: slot = CKPT; size = the restore_* events that follow it
  restore_free,   // y,ID: slot = the allocation the restore freed
  restore_alloc,  // o,ID,OLDID: slot = the new allocation; size = OLDID's slot; stream
};

// What Event::size holds for sleep and wake.
inline constexpr std::uint64_t kSleepOffload = 0, kSleepDiscard = 1;
inline constexpr std::uint64_t kWakeOnHost = 0, kWakeOnStream = 1;
// A wake of a tag that slept since before the trace began (recording started while it
// slept): in a replay, where it never slept, there is nothing to wake.
inline constexpr std::uint64_t kWakeNotAsleep = 2;
// What Event::size holds for pool_retain and route_begin.
inline constexpr std::uint64_t kPoolUseOnOom = 1, kPoolNoSplit = 2;
inline constexpr std::uint64_t kRouteCapture = 0, kRouteCaptureOnStream = 1, kRouteThread = 2;

// Invariant: for alloc and restore_alloc, slot == number of allocations before it in
// the trace; for free, use and restore_free, slot names an earlier allocation that is
// live at this point; for sleep and wake, slot is a declared tag number (<
// Trace::tag_names.size(), not 0), awake before a sleep and, unless size ==
// kWakeNotAsleep, asleep before a wake; for pool events slot is a pool number (1 to
// Trace::pools), and an alloc whose alloc_pools entry is not 0 has a route to that pool
// on; a restore is followed by exactly size restore_free and restore_alloc events;
// stream < Trace::streams.
struct Event {
  std::uint64_t size = 0;    // alloc: bytes requested; sleep: kSleep*; wake: kWake*; else 0
  std::uint32_t slot = 0;    // alloc/free/use: dense allocation index; sleep/wake: tag number
  std::uint16_t stream = 0;  // alloc/use/host_wait/wake on a stream: that stream;
                             // free: the allocating stream
  EventKind kind = EventKind::alloc;
};
static_assert(sizeof(Event) == 16, "events are kept compact: traces hold millions");

struct Trace {
  std::string path;  // as given, for messages
  std::vector<Event> events;
  std::uint32_t allocations = 0;  // number of alloc events (= slots)
  // Stream numbers used, ascending, and how many (streams == stream_ids.size()):
  // a trace on streams 3 and 65535 has 2. Per-stream tables indexed by the number
  // are stream_ids.back() + 1 long.
  std::vector<std::uint16_t> stream_ids;
  std::uint32_t streams = 0;
  std::uint64_t frees = 0, uses = 0, host_waits = 0, sleeps = 0, wakes = 0, empty_caches = 0;
  // Tags (v2): tag_names[k] is the name of tag number k ("" for 0, no tag, and for
  // numbers never declared); empty when the trace declares none. alloc_tags[slot] is
  // the tag number of allocation slot; empty when no allocation carries a tag.
  std::vector<std::string> tag_names;
  std::vector<std::uint16_t> alloc_tags;
  // Private pools (v2): numbers 1..pools; alloc_pools[slot] is the pool allocation slot
  // was routed to (0: none), empty when none was. pool_peak_live[k]: the highest sum
  // of live requested bytes routed to pool k (index 0 unused).
  std::uint32_t pools = 0;
  std::vector<std::uint16_t> alloc_pools;
  std::vector<std::uint64_t> pool_peak_live;
  std::uint64_t captures = 0, checkpoints = 0, restores = 0;
  // Highest sum of live requested bytes whose tag is awake: what any allocator must
  // hold at least (a sleeping tag's blocks need no device memory).
  std::uint64_t peak_live_bytes = 0;
  // Allocations never freed (e.g. model weights).
  std::uint64_t live_at_end = 0;
};

// Streams are small numbers (docs/trace_format.md); larger ones are refused so a
// replay can keep per-stream state in a vector.
inline constexpr std::uint32_t kMaxStreams = 1u << 16;

// The longest line a reader accepts, comments included. The longest event line is
// 49 bytes ("a," 20-digit ID "," 20-digit SIZE "," 5-digit STREAM); the limit leaves
// room for trailing blanks and long comments while bounding what a reader holds:
// a file that is not a trace (one long line of gigabytes) stops here, at once.
inline constexpr std::size_t kMaxLineBytes = 4096;

// Parses lines one at a time. Used by read_trace and parse_trace_text; exposed so a
// caller can feed lines from any source.
class TraceParser {
 public:
  explicit TraceParser(std::string path);
  // Parses one line (without its newline; a trailing '\r' is tolerated). line_number
  // is 1-based and only used in messages. Throws TraceError (also for a line longer
  // than kMaxLineBytes).
  void add_line(std::string_view line, std::uint64_t line_number);
  // Returns the trace; the parser is left empty.
  Trace finish();

 private:
  [[noreturn]] void fail(std::uint64_t line_number, const std::string& reason) const;
  std::uint16_t stream_or_fail(std::string_view field, std::uint64_t line_number,
                               const char* expected) const;

  // The v2 lines of tags: n (a tag's name), z (sleep), w (wake); and a's tag field.
  void add_tag_line(char kind, std::span<const std::string_view> f, std::uint64_t line_number,
                    std::string_view line);
  // The v2 lines of private pools: p, x, g, t, e, k, r, y, o (trace_pools.cpp).
  void add_pool_line(char kind, std::span<const std::string_view> f, std::uint64_t line_number,
                     std::string_view line);
  // The pool number of field, or fail: 1 to 65535 (0, no pool, where none is allowed);
  // named before by a p, g or t line unless it may be new (those lines), and not
  // released.
  std::uint16_t pool_or_fail(std::string_view field, std::uint64_t line_number,
                             const char* expected, std::string_view line, bool may_be_new,
                             bool none_allowed = false);
  // The tag number of field (declared by an earlier n line), or fail.
  std::uint16_t tag_or_fail(std::string_view field, std::uint64_t line_number, const char* expected,
                            std::string_view line) const;
  std::string tag_label(std::uint16_t tag) const;
  void note_stream(std::uint16_t stream);  // a stream the trace uses

  struct Live {
    std::uint32_t slot;
    std::uint16_t stream;
    std::uint16_t tag;
    std::uint64_t size;
    std::uint64_t line;  // where it was allocated, for "ID reused" messages
    std::uint16_t pool = 0;
  };
  // An allocation becomes live (a or o line): a new slot, the books of its tag, pool
  // and bytes. Fails for an ID live already, or a tag asleep.
  std::uint32_t add_live(std::uint64_t id, const Live& entry, std::uint64_t line_number);
  // An allocation stops being live (f or y line): the books of its tag, pool and bytes.
  void remove_live(std::unordered_map<std::uint64_t, Live>::iterator it);
  // A private pool's state while parsing, by pool number.
  struct PoolBook {
    std::uint64_t first_line = 0;     // 0: not named yet
    std::int64_t uses = 0;            // p, g and t add one; x drops one
    std::uint64_t route_line = 0;     // the g or t line of the route on; 0: none
    bool capture = false;             // that route is a capture's
    std::uint64_t released_line = 0;  // the x line that dropped the last use
    std::uint64_t live_bytes = 0;     // of live allocations routed to it
  };
  struct CheckpointBook {
    std::uint64_t line = 0;  // 0: not declared
    std::uint16_t pool = 0;
    std::unordered_map<std::uint64_t, Live> blocks;  // routed to the pool and live then, by ID
  };
  std::vector<PoolBook> pools_;                                    // by pool number
  std::unordered_map<std::uint64_t, CheckpointBook> checkpoints_;  // by CKPT
  std::uint64_t captures_on_ = 0;                                  // capture routes on
  std::size_t restore_event_ = 0;  // the open restore's event + 1; 0: none open
  // A tag's state while parsing, by tag number.
  struct TagBook {
    std::uint64_t declared_line = 0;  // 0: not declared
    std::uint64_t live_bytes = 0;     // of its live allocations
    std::uint64_t asleep_line = 0;    // the sleep that put it to sleep; 0: awake
    bool known = false;  // an earlier line showed its state (an allocation, sleep or wake)
  };
  Trace trace_;
  std::unordered_map<std::uint64_t, Live> live_;  // file ID -> allocation
  std::uint64_t live_bytes_ = 0;                  // of live allocations whose tag is awake
  std::vector<TagBook> tags_;
  std::unordered_map<std::string, std::uint16_t> tag_numbers_;  // name -> number
  std::vector<bool> stream_seen_;                               // by stream number; grown on demand
};

// The path that means standard input, and the name messages give it.
inline constexpr const char* kStdinPath = "-";
inline constexpr const char* kStdinName = "<stdin>";

// Reads a trace file, or standard input for kStdinPath, plain or gzip-compressed
// (detected from the content, not the name). Throws TraceError for a missing or
// unreadable file, a malformed line (one longer than kMaxLineBytes as soon as that
// many bytes are read), plain data that is not text ("PATH: not a trace (binary
// data): it starts '\x7fELF...'"), and a corrupt or truncated gzip stream:
//   "PATH: corrupt or truncated gzip data at line N: unexpected end of file"
// (N: the first line not read whole). Damaged gzip data is reported as such, never
// as the malformed line it may decompress to.
Trace read_trace(const std::string& path);

// Parses trace text held in memory; name is used in messages.
Trace parse_trace_text(std::string_view text, const std::string& name);

}  // namespace reservoir::replay
