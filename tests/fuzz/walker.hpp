// Internals of the random-walk interpreter (random_walk.hpp): the input reader,
// the program model (live blocks, blocks in flight), the step tables and the
// Walker. random_walk.cpp runs the steps; walk_checks.cpp holds the checks and
// the bad-input steps.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/random_walk.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir::fuzz {

constexpr int kDevices = 2;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kCapacity = 256 * kMiB;
constexpr std::size_t kOneEiB = std::size_t{1} << 60;
constexpr std::size_t kMaxSteps = 4096;

// Thrown by a failed check; carries the description run_walk returns.
struct Finding : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define WALK_CHECK(cond, msg)                                                               \
  do {                                                                                      \
    if (!(cond))                                                                            \
      throw Finding(std::string("check failed: ") + #cond + " (" + std::string(msg) + ")"); \
  } while (0)

// How the allocator's messages print a pointer ("%p").
inline std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// The input bytes; past the end it reads zeros.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint16_t u16() {
    std::uint16_t lo = u8();
    return static_cast<std::uint16_t>(lo | (u8() << 8));
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// ---- tables (random_walk.cpp) ----

enum class Expect { ok, bad, either };
struct ConfigRow {
  const char* text;
  Expect expect;
};
extern const ConfigRow kConfigs[];
extern const std::size_t kConfigRows;
// Picked by a config byte of 0xF0 and above (older inputs keep their meaning below).
extern const ConfigRow kPolicyConfigs[];
extern const std::size_t kPolicyConfigRows;
extern const char* const kInitialConfigs[8];
// The request size of a size class (0 tiny ... 6 never fits, 7 zero) from 16 bits.
std::size_t size_for(int size_class, std::uint16_t s);

// ---- the model ----

struct Live {
  std::uintptr_t address;
  std::size_t requested;
  std::size_t block;
  int device;
  StreamHandle stream;
  std::uint64_t id;
  std::vector<StreamHandle> uses;  // other streams recorded with record_stream
  bool compact = false;            // allocated under policy:compact
  int pool = -1;                   // private pool slot serving it (-1 default, -2 released)
  // Of uses, those first recorded while a capture was under way on the block's device:
  // a free during a capture waits for none of them (the spec takes that work to be in
  // the graph, remove_cudagraph_stream_uses), a free after it for all.
  std::vector<StreamHandle> capture_uses{};
  bool tagged = false;  // made under the walk's tag (its own pool: sleeps with it)
};

// A private pool the walk made (walk_pools.cpp). The walk holds one use of it while
// it exists, and one more while routing to it is on.
struct PoolSlot {
  bool exists = false;
  PoolId id;
  int device = 0;
  int route = 0;  // 0 none, 1 this thread, 2 capture on stream
  StreamHandle stream = 0;
  std::uint64_t order = 0;  // begin order: the last route begun that accepts wins
  bool use_on_oom = false;  // may lend its free blocks to other requests
  std::optional<PoolCheckpoint> checkpoint;
};

// A block freed while other streams used it: its memory must not be handed out
// until each of those streams has advanced (or the allocator synchronized).
struct InFlight {
  std::uintptr_t lo, hi;
  std::vector<StreamHandle> waiting;
  // Per waiting stream, its work at the free (SimBackend::submitted): done once the
  // stream completed that far.
  std::vector<std::uint64_t> positions;
  // Freed under policy:compact: another stream may reuse it at once if the allocator
  // ordered that stream after the waiting ones on the device; and its pages must stay
  // mapped (their memory must not move) until the waiting streams completed.
  bool compact = false;
};

inline std::uint8_t pattern_byte(std::uint64_t id, std::size_t offset) {
  return static_cast<std::uint8_t>((id * 0x9E37u + offset * 31u + (offset >> 9)) ^ 0xA5u);
}

// Offsets written and checked: all bytes of small blocks; the first and last 64
// bytes and 7 chunks in between of larger ones.
template <class F>
void for_pattern(std::size_t n, F&& f) {
  if (n <= 4096) {
    for (std::size_t o = 0; o < n; ++o) f(o);
    return;
  }
  for (std::size_t o = 0; o < 64; ++o) f(o), f(n - 64 + o);
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t j = 0; j < 8; ++j) f(n / 8 * k + j);
}

class Walker {
 public:
  explicit Walker(Reader& in);
  // "" or the first finding.
  std::string run();

 private:
  using AllStats = std::array<DeviceStats, kDevices>;

  // random_walk.cpp: the steps.
  void step(std::uint8_t op);
  void op_alloc();
  // current: the request names device -1 (the current device, device here).
  void request(std::size_t size, StreamHandle stream, int device, bool current);
  // A free's argument of 0xFF: op_free_and_request_again().
  void free_live(std::uint8_t index);
  void op_free_and_request_again();
  void free_live_at(std::size_t i);
  void op_free_all();
  bool on_free_memory();
  void op_record_stream();
  void op_advance();
  void op_sync();
  void op_empty_cache();
  void op_fraction();
  void op_config();
  void op_fault();
  void op_reset_stats();

