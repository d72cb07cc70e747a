// The C API (include/reservoir/reservoir.h) over Allocator::instance().
//
// Every entry point runs its body inside guarded(): exceptions never cross the C
// boundary; each is mapped to a status code and its message kept per thread for
// reservoir_last_error().
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "front/c_segment.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/history.hpp"
#include "reservoir/ipc.hpp"
#include "reservoir/reservoir.h"
#include "reservoir/stats.hpp"

namespace {

using reservoir::Allocator;

// A fixed buffer, not a std::string: thread-local objects with destructors are gone
// before static destructors run, and those may still call the C API (a free at exit).
thread_local char t_last_error[2048];

void set_last_error(const std::string& text) noexcept {
  std::size_t n = text.size() < sizeof t_last_error - 1 ? text.size() : sizeof t_last_error - 1;
  std::memcpy(t_last_error, text.data(), n);
  t_last_error[n] = '\0';
}

// Records "prefix: what" (or just what) as this thread's last error. Building the
// text can itself run out of host memory: then the status is kept, the text lost.
reservoir_status fail(reservoir_status status, const char* prefix, const char* what) noexcept {
  try {
    set_last_error(prefix != nullptr ? std::string(prefix) + ": " + what : std::string(what));
  } catch (...) {
    t_last_error[0] = '\0';
  }
  return status;
}

// Runs body (returning void) and maps every exception to a status code. Order
// matters: the specific reservoir errors derive from std::invalid_argument and
// std::bad_alloc, which are caught after them.
template <class Body>
reservoir_status guarded(const char* function, Body&& body) noexcept {
  t_last_error[0] = '\0';
  try {
    body();
    return RESERVOIR_OK;
  } catch (const reservoir::OutOfMemoryError& e) {
    return fail(RESERVOIR_ERROR_OUT_OF_MEMORY, nullptr, e.what());
  } catch (const reservoir::InvalidPointerError& e) {
    return fail(RESERVOIR_ERROR_INVALID_POINTER, nullptr, e.what());
  } catch (const reservoir::ConfigError& e) {
    return fail(RESERVOIR_ERROR_CONFIG, nullptr, e.what());
  } catch (const reservoir::InvalidArgumentError& e) {
    return fail(RESERVOIR_ERROR_INVALID_ARGUMENT, nullptr, e.what());
  } catch (const reservoir::DeviceError& e) {
    return fail(RESERVOIR_ERROR_DEVICE, nullptr, e.what());
  } catch (const reservoir::IoError& e) {
    return fail(RESERVOIR_ERROR_IO, nullptr, e.what());
  } catch (const reservoir::InvariantError& e) {
    return fail(RESERVOIR_ERROR_INTERNAL, "invariant violated", e.what());
  } catch (const std::bad_alloc&) {
    // Host memory ran out inside the allocator's own books, not the device.
    return fail(RESERVOIR_ERROR_INTERNAL, function, "out of host memory");
  } catch (const std::exception& e) {
    return fail(RESERVOIR_ERROR_INTERNAL, function, e.what());
  } catch (...) {
    return fail(RESERVOIR_ERROR_INTERNAL, function, "unknown exception");
  }
}

// Argument checks run inside guarded() bodies, so they report by throwing.
void require(const void* pointer, const char* function, const char* name) {
  if (pointer == nullptr) {
    throw reservoir::InvalidArgumentError(std::string(function) + ": " + name +
                                          " must not be NULL");
  }
}

// The buffer convention of reservoir_stats_text / reservoir_summary: copies as
// much as fits (always NUL-terminated when capacity > 0), reports the full need.
// NULL with capacity 0 is the size query; NULL with a capacity is a caller's bug.
void copy_out(const char* function, const std::string& text, char* buffer, std::size_t capacity,
              std::size_t* needed) {
  if (buffer == nullptr && capacity != 0)
    throw reservoir::InvalidArgumentError(
        std::string(function) + ": buffer is NULL but capacity is " + std::to_string(capacity) +
        " (pass capacity 0 to ask for the size only)");
  if (needed != nullptr) *needed = text.size() + 1;
  if (buffer == nullptr || capacity == 0) return;
  const std::size_t n = text.size() < capacity - 1 ? text.size() : capacity - 1;
  std::memcpy(buffer, text.data(), n);
  buffer[n] = '\0';
}

// PyTorch's memory_stats() names: families x {all, small_pool, large_pool} x
// {current, peak, allocated, freed}. Kept here (not taken from the engine) so the
// C API's key set is fixed by this file alone.
struct ArrayEntry {
  const char* name;
  reservoir::StatArray reservoir::DeviceStats::*member;
};
constexpr ArrayEntry kArrays[] = {
    {"allocation", &reservoir::DeviceStats::allocation},
    {"segment", &reservoir::DeviceStats::segment},
    {"active", &reservoir::DeviceStats::active},
    {"inactive_split", &reservoir::DeviceStats::inactive_split},
    {"allocated_bytes", &reservoir::DeviceStats::allocated_bytes},
    {"reserved_bytes", &reservoir::DeviceStats::reserved_bytes},
    {"active_bytes", &reservoir::DeviceStats::active_bytes},
    {"inactive_split_bytes", &reservoir::DeviceStats::inactive_split_bytes},
    {"requested_bytes", &reservoir::DeviceStats::requested_bytes},
};
constexpr const char* kPoolNames[reservoir::kPoolKinds] = {"all", "small_pool", "large_pool"};

// Plain string building, not iostreams: a process can change the global C++ locale
// (importing PyTorch does), and number formatting through a stream of this library
// must not depend on it.
void write_value(std::string& out, const std::string& key, std::int64_t value) {
  out += key;
  out += ' ';
  out += std::to_string(value);
  out += '\n';
}

void write_stat(std::string& out, const std::string& prefix, const reservoir::Stat& s) {
  write_value(out, prefix + ".current", s.current);
  write_value(out, prefix + ".peak", s.peak);
  write_value(out, prefix + ".allocated", s.allocated);
  write_value(out, prefix + ".freed", s.freed);
}

std::string stats_text(const reservoir::DeviceStats& stats) {
  std::string out;
  for (const ArrayEntry& entry : kArrays) {
    const reservoir::StatArray& array = stats.*(entry.member);
    for (int pool = 0; pool < reservoir::kPoolKinds; ++pool) {
      write_stat(out, std::string(entry.name) + "." + kPoolNames[pool], array.pool[pool]);
    }
  }
  write_stat(out, "oversize_allocations", stats.oversize_allocations);
  write_stat(out, "oversize_segments", stats.oversize_segments);
  write_value(out, "num_alloc_retries", stats.num_alloc_retries);
  write_value(out, "num_ooms", stats.num_ooms);
  write_value(out, "num_sync_all_streams", stats.num_sync_all_streams);
  write_value(out, "num_device_alloc", stats.num_device_alloc);
  write_value(out, "num_device_free", stats.num_device_free);
  write_value(out, "max_split_size", stats.max_split_size);
  return out;
}

std::string pointer_text(const void* ptr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", ptr);
  return buf;
}

reservoir::PoolId pool_of(reservoir_pool_id id) {
  return reservoir::PoolId{id.first, id.second};
}

}  // namespace

