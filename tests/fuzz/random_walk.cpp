// The random-walk interpreter (random_walk.hpp): the tables of sizes and
// configurations, and the steps. The checks after each step and the bad-input
// steps are in walk_checks.cpp.
#include <algorithm>
#include <iterator>
#include <thread>

#include "fuzz/walker.hpp"

namespace reservoir::fuzz {

// Rows the config step picks from: each key with valid and malformed values.
// expandable_segments may be refused by an engine without support: either is fine.
const ConfigRow kConfigs[] = {
    {"max_split_size_mb:21", Expect::ok},
    {"max_split_size_mb:64", Expect::ok},
    {"max_split_size_mb:200", Expect::ok},
    {"max_split_size_mb:99999999999999", Expect::ok},
    {"max_split_size_mb:20", Expect::bad},
    {"max_split_size_mb:-1", Expect::bad},
    {"max_split_size_mb:abc", Expect::bad},
    {"max_non_split_rounding_mb:0", Expect::ok},
    {"max_non_split_rounding_mb:64", Expect::ok},
    {"max_non_split_rounding_mb:x", Expect::bad},
    {"roundup_power2_divisions:4", Expect::ok},
    {"roundup_power2_divisions:1", Expect::ok},
    {"roundup_power2_divisions:[1:4,2:2,>:8]", Expect::ok},
    {"roundup_power2_divisions:[256:1,512:2,>:16]", Expect::ok},
    {"roundup_power2_divisions:3", Expect::bad},
    {"roundup_power2_divisions:[256:1", Expect::bad},
    {"roundup_power2_divisions:[3:4]", Expect::bad},
    {"garbage_collection_threshold:0.5", Expect::ok},
    {"garbage_collection_threshold:0.99", Expect::ok},
    {"garbage_collection_threshold:1.0", Expect::bad},
    {"garbage_collection_threshold:nan", Expect::bad},
    {"expandable_segments:True", Expect::either},
    {"expandable_segments:False", Expect::either},
    {"expandable_segments:maybe", Expect::bad},
    {"expandable_segments_reserve:64MiB", Expect::either},
    {"expandable_segments_reserve:0", Expect::bad},
    {"release_lock_on_cudamalloc:True", Expect::ok},
    {"release_lock_on_cudamalloc:False", Expect::ok},
    {"graph_capture_record_stream_reuse:True", Expect::ok},
    {"graph_capture_record_stream_reuse:False", Expect::ok},
    {"graph_capture_record_stream_reuse:maybe", Expect::bad},
    {"per_process_memory_fraction:0.75", Expect::ok},
    {"per_process_memory_fraction:1.0", Expect::ok},
    {"per_process_memory_fraction:2", Expect::bad},
    {"backend:native", Expect::ok},
    {"backend:cudaMallocAsync", Expect::bad},
    {"no_such_key:1", Expect::bad},
    {"max_split_size_mb", Expect::bad},
    {",,", Expect::ok},
    {"pinned_use_cuda_host_register:True", Expect::ok},
    {"max_split_size_mb:64,roundup_power2_divisions:2,garbage_collection_threshold:0.6",
     Expect::ok},
    {"max_split_size_mb:64,garbage_collection_threshold:2", Expect::bad},
};
const std::size_t kConfigRows = sizeof(kConfigs) / sizeof(kConfigs[0]);

const ConfigRow kPolicyConfigs[] = {
    {"policy:compact", Expect::ok},
    {"policy:pytorch", Expect::ok},
    {"policy:compact,per_process_memory_fraction:0.5", Expect::ok},
    {"policy:tidy", Expect::bad},
};
const std::size_t kPolicyConfigRows = sizeof(kPolicyConfigs) / sizeof(kPolicyConfigs[0]);

// Starting configurations, picked by the first byte.
const char* const kInitialConfigs[8] = {
    "",
    "max_split_size_mb:64",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
    "release_lock_on_cudamalloc:True",
    "expandable_segments:True",
    "max_split_size_mb:21,max_non_split_rounding_mb:0",
    "roundup_power2_divisions:[1:2,>:8]",
};

std::size_t size_for(int size_class, std::uint16_t s) {
  // Boundaries of the size policy and of the device (capacity 256 MiB).
  static constexpr std::size_t kEdges[16] = {
      512,     1 * kMiB, 2 * kMiB,  10 * kMiB, 20 * kMiB, 21 * kMiB,  64 * kMiB, 256 * kMiB,
      1 << 12, 3 * kMiB, 12 * kMiB, 22 * kMiB, 40 * kMiB, 128 * kMiB, 5 * kMiB,  255 * kMiB};
  static constexpr std::size_t kHuge[8] = {
      kOneEiB,      kOneEiB - 1,          ~std::size_t{0}, ~std::size_t{0} - 511,
      kOneEiB >> 1, std::size_t{1} << 40, 257 * kMiB,      512 * kMiB};
  switch (size_class) {
    case 0:
      return 1 + s % 512;  // tiny
    case 1:
      return 1 + std::size_t{s} * 16;  // small: up to 1 MiB
    case 2:
      return kMiB + std::size_t{s} * 144;  // 1-10 MiB
    case 3:
      return 10 * kMiB + std::size_t{s} * 1024;  // 10-74 MiB
    case 4:
      return 64 * kMiB + std::size_t{s} * 4096;  // up to 320 MiB
    case 5:
      return kEdges[s % 16] + (s >> 4) % 3 - 1;  // an edge, -1/0/+1
    case 6:
      return kHuge[s % 8];  // never fits
    default:
      return 0;
  }
}

namespace {
std::string where(std::size_t steps, std::uint8_t op) {
  return "step " + std::to_string(steps) + " (opcode " + std::to_string(op) + "): ";
}
}  // namespace

Walker::Walker(Reader& in) : in_(in) {
  SimOptions options;
  options.capacity = kCapacity;
  options.device_count = kDevices;
  options.host_backed = true;
  // The walk completes work itself (advance, sync ops) and tracks it: the program's
  // host waits (notify_host_wait) complete nothing on its device.
  options.completion = SimCompletion::manual;
  sim_ = std::make_shared<SimBackend>(options);
  const char* initial = kInitialConfigs[in_.u8() % 8];
  Config config;
  try {
    config = Config::parse(initial);
  } catch (const ConfigError&) {
    // An engine that refuses the setting: start from the defaults.
  }
  fraction_set_ = config.per_process_memory_fraction_set;
  alloc_ = std::make_unique<Allocator>(sim_, config);
  alloc_->attach_oom_observer([this](int, std::size_t, std::size_t, std::size_t) { ++ooms_; });
  alloc_->attach_trace_tracker([this](const TraceEntry& e) { on_trace(e); });
  alloc_->add_free_memory_callback([this] { return on_free_memory(); });
}

std::string Walker::run() {
  std::size_t steps = 0;
  std::uint8_t op = 0;
  try {
    while (!in_.done() && steps++ < kMaxSteps) {
      op = in_.u8() % 32;
      if (trace_) std::fprintf(stderr, "step %zu: opcode %d\n", steps, op);
      step(op);
      if (fault_active_ && op != kOpFault) {  // a failure lasts for one step
        sim_->clear_faults();
        fault_active_ = device_error_ok_ = false;
        in_flight_.clear();  // event failures fall back to stream synchronization
      }
      check_books();
    }
  } catch (const Finding& f) {
    return where(steps, op) + f.what();
  } catch (const InvariantError& e) {
    return where(steps, op) + "InvariantError: " + e.what();
  } catch (const std::exception& e) {
    return where(steps, op) + "unexpected exception: " + e.what();
  }
  return "";
}

void Walker::step(std::uint8_t op) {
  if (op < kOpFree) return op_alloc();
  if (op < kOpBadInput) return free_live(in_.u8());
  if (op >= kOpAdvance && op < kOpSync) return op_advance();
  switch (op) {
    case kOpBadInput:
      return op_bad_input();
    case kOpRecordStream:
      return op_record_stream();
    case kOpSync:
      return op_sync();
    case kOpEager:
      eager_ = !eager_;
      sim_->set_eager(eager_);
      if (eager_) in_flight_.clear();
      return;
    case kOpEmptyCache:
      return op_empty_cache();
    case kOpFraction:
      return op_fraction();
    case kOpConfig:
      return op_config();
    case kOpFault:
      return op_fault();
    case kOpResetStats:
      return op_reset_stats();
    case kOpCapacity: {
      std::uint8_t a = in_.u8();
      sim_->set_capacity(a & 1, (32 * kMiB) << ((a >> 1) % 4));  // 32-256 MiB
      capacity_changed_ = true;
      return;
    }
    case kOpCallback:
      callback_on_ = !callback_on_;
      return;
    case kOpQuery:
      return op_query();
    case kOpFreeAll:
      return op_free_all();
    default: {
      const std::uint8_t arg = in_.u8();
      if (arg >= 0x80) return op_pool(arg);
      if (arg & 0x40) next_on_thread_ = true;
      current_device_ = arg & 1;
      sim_->set_current_device(current_device_);
      return;
    }
  }
}

void Walker::op_alloc() {
  const std::uint8_t a = in_.u8();
  const std::size_t size = size_for(a & 7, in_.u16());
  const StreamHandle stream = (a >> 3) & 3;
  const bool current = (a >> 6) == 3;  // device -1
  request(size, stream, current ? current_device_ : (a >> 5) & 1, current);
}

// The newest block freed, then its size requested again on its stream: the engine's
// parked free (taken back whole, or merged first when best fit says otherwise).
void Walker::op_free_and_request_again() {
  if (live_.empty()) return;
  const Live l = live_.back();
  free_live_at(live_.size() - 1);
  request(l.requested, l.stream, l.device, false);
}

void Walker::request(std::size_t size, StreamHandle stream, int device, bool current) {
  const std::uint64_t refused = sim_->counters().failed_allocs;
  const std::uint64_t ooms = ooms_;
  void* p = nullptr;
  if (trace_)
    std::fprintf(stderr, "  allocate(%zu, stream %lu, device %d)\n", size,
                 static_cast<unsigned long>(stream), current ? -1 : device);
  const bool on_thread = next_on_thread_;
  try {
    if (on_thread) {
      // The simulator's current device is per thread: the new thread names it.
      next_on_thread_ = false;
      std::exception_ptr error;
      std::thread([&] {
        try {
          p = alloc_->allocate(size, stream, current ? current_device_ : device);
        } catch (...) {
          error = std::current_exception();
        }
      }).join();
      if (error) std::rethrow_exception(error);
    } else if (tag_request_) {
      TagScope scope(*alloc_, kTag);
      p = alloc_->allocate(size, stream, current ? -1 : device);
    } else {
      p = alloc_->allocate(size, stream, current ? -1 : device);
    }
  } catch (const InvalidArgumentError& e) {
    // The walk's tag asleep on the device: its requests are refused.
    WALK_CHECK(
        tag_request_ && tag_asleep_[static_cast<std::size_t>(device)] && size > 0 && size < kOneEiB,
        std::string("InvalidArgumentError: ") + e.what());
    return;
  } catch (const OutOfMemoryError& e) {
    if (size >= kOneEiB) {
      WALK_CHECK(ooms_ == ooms, "a >= 1 EiB request walked the ladder");
      return;
    }
    // Expandable segments refuse, without asking, a request larger than the device.
    WALK_CHECK(sim_->counters().failed_allocs > refused || fraction_set_ ||
                   ((alloc_->config().expandable_segments || compact_ || tag_request_) &&
                    size > sim_->capacity(device < 0 ? current_device_ : device)),
               std::string("OutOfMemoryError without a refusal by the device: ") + e.what());
    WALK_CHECK(ooms_ == ooms + 1, "the OOM observer was not told exactly once");
    return;
  } catch (const DeviceError& e) {
    const bool held_in_capture =
        held_reported_ && capture_on(current ? current_device_ : device) &&
        std::string(e.what()).find(
            "still mapped after an earlier failure (a capture is under way)") != std::string::npos;
    WALK_CHECK(device_error_ok_ || held_in_capture,
               std::string("DeviceError without an injected failure: ") + e.what());
    note_device_error(e);
    return;
  }
  if (size == 0) {
    WALK_CHECK(p == nullptr, "size 0 returned a pointer");
    return;
  }
  WALK_CHECK(size < kOneEiB, "a request of >= 1 EiB succeeded");
  if (!in_flight_.empty()) note_synchronizations(stats_all());  // the ladder may have waited
  WALK_CHECK(p != nullptr, "allocate returned nullptr");
  Live l{reinterpret_cast<std::uintptr_t>(p),
         size,
         alloc_->block_size(p),
         device,
         stream,
         next_id_++,
         {},
         compact_};
  WALK_CHECK(l.block >= size && l.block % 512 == 0, "block size " + std::to_string(l.block));
  WALK_CHECK(alloc_->requested_size(p) == size, "requested size differs");
  l.pool = serving_slot(device, stream, l.address, on_thread);
  // A private pool's block never moves; nor does one that the default pool served
  // under policy:compact during a capture (compact arenas are its expandable segments).
  l.compact = compact_ && l.pool == -1 && (!capture_on(device) || in_compact_arena(l.address));
  if (tag_request_) {  // the tag's own pool (no route was on): a pool of its own
    WALK_CHECK(!tag_asleep_[static_cast<std::size_t>(device)], "a sleeping tag served a request");
    l.tagged = true;
    l.compact = false;
  }
  check_disjoint(l);
  shadow_.emplace(l.address, l.address + l.block);
  for_pattern(l.requested, [&](std::size_t o) {
    reinterpret_cast<std::uint8_t*>(l.address)[o] = pattern_byte(l.id, o);
  });
  live_.push_back(std::move(l));
}

void Walker::free_live(std::uint8_t index) {
  if (index == 0xFF) return op_free_and_request_again();
  if (!live_.empty()) free_live_at(index % live_.size());
}

void Walker::free_live_at(std::size_t i) {
  Live l = live_[i];
  check_pattern(l);
  if (i + 1 != live_.size()) live_[i] = std::move(live_.back());
  live_.pop_back();
  shadow_.erase(l.address);
  if (trace_)
    std::fprintf(stderr, "  deallocate(%p) block %zu device %d stream %lu, %zu uses\n",
                 reinterpret_cast<void*>(l.address), l.block, l.device,
                 static_cast<unsigned long>(l.stream), l.uses.size());
  try {
    alloc_->deallocate(reinterpret_cast<void*>(l.address));
  } catch (const DeviceError& e) {
    // The block is out of the program's hands either way (kept unused for good).
    WALK_CHECK(device_error_ok_, std::string("DeviceError on free: ") + e.what());
    note_device_error(e);
    kept_.emplace_back(l.address, l.address + l.block);
    kept_on_[static_cast<std::size_t>(l.device)] = true;
    return;
  }
  freed_[freed_next_++ % freed_.size()] = l.address;
  if (eager_) return;
  // Under policy:compact the block's own stream matters too: its memory may move.
  const bool compact = l.compact;
  InFlight f{l.address, l.address + l.block, l.uses, {}, compact};
  // Freed during a capture: the free waits for its end, and then for the uses recorded
  // before it only.
  if (capture_on(l.device))
    for (StreamHandle s : l.capture_uses) std::erase(f.waiting, s);
  if (compact) f.waiting.push_back(l.stream);
  for (StreamHandle s : f.waiting) f.positions.push_back(sim_->submitted(s));
  if (!f.waiting.empty()) in_flight_.push_back(std::move(f));
}

void Walker::op_free_all() {
  const std::uint8_t sel = in_.u8();
  for (std::size_t i = live_.size(); i-- > 0;) {
    const Live& l = live_[i];
    if ((sel % 3 == 1 && l.device != (sel >> 2) % 2) ||
        (sel % 3 == 2 && l.stream != (sel >> 2) % 4))
      continue;
    free_live_at(i);  // moves the last (already visited) block to i
  }
}

// Rung 1 of the ladder: frees up to two of the oldest live blocks.
bool Walker::on_free_memory() {
  if (!callback_on_ || live_.empty()) return false;
  free_live_at(0);
  if (!live_.empty()) free_live_at(0);
  return true;
}

void Walker::op_record_stream() {
  const std::uint8_t index = in_.u8();
  const StreamHandle stream = in_.u8() % 4;
  if (live_.empty()) return;
  Live& l = live_[index % live_.size()];
  alloc_->record_stream(reinterpret_cast<void*>(l.address), stream);
  if (stream != l.stream && std::find(l.uses.begin(), l.uses.end(), stream) == l.uses.end()) {
    l.uses.push_back(stream);
    if (capture_on(l.device)) l.capture_uses.push_back(stream);
  }
}

void Walker::op_advance() {
  const StreamHandle stream = in_.u8() % 4;
  sim_->advance(stream);
  // A stream stops at a device-side wait on another stream's unfinished work.
  const std::uint64_t done = sim_->completed(stream);
  for (InFlight& f : in_flight_)
    for (std::size_t k = f.waiting.size(); k-- > 0;)
      if (f.waiting[k] == stream && f.positions[k] <= done) {
        f.waiting.erase(f.waiting.begin() + static_cast<std::ptrdiff_t>(k));
        f.positions.erase(f.positions.begin() + static_cast<std::ptrdiff_t>(k));
      }
  std::erase_if(in_flight_, [](const InFlight& f) { return f.waiting.empty(); });
}

void Walker::op_sync() {
  const std::uint8_t kind = in_.u8();
  if (kind % 3 == 1) {
    const bool release = kind & 0x20;  // release_stream (the stream stays usable)
    try {
      if (release)
        alloc_->release_stream((kind >> 2) % 4, (kind >> 4) & 1);
      else
        alloc_->notify_host_wait((kind >> 2) % 4, (kind >> 4) & 1);
    } catch (const DeviceError& e) {
      // It completes pending frees or records an owed marker: a failing event query
      // or record surfaces (documented).
      WALK_CHECK(device_error_ok_, std::string("DeviceError in ") +
                                       (release ? "release_stream: " : "notify_host_wait: ") +
                                       e.what());
      note_device_error(e);
    }
    return;
  }
  if (kind % 3 == 0)
    sim_->advance_all();
  else
    (void)sim_->synchronize_device(0);  // completes every stream of the simulator
  in_flight_.clear();
}

void Walker::note_device_error(const DeviceError& e) {
  if (std::string(e.what()).find("until empty_cache() gives it back") != std::string::npos)
    held_reported_ = true;
}

void Walker::op_empty_cache() {
  const int which = in_.u8() % 3;
  try {
    if (which == 0)
      alloc_->empty_cache();
    else
      alloc_->empty_cache(which - 1);
  } catch (const DeviceError& e) {
    WALK_CHECK(device_error_ok_, std::string("DeviceError in empty_cache: ") + e.what());
    note_device_error(e);
    return;
  }
  // Pending frees were waited for and every unsplit free segment released: a
  // device without live (or kept) blocks holds nothing, not even address space.
  for (int d = 0; d < kDevices; ++d) {
    if ((which != 0 && which - 1 != d) || kept_on_[static_cast<std::size_t>(d)]) continue;
    bool any = capture_on();  // nothing is released during a capture
    for (const PoolSlot& slot : pools_) any |= slot.exists && slot.device == d;  // in use
    for (const Live& l : live_) any |= l.device == d;
    // A sleeping tag keeps its address ranges (and its free blocks) for wake.
    any |= tag_asleep_[static_cast<std::size_t>(d)];
    if (any) continue;
    WALK_CHECK(alloc_->stats(d).reserved_bytes.all().current == 0,
               "device " + std::to_string(d) + " keeps memory after empty_cache");
    WALK_CHECK(sim_->live_reservations(d) == 0, "device " + std::to_string(d) + " keeps " +
                                                    std::to_string(sim_->live_reservations(d)) +
                                                    " address range(s) reserved after empty_cache");
  }
}

void Walker::op_fraction() {
  const std::uint8_t a = in_.u8();
  const double fraction = static_cast<double>(in_.u8() % 129) / 128.0;
  alloc_->set_memory_fraction(fraction, a & 1);
  fraction_set_ = explicit_fraction_ = true;
}

void Walker::op_config() {
  const std::uint8_t pick = in_.u8();
  const ConfigRow& row =
      pick >= 0xF0 ? kPolicyConfigs[pick % kPolicyConfigRows] : kConfigs[pick % kConfigRows];
  const std::string before = alloc_->config().to_string();
  const std::array<double, kDevices> fractions_before = fractions();
  const std::vector<std::int64_t> stats = snapshot();
  // One pick in sixteen takes PyTorch's run-time meaning (set_allocator_settings): the
  // rounding, split and collection settings the row does not name go back to defaults.
  const bool torch_settings = (pick & 0xF0) == 0xE0;
  if (trace_)
    std::fprintf(stderr, "  %s(\"%s\")\n",
                 torch_settings ? "set_allocator_settings" : "update_config", row.text);
  try {
    if (torch_settings)
      alloc_->set_allocator_settings(row.text);
    else
      alloc_->update_config(row.text);
  } catch (const ConfigError& e) {
    // Documented: policy:compact and expandable_segments:True do not go together.
    const bool conflict =
        std::string(e.what()).find("cannot be used together") != std::string::npos &&
        (compact_ || alloc_->config().expandable_segments);
    WALK_CHECK(row.expect != Expect::ok || conflict,
               std::string(row.text) + " refused: " + e.what());
    WALK_CHECK(alloc_->config().to_string() == before, "a refused config changed the config");
    WALK_CHECK(snapshot() == stats, "a refused config changed the statistics");
    return;
  }
  WALK_CHECK(row.expect != Expect::bad, std::string(row.text) + " was accepted");
  if (torch_settings) {
    const std::string text = row.text;
    const Config& now = alloc_->config();
    const Config defaults;
    auto names = [&](const char* key) { return text.find(key) != std::string::npos; };
    WALK_CHECK(names("max_split_size_mb") || now.max_split_size == defaults.max_split_size,
               "set_allocator_settings kept max_split_size_mb");
    WALK_CHECK(names("roundup_power2_divisions") ||
                   now.roundup_power2_divisions == defaults.roundup_power2_divisions,
               "set_allocator_settings kept roundup_power2_divisions");
    WALK_CHECK(names("garbage_collection_threshold") || now.garbage_collection_threshold == 0.0,
               "set_allocator_settings kept garbage_collection_threshold");
  }
  compact_ = alloc_->config().policy == Config::Policy::compact;
  if (std::string(row.text).find("per_process_memory_fraction") != std::string::npos)
    fraction_set_ = true;
  else
    WALK_CHECK(fractions() == fractions_before,
               std::string(row.text) + " changed the memory fraction");
}

void Walker::op_fault() {
  const std::uint8_t kind = in_.u8();
  const std::uint8_t arg = in_.u8();
  // Operations the engine calls that can fail (the last five: expandable segments).
  // Kept as they are so that the corpus keeps its meaning; cleanup calls are below.
  static constexpr SimOp kErrorOps[] = {SimOp::query_event,
                                        SimOp::record_event,
                                        SimOp::create_event,
                                        SimOp::synchronize_event,
                                        SimOp::deallocate,
                                        SimOp::allocate,
                                        SimOp::map,
                                        SimOp::unmap,
                                        SimOp::create_physical,
                                        SimOp::set_access,
                                        SimOp::reserve_address_range};
  constexpr std::size_t kErrorOpCount = sizeof(kErrorOps) / sizeof(kErrorOps[0]);
  // Calls that give memory back or wait before doing so (kind 2, arg >= 128).
  static constexpr SimOp kCleanupOps[] = {SimOp::release_physical, SimOp::release_address_range,
                                          SimOp::synchronize_stream};
  SimOp op = kErrorOps[arg % kErrorOpCount];
  fault_active_ = true;
  const bool persistent = kind % 5 == 3 || (kind % 5 == 2 && (arg & 0x40));
  const std::uint64_t n = 1 + (arg >> 4) % 3;
  switch (kind % 5) {
    case 0:
      sim_->fail_allocation_number(1 + arg % 4);
      if (trace_)
        std::fprintf(stderr, "  fault: allocate call %d answers out_of_memory\n", 1 + arg % 4);
      return;
    case 1:
      sim_->fail_allocations_above(size_for(5, arg));
      if (trace_) std::fprintf(stderr, "  fault: allocations above %zu bytes\n", size_for(5, arg));
      return;
    case 2:
      if (arg < 0x80) {
        sim_->fail_operation(SimOp::allocate, DeviceStatus::out_of_memory);
        if (trace_) std::fprintf(stderr, "  fault: every allocate answers out_of_memory\n");
        return;
      }
      op = kCleanupOps[arg % 3];
      break;
    default:
      break;
  }
  if (persistent)
    sim_->fail_operation(op, DeviceStatus::error);
  else
    sim_->fail_operation_number(op, n, DeviceStatus::error);
  device_error_ok_ = true;
  if (trace_) {
    const std::string which = persistent ? "every call" : "call " + std::to_string(n);
    std::fprintf(stderr, "  fault: %s of %s fails\n", which.c_str(), to_string(op));
  }
}

void Walker::op_reset_stats() {
  const std::uint8_t a = in_.u8();
  const int d = a & 1;
  if (a & 2) {
    alloc_->reset_accumulated_stats(d);
    return;
  }
  alloc_->reset_peak_stats(d);
  const DeviceStats s = alloc_->stats(d);
  WALK_CHECK(s.allocated_bytes.all().peak == s.allocated_bytes.all().current,
             "peak differs from current right after reset_peak_stats");
}

std::string run_walk(const std::uint8_t* data, std::size_t size) {
  Reader in(data, size);
  Walker walker(in);
  return walker.run();
}

}  // namespace reservoir::fuzz