  // walk_pools.cpp: private pools (kOpDevice with an argument of 0x80 and up).
  void op_pool(std::uint8_t arg);
  // walk_pools.cpp: the walk's tag (an op_pool argument with bits 0x60 set): a
  // request under it, sleep (offload, discard), wake, its figures.
  void op_tag(std::uint8_t arg);
  void check_tag_state(int device);
  // The slot whose pool served a block allocated on device and stream.
  // The private pool slot that served a request (-1: the default pools); other_thread:
  // it ran on a thread of its own, which a route of this thread does not cover.
  int serving_slot(int device, StreamHandle stream, std::uintptr_t address,
                   bool other_thread = false);
  void pool_restore(PoolSlot& slot, int index);
  void check_capture();
  // A registering tracker (what NCCL's allocator hook does) holds every segment listed.
  void on_trace(const TraceEntry& e);
  void check_registered();
  bool capture_on() const;
  bool capture_on(int device) const;  // a capture route on that device
  // Under policy:compact: whether address lies in a compact arena (not a default pool's
  // segment, which serves requests during a capture).
  bool in_compact_arena(std::uintptr_t address) const;

  // walk_checks.cpp: checks, queries and bad inputs.
  void check_disjoint(const Live& l);
  void check_in_flight_mapped();
  void check_pattern(const Live& l);
  void check_books();
  void note_synchronizations(const AllStats& all);
  AllStats stats_all();
  std::vector<std::int64_t> snapshot();
  std::array<double, kDevices> fractions();
  void op_query();
  std::uintptr_t bad_pointer(std::uint8_t kind, std::uint8_t arg, const void* stack);
  void op_bad_input();

  Reader& in_;
  std::shared_ptr<SimBackend> sim_;
  std::unique_ptr<Allocator> alloc_;
  std::vector<Live> live_;
  std::map<std::uintptr_t, std::uintptr_t> shadow_;  // live block start -> end
  std::vector<InFlight> in_flight_;
  // Blocks whose free failed (a DeviceError): kept out of circulation for good.
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> kept_;
  std::array<bool, kDevices> kept_on_{};  // device d has a kept block
  // A DeviceError said that device memory stays held ("... until empty_cache() gives it
  // back"): a page may stay mapped, and a grow at its address during a capture, which
  // cannot give it back first, fails with DeviceError (docs/reliability.md).
  bool held_reported_ = false;
  void note_device_error(const DeviceError& e);
  std::vector<std::uintptr_t> freed_ = std::vector<std::uintptr_t>(16, 0x2000);
  std::size_t freed_next_ = 0;
  std::unique_ptr<int> heap_object_ = std::make_unique<int>(0);
  std::uintptr_t heap_probe_ = reinterpret_cast<std::uintptr_t>(heap_object_.get());
  std::uint64_t next_id_ = 1, ooms_ = 0;
  std::int64_t syncs_ = 0;
  int current_device_ = 0;
  const bool trace_ = std::getenv("RESERVOIR_WALK_TRACE") != nullptr;  // one line per step
  bool eager_ = false, fraction_set_ = false, explicit_fraction_ = false, compact_ = false;
  bool callback_on_ = false, capacity_changed_ = false;
  // The next request runs on a thread of its own that exits after it (its statistics
  // shard goes back to the ledger while the block lives on, freed by this thread).
  bool next_on_thread_ = false;
  bool fault_active_ = false, device_error_ok_ = false, expandable_seen_ = false;
  std::array<PoolSlot, 2> pools_{};
  // The walk's tag, per device: asleep, and whether its contents were discarded.
  static constexpr const char* kTag = "fuzz.walk";
  std::array<bool, kDevices> tag_asleep_{}, tag_discarded_{};
  // Woken on a stream: host copies may be kept until its copies are done.
  std::array<bool, kDevices> tag_woke_on_stream_{};
  bool tag_request_ = false;  // the next request() runs under the tag
  // The ranges a registering tracker holds, by (device, address); the entries that gave
  // back a range never given; false once expandable segments were on (their page runs
  // need not pair). Trackers may run on the walk's request threads: under the mutex.
  std::mutex registry_mutex_;
  std::map<std::pair<int, std::uintptr_t>, std::size_t> registered_;
  std::vector<std::string> unregistered_;
  bool pairs_ = true;
  std::uint64_t next_pool_ = 1, route_order_ = 0;
  struct DeviceHold {
    std::size_t used = 0, segments = 0, reservations = 0;
    bool valid = false;  // a capture was on at the last check
  };
  std::array<DeviceHold, kDevices> capture_hold_{};
};

}  // namespace reservoir::fuzz