struct reservoir_pool_checkpoint {
  reservoir::PoolCheckpoint state;
};
struct reservoir_pool_restore {
  reservoir::PoolRestore result;
};

extern "C" {

const char* reservoir_last_error(void) {
  return t_last_error;
}

const char* reservoir_status_name(reservoir_status status) {
  switch (status) {
    case RESERVOIR_OK:
      return "ok";
    case RESERVOIR_ERROR_OUT_OF_MEMORY:
      return "out_of_memory";
    case RESERVOIR_ERROR_INVALID_POINTER:
      return "invalid_pointer";
    case RESERVOIR_ERROR_INVALID_ARGUMENT:
      return "invalid_argument";
    case RESERVOIR_ERROR_CONFIG:
      return "config";
    case RESERVOIR_ERROR_DEVICE:
      return "device";
    case RESERVOIR_ERROR_INTERNAL:
      return "internal";
    case RESERVOIR_ERROR_IO:
      return "io";
  }
  return "unknown";
}

reservoir_status reservoir_allocate(void** ptr, int64_t size, int device, uintptr_t stream) {
  constexpr const char* kFn = "reservoir_allocate";
  return guarded(kFn, [&] {
    require(ptr, kFn, "ptr");
    *ptr = nullptr;
    if (size < 0) {
      throw reservoir::InvalidArgumentError(std::string(kFn) + ": size " + std::to_string(size) +
                                            " is negative");
    }
    // Sizes of 1 EiB and more are refused by Allocator::allocate (one check).
    *ptr = Allocator::instance().allocate(static_cast<std::size_t>(size), stream, device);
  });
}

reservoir_status reservoir_free(void* ptr) {
  return guarded("reservoir_free", [&] {
    if (ptr != nullptr) Allocator::instance().deallocate(ptr);
  });
}

reservoir_status reservoir_share(void* ptr, int socket, int keep) {
  constexpr const char* kFn = "reservoir_share";
  return guarded(kFn, [&] {
    if (ptr == nullptr) throw reservoir::InvalidPointerError(std::string(kFn) + ": ptr is NULL");
    reservoir::send_shared(socket, Allocator::instance().share(ptr, keep != 0));
  });
}

reservoir_status reservoir_unshare(void* ptr) {
  return guarded("reservoir_unshare", [&] { Allocator::instance().unshare(ptr); });
}

reservoir_status reservoir_open_shared(int socket, int device, void** ptr) {
  constexpr const char* kFn = "reservoir_open_shared";
  return guarded(kFn, [&] {
    if (ptr == nullptr) throw reservoir::InvalidArgumentError(std::string(kFn) + ": ptr is NULL");
    *ptr = nullptr;
    *ptr = Allocator::instance().open(reservoir::receive_shared(socket), device);
  });
}

reservoir_status reservoir_close_shared(void* ptr) {
  return guarded("reservoir_close_shared", [&] { Allocator::instance().close(ptr); });
}

reservoir_status reservoir_record_stream(void* ptr, uintptr_t stream) {
  constexpr const char* kFn = "reservoir_record_stream";
  return guarded(kFn, [&] {
    if (ptr == nullptr) throw reservoir::InvalidPointerError(std::string(kFn) + ": ptr is NULL");
    Allocator::instance().record_stream(ptr, stream);
  });
}

reservoir_status reservoir_notify_host_wait(uintptr_t stream, int device) {
  return guarded("reservoir_notify_host_wait",
                 [&] { Allocator::instance().notify_host_wait(stream, device); });
}

reservoir_status reservoir_release_stream(uintptr_t stream, int device) {
  return guarded("reservoir_release_stream",
                 [&] { Allocator::instance().release_stream(stream, device); });
}

reservoir_status reservoir_push_tag(const char* tag) {
  return guarded("reservoir_push_tag", [&] {
    if (tag == nullptr) throw reservoir::InvalidArgumentError("reservoir_push_tag: tag is NULL");
    Allocator::instance().push_tag(tag);
  });
}

reservoir_status reservoir_pop_tag(void) {
  return guarded("reservoir_pop_tag", [] { Allocator::instance().pop_tag(); });
}

reservoir_status reservoir_sleep(const char* tag, int mode, int device) {
  return guarded("reservoir_sleep", [&] {
    if (tag == nullptr) throw reservoir::InvalidArgumentError("reservoir_sleep: tag is NULL");
    if (mode != RESERVOIR_SLEEP_OFFLOAD && mode != RESERVOIR_SLEEP_DISCARD)
      throw reservoir::InvalidArgumentError("reservoir_sleep: mode " + std::to_string(mode) +
                                            " is neither RESERVOIR_SLEEP_OFFLOAD nor "
                                            "RESERVOIR_SLEEP_DISCARD");
    Allocator::instance().sleep(tag,
                                mode == RESERVOIR_SLEEP_OFFLOAD ? reservoir::SleepMode::offload
                                                                : reservoir::SleepMode::discard,
                                device);
  });
}

reservoir_status reservoir_wake(const char* tag, int device) {
  return guarded("reservoir_wake", [&] {
    if (tag == nullptr) throw reservoir::InvalidArgumentError("reservoir_wake: tag is NULL");
    Allocator::instance().wake(tag, device);
  });
}

reservoir_status reservoir_wake_async(const char* tag, uintptr_t stream, int device) {
  return guarded("reservoir_wake_async", [&] {
    if (tag == nullptr) throw reservoir::InvalidArgumentError("reservoir_wake_async: tag is NULL");
    Allocator::instance().wake_async(tag, static_cast<reservoir::StreamHandle>(stream), device);
  });
}

reservoir_status reservoir_get_tag_state(const char* tag, int device, reservoir_tag_state* out) {
  return guarded("reservoir_get_tag_state", [&] {
    if (tag == nullptr || out == nullptr)
      throw reservoir::InvalidArgumentError("reservoir_get_tag_state: tag or out is NULL");
    const reservoir::TagState s = Allocator::instance().tag_state(tag, device);
    out->asleep = s.asleep ? 1 : 0;
    out->mode =
        s.mode == reservoir::SleepMode::offload ? RESERVOIR_SLEEP_OFFLOAD : RESERVOIR_SLEEP_DISCARD;
    out->allocated_bytes = s.allocated_bytes;
    out->reserved_bytes = s.reserved_bytes;
    out->asleep_bytes = s.asleep_bytes;
    out->offloaded_bytes = s.offloaded_bytes;
    out->pools = s.pools;
  });
}

reservoir_status reservoir_empty_cache(void) {
  return guarded("reservoir_empty_cache", [] { Allocator::instance().empty_cache(); });
}

reservoir_status reservoir_empty_host_cache(void) {
  return guarded("reservoir_empty_host_cache", [] { Allocator::instance().empty_host_cache(); });
}

reservoir_status reservoir_set_memory_fraction(double fraction, int device) {
  constexpr const char* kFn = "reservoir_set_memory_fraction";
  return guarded(kFn, [&] {
    // Checked here too so that NaN (which fails every comparison) is named clearly.
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "%s: fraction %g is outside [0, 1]", kFn, fraction);
      throw reservoir::InvalidArgumentError(buf);
    }
    Allocator::instance().set_memory_fraction(fraction, device);
  });
}

reservoir_status reservoir_get_memory_fraction(int device, double* fraction) {
  constexpr const char* kFn = "reservoir_get_memory_fraction";
  return guarded(kFn, [&] {
    require(fraction, kFn, "fraction");
    *fraction = Allocator::instance().memory_fraction(device);
  });
}

reservoir_status reservoir_largest_cached_block(int device, size_t* bytes) {
  constexpr const char* kFn = "reservoir_largest_cached_block";
  return guarded(kFn, [&] {
    require(bytes, kFn, "bytes");
    *bytes = Allocator::instance().largest_cached_block(device);
  });
}

reservoir_status reservoir_base_allocation(void* ptr, void** base, size_t* size) {
  constexpr const char* kFn = "reservoir_base_allocation";
  return guarded(kFn, [&] {
    if (ptr == nullptr) throw reservoir::InvalidPointerError(std::string(kFn) + ": ptr is NULL");
    const reservoir::BaseAllocation found = Allocator::instance().base_allocation(ptr);
    if (found.base == nullptr) {
      throw reservoir::InvalidPointerError(std::string(kFn) + ": " + pointer_text(ptr) +
                                           " is not inside any Reservoir segment");
    }
    if (base != nullptr) *base = found.base;
    if (size != nullptr) *size = found.size;
  });
}

reservoir_status reservoir_reset_peak_stats(int device) {
  return guarded("reservoir_reset_peak_stats",
                 [&] { Allocator::instance().reset_peak_stats(device); });
}

reservoir_status reservoir_reset_accumulated_stats(int device) {
  return guarded("reservoir_reset_accumulated_stats",
                 [&] { Allocator::instance().reset_accumulated_stats(device); });
}

reservoir_status reservoir_update_config(const char* text) {
  constexpr const char* kFn = "reservoir_update_config";
  return guarded(kFn, [&] {
    require(text, kFn, "text");
    Allocator::instance().update_config(std::string_view(text));
  });
}

reservoir_status reservoir_set_allocator_settings(const char* text) {
  constexpr const char* kFn = "reservoir_set_allocator_settings";
  return guarded(kFn, [&] {
    require(text, kFn, "text");
    Allocator::instance().set_allocator_settings(std::string_view(text));
  });
}

reservoir_status reservoir_attach_oom_observer(reservoir_oom_observer_fn fn, void* ctx) {
  constexpr const char* kFn = "reservoir_attach_oom_observer";
  return guarded(kFn, [&] {
    if (!fn) require(nullptr, kFn, "fn");  // (function pointers are not void*)
    Allocator::instance().attach_oom_observer(
        [fn, ctx](int device, std::size_t alloc_size, std::size_t allowed, std::size_t free) {
          fn(ctx, device, alloc_size, allowed, free);
        });
  });
}

reservoir_status reservoir_segments(int device, reservoir_segment* out, size_t capacity,
                                    size_t* count) {
  constexpr const char* kFn = "reservoir_segments";
  return guarded(kFn, [&] {
    require(count, kFn, "count");
    if (out == nullptr && capacity != 0)
      throw reservoir::InvalidArgumentError(std::string(kFn) + ": out is NULL but capacity is " +
                                            std::to_string(capacity));
    const std::vector<reservoir::SegmentInfo> segments = Allocator::instance().segments(device);
    for (std::size_t i = 0; i < segments.size() && i < capacity; ++i)
      out[i] = reservoir::detail::to_c(segments[i]);
    *count = segments.size();
  });
}

// PyTorch's TraceEntry actions, in its order: the C values are those.
static_assert(RESERVOIR_TRACE_OOM == static_cast<int>(reservoir::TraceAction::oom) &&
                  RESERVOIR_TRACE_SEGMENT_UNMAP ==
                      static_cast<int>(reservoir::TraceAction::segment_unmap) &&
                  RESERVOIR_TRACE_SNAPSHOT == static_cast<int>(reservoir::TraceAction::snapshot),
              "reservoir_trace_action follows reservoir::TraceAction");

reservoir_status reservoir_attach_trace_tracker(reservoir_trace_tracker_fn fn, void* ctx) {
  constexpr const char* kFn = "reservoir_attach_trace_tracker";
  return guarded(kFn, [&] {
    if (!fn) require(nullptr, kFn, "fn");  // (function pointers are not void*)
    Allocator::instance().attach_trace_tracker([fn, ctx](const reservoir::TraceEntry& e) {
      const reservoir_trace_entry entry{static_cast<int>(e.action),
                                        e.device,
                                        e.address,
                                        e.size,
                                        static_cast<uintptr_t>(e.stream),
                                        e.time_us,
                                        reservoir_pool_id{e.pool.first, e.pool.second}};
      fn(ctx, &entry);
    });
  });
}

reservoir_status reservoir_device_count(int* count) {
  constexpr const char* kFn = "reservoir_device_count";
  return guarded(kFn, [&] {
    require(count, kFn, "count");
    *count = Allocator::instance().device_count();
  });
}

reservoir_status reservoir_backend_name(const char** name) {
  constexpr const char* kFn = "reservoir_backend_name";
  return guarded(kFn, [&] {
    require(name, kFn, "name");
    *name = Allocator::instance().backend().name();
  });
}

reservoir_status reservoir_current_device(int* device) {
  constexpr const char* kFn = "reservoir_current_device";
  return guarded(kFn, [&] {
    require(device, kFn, "device");
    reservoir::Backend& backend = Allocator::instance().backend();
    if (backend.current_device(device) != reservoir::DeviceStatus::ok) {
      throw reservoir::DeviceError(std::string(kFn) + ": " + backend.last_error());
    }
  });
}

reservoir_status reservoir_config_text(char* buffer, size_t capacity, size_t* needed) {
  constexpr const char* kFn = "reservoir_config_text";
  return guarded(kFn, [&] {
    copy_out(kFn, Allocator::instance().config().to_string(), buffer, capacity, needed);
  });
}

reservoir_status reservoir_stats_text(int device, char* buffer, size_t capacity, size_t* needed) {
  constexpr const char* kFn = "reservoir_stats_text";
  return guarded(kFn, [&] {
    Allocator& a = Allocator::instance();
    const reservoir::DeviceStats stats = a.stats(device);
    std::string text = stats_text(stats);
    // Per tag (docs/sleep.md): tags.NAME.allocated_bytes, ... and the pinned host
    // memory kept for offloads, where tags exist (not PyTorch's keys).
    const std::vector<reservoir::TagState> tags = a.tag_states(device);
    if (!tags.empty()) write_value(text, "host_kept_bytes", stats.host_kept_bytes);
    for (const reservoir::TagState& t : tags) {
      const std::string key = "tags." + t.name + ".";
      write_value(text, key + "allocated_bytes", static_cast<std::int64_t>(t.allocated_bytes));
      write_value(text, key + "reserved_bytes", static_cast<std::int64_t>(t.reserved_bytes));
      write_value(text, key + "asleep_bytes", static_cast<std::int64_t>(t.asleep_bytes));
      write_value(text, key + "offloaded_bytes", static_cast<std::int64_t>(t.offloaded_bytes));
      write_value(text, key + "asleep", t.asleep ? 1 : 0);
    }
    copy_out(kFn, text, buffer, capacity, needed);
  });
}

reservoir_status reservoir_summary(int device, char* buffer, size_t capacity, size_t* needed) {
  constexpr const char* kFn = "reservoir_summary";
  return guarded(
      kFn, [&] { copy_out(kFn, Allocator::instance().summary(device), buffer, capacity, needed); });
}

reservoir_status reservoir_summary_with_options(int device, unsigned options, char* buffer,
                                                size_t capacity, size_t* needed) {
  constexpr const char* kFn = "reservoir_summary_with_options";
  return guarded(kFn, [&] {
    constexpr unsigned kKnown = RESERVOIR_SUMMARY_ABBREVIATED | RESERVOIR_SUMMARY_SYNC_AND_SPLIT;
    if ((options & ~kKnown) != 0) {
      throw reservoir::InvalidArgumentError(std::string(kFn) + ": unknown option bits " +
                                            std::to_string(options & ~kKnown));
    }
    reservoir::SummaryOptions chosen;
    chosen.abbreviated = (options & RESERVOIR_SUMMARY_ABBREVIATED) != 0;
    chosen.sync_and_split = (options & RESERVOIR_SUMMARY_SYNC_AND_SPLIT) != 0;
    copy_out(kFn, Allocator::instance().summary(device, chosen), buffer, capacity, needed);
  });
}

reservoir_status reservoir_start_trace_recording(const char* path) {
  constexpr const char* kFn = "reservoir_start_trace_recording";
  return guarded(kFn, [&] {
    require(path, kFn, "path");
    Allocator::instance().start_trace_recording(path);
  });
}

reservoir_status reservoir_stop_trace_recording(void) {
  return guarded("reservoir_stop_trace_recording",
                 [] { Allocator::instance().stop_trace_recording(); });
}

reservoir_status reservoir_record_history(int enabled, size_t max_entries) {
  return guarded("reservoir_record_history",
                 [&] { Allocator::instance().record_history(enabled != 0, max_entries); });
}

reservoir_status reservoir_dump_snapshot(const char* path) {
  constexpr const char* kFn = "reservoir_dump_snapshot";
  return guarded(kFn, [&] {
    require(path, kFn, "path");
    Allocator::instance().dump_snapshot(path);
  });
}

reservoir_status reservoir_metrics_prometheus(char* buffer, size_t capacity, size_t* needed) {
  constexpr const char* kFn = "reservoir_metrics_prometheus";
  return guarded(kFn, [&] {
    copy_out(kFn, Allocator::instance().metrics_prometheus(), buffer, capacity, needed);
  });
}

reservoir_status reservoir_metrics_json(char* buffer, size_t capacity, size_t* needed) {
  constexpr const char* kFn = "reservoir_metrics_json";
  return guarded(
      kFn, [&] { copy_out(kFn, Allocator::instance().metrics_json(), buffer, capacity, needed); });
}

reservoir_status reservoir_validate(void) {
  return guarded("reservoir_validate", [] { Allocator::instance().validate(); });
}

// ---------------------------------------------------------------- private pools

reservoir_status reservoir_private_pool_stats(int device, int64_t* reserved_bytes, int64_t* pools) {
  constexpr const char* kFn = "reservoir_private_pool_stats";
  return guarded(kFn, [&] {
    require(reserved_bytes, kFn, "reserved_bytes");
    require(pools, kFn, "pools");
    const reservoir::DeviceStats s = Allocator::instance().stats(device);
    *reserved_bytes = s.private_pool_reserved_bytes;
    *pools = s.private_pools;
  });
}

reservoir_status reservoir_pool_create(int device, int use_on_oom, int no_split,
                                       reservoir_pool_id* id) {
  constexpr const char* kFn = "reservoir_pool_create";
  return guarded(kFn, [&] {
    require(id, kFn, "id");
    const reservoir::PoolId made =
        Allocator::instance().create_pool({use_on_oom != 0, no_split != 0}, device);
    *id = reservoir_pool_id{made.first, made.second};
  });
}

reservoir_status reservoir_pool_create_with_source(int device, int use_on_oom, int no_split,
                                                   reservoir_segment_alloc_fn alloc,
                                                   reservoir_segment_free_fn free_fn, void* ctx,
                                                   reservoir_pool_id* id) {
  constexpr const char* kFn = "reservoir_pool_create_with_source";
  return guarded(kFn, [&] {
    require(id, kFn, "id");
    if (!alloc) require(nullptr, kFn, "alloc");  // (function pointers are not void*)
    if (!free_fn) require(nullptr, kFn, "free_fn");
    // The program's statuses as the engine's: out of memory lets the ladder go on.
    auto status = [](reservoir_status s) {
      return s == RESERVOIR_OK                    ? reservoir::DeviceStatus::ok
             : s == RESERVOIR_ERROR_OUT_OF_MEMORY ? reservoir::DeviceStatus::out_of_memory
                                                  : reservoir::DeviceStatus::error;
    };
    auto source = std::make_shared<reservoir::FunctionSegmentSource>(
        [=](int dev, std::size_t size, reservoir::StreamHandle stream, void** ptr) {
          return status(alloc(ctx, dev, size, static_cast<uintptr_t>(stream), ptr));
        },
        [=](int dev, void* ptr, std::size_t size, reservoir::StreamHandle stream) {
          return status(free_fn(ctx, dev, ptr, size, static_cast<uintptr_t>(stream)));
        },
        "the program's segment source (reservoir_pool_create_with_source)");
    const reservoir::PoolId made = Allocator::instance().create_pool(
        std::move(source), {use_on_oom != 0, no_split != 0}, device);
    *id = reservoir_pool_id{made.first, made.second};
  });
}

reservoir_status reservoir_pool_create_with_pluggable(int device, int use_on_oom, int no_split,
                                                      reservoir_pluggable_alloc_fn alloc,
                                                      reservoir_pluggable_free_fn free_fn,
                                                      reservoir_pool_id* id) {
  constexpr const char* kFn = "reservoir_pool_create_with_pluggable";
  return guarded(kFn, [&] {
    require(id, kFn, "id");
    if (!alloc) require(nullptr, kFn, "alloc");  // (function pointers are not void*)
    if (!free_fn) require(nullptr, kFn, "free_fn");
    // PyTorch's pluggable functions report no status: no segment is out of memory.
    auto source = std::make_shared<reservoir::FunctionSegmentSource>(
        [=](int dev, std::size_t size, reservoir::StreamHandle stream, void** ptr) {
          *ptr = alloc(size, dev, reinterpret_cast<void*>(stream));
          return *ptr ? reservoir::DeviceStatus::ok : reservoir::DeviceStatus::out_of_memory;
        },
        [=](int dev, void* ptr, std::size_t size, reservoir::StreamHandle stream) {
          free_fn(ptr, size, dev, reinterpret_cast<void*>(stream));
          return reservoir::DeviceStatus::ok;
        },
        "PyTorch's pluggable allocator functions (reservoir_pool_create_with_pluggable)");
    const reservoir::PoolId made = Allocator::instance().create_pool(
        std::move(source), {use_on_oom != 0, no_split != 0}, device);
    *id = reservoir_pool_id{made.first, made.second};
  });
}

reservoir_status reservoir_pool_retain(int device, reservoir_pool_id id, int use_on_oom,
                                       int no_split) {
  return guarded("reservoir_pool_retain", [&] {
    Allocator::instance().retain_pool(pool_of(id), {use_on_oom != 0, no_split != 0}, device);
  });
}

reservoir_status reservoir_pool_release(int device, reservoir_pool_id id) {
  return guarded("reservoir_pool_release",
                 [&] { Allocator::instance().release_pool(pool_of(id), device); });
}

reservoir_status reservoir_pool_release_and_empty(int device, reservoir_pool_id id) {
  return guarded("reservoir_pool_release_and_empty",
                 [&] { Allocator::instance().release_pool(pool_of(id), device, true); });
}

reservoir_status reservoir_pool_use_count(int device, reservoir_pool_id id, int* count) {
  constexpr const char* kFn = "reservoir_pool_use_count";
  return guarded(kFn, [&] {
    require(count, kFn, "count");
    *count = Allocator::instance().pool_use_count(pool_of(id), device);
  });
}

reservoir_status reservoir_pool_usage(int device, reservoir_pool_id id, size_t* reserved,
                                      size_t* allocated) {
  return guarded("reservoir_pool_usage", [&] {
    const reservoir::PrivatePoolUsage u = Allocator::instance().pool_usage(pool_of(id), device);
    if (reserved) *reserved = u.reserved_bytes;
    if (allocated) *allocated = u.allocated_bytes;
  });
}

reservoir_status reservoir_pool_begin_capture(int device, reservoir_pool_id id, uintptr_t stream) {
  return guarded("reservoir_pool_begin_capture",
                 [&] { Allocator::instance().begin_capture_to_pool(pool_of(id), stream, device); });
}

reservoir_status reservoir_pool_begin_thread(int device, reservoir_pool_id id) {
  return guarded("reservoir_pool_begin_thread", [&] {
    Allocator::instance().begin_allocate_current_thread_to_pool(pool_of(id), device);
  });
}

reservoir_status reservoir_pool_end(int device, reservoir_pool_id id) {
  return guarded("reservoir_pool_end",
                 [&] { Allocator::instance().end_allocate_to_pool(pool_of(id), device); });
}

reservoir_status reservoir_pool_live_allocations_are(int device, reservoir_pool_id id,
                                                     void* const* ptrs, size_t count, int* result) {
  constexpr const char* kFn = "reservoir_pool_live_allocations_are";
  return guarded(kFn, [&] {
    require(result, kFn, "result");
    if (count > 0) require(ptrs, kFn, "ptrs");
    std::vector<void*> expected(ptrs, ptrs + count);
    *result =
        Allocator::instance().pool_live_allocations_are(pool_of(id), expected, device) ? 1 : 0;
  });
}

reservoir_status reservoir_pool_checkpoint_take(int device, reservoir_pool_id id,
                                                reservoir_pool_checkpoint** out) {
  constexpr const char* kFn = "reservoir_pool_checkpoint_take";
  return guarded(kFn, [&] {
    require(out, kFn, "out");
    *out = nullptr;
    auto made = std::make_unique<reservoir_pool_checkpoint>();
    made->state = Allocator::instance().checkpoint_pool(pool_of(id), device);
    *out = made.release();
  });
}

reservoir_status reservoir_pool_checkpoint_restore(const reservoir_pool_checkpoint* checkpoint,
                                                   reservoir_pool_restore** out) {
  constexpr const char* kFn = "reservoir_pool_checkpoint_restore";
  return guarded(kFn, [&] {
    require(checkpoint, kFn, "checkpoint");
    require(out, kFn, "out");
    *out = nullptr;
    auto made = std::make_unique<reservoir_pool_restore>();
    made->result = Allocator::instance().restore_pool(checkpoint->state);
    *out = made.release();
  });
}

void reservoir_pool_checkpoint_free(reservoir_pool_checkpoint* checkpoint) {
  delete checkpoint;
}

size_t reservoir_pool_restore_count(const reservoir_pool_restore* result, int which) {
  if (result == nullptr) return 0;
  return which == 0 ? result->result.freed.size() : result->result.allocated.size();
}

void* reservoir_pool_restore_pointer(const reservoir_pool_restore* result, int which,
                                     size_t index) {
  if (result == nullptr) return nullptr;
  const std::vector<void*>& list = which == 0 ? result->result.freed : result->result.allocated;
  return index < list.size() ? list[index] : nullptr;
}

void reservoir_pool_restore_free(reservoir_pool_restore* result) {
  delete result;
}

}  // extern "C"
