// The statistics table (Allocator::summary), laid out like
// torch.cuda.memory_summary() so that users find what they know.
#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/device/oom_report.hpp"
#include "reservoir/allocator.hpp"
#include "util/format.hpp"

namespace reservoir {

const char* const* stat_array_names() noexcept {
  static const char* const names[] = {
      "allocation",      "segment",        "active",       "inactive_split",
      "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
      "requested_bytes"};
  return names;
}

namespace {

std::string cell(std::int64_t v, bool bytes) {
  if (bytes) return detail::format_size(static_cast<std::uint64_t>(v < 0 ? 0 : v));
  return std::to_string(v);
}

void row(std::string& out, const char* name, const Stat& s, bool bytes) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "| %-22s| %12s | %12s | %12s | %12s |\n", name,
                cell(s.current, bytes).c_str(), cell(s.peak, bytes).c_str(),
                cell(s.allocated, bytes).c_str(), cell(s.freed, bytes).c_str());
  out += buf;
}

void block(std::string& out, const char* name, const StatArray& a, bool bytes, bool abbreviated) {
  row(out, name, a.all(), bytes);
  if (!abbreviated) {
    row(out, "      from large pool", a.large(), bytes);
    row(out, "      from small pool", a.small(), bytes);
  }
  out += "|-----------------------+--------------+--------------+--------------+--------------|\n";
}

// The setting in force: 0 or less (SIZE_MAX cast to int64) and anything past 4 EiB
// mean that no block is too large to split.
std::string split_size(std::int64_t max_split_size) {
  if (max_split_size <= 0 || max_split_size >= (std::int64_t{1} << 62)) return "unlimited";
  return detail::format_size(static_cast<std::uint64_t>(max_split_size));
}

}  // namespace

std::string Allocator::summary(int device) {
  return summary(device, SummaryOptions{});
}

std::string Allocator::summary(int device, const SummaryOptions& options) {
  DeviceStats s = stats(device);
  int d = device;
  if (d < 0 && backend().current_device(&d) != DeviceStatus::ok) d = 0;
  const std::string rule =
      "|=======================+==============+==============+==============+==============|\n";
  std::string out;
  out += rule;
  char buf[200];
  std::snprintf(
      buf, sizeof buf, "| %-82s|\n",
      ("Reservoir memory summary, device " + std::to_string(d) + " (" + backend().name() + ", " +
       (caching() ? "backend:" + engine_name() : std::string("uncached mode")) + ")")
          .c_str());
  out += buf;
  std::snprintf(buf, sizeof buf, "| %-82s|\n",
                ("OOMs: " + std::to_string(s.num_ooms) +
                 "   device allocation retries: " + std::to_string(s.num_alloc_retries) +
                 "   device allocs/frees: " + std::to_string(s.num_device_alloc) + "/" +
                 std::to_string(s.num_device_free))
                    .c_str());
  out += buf;
  std::snprintf(buf, sizeof buf, "| %-82s|\n",
                ("pages mapped/unmapped: " + std::to_string(s.num_device_map) + "/" +
                 std::to_string(s.num_device_unmap) +
                 "   device-side stream waits: " + std::to_string(s.num_stream_waits))
                    .c_str());
  out += buf;
  if (options.sync_and_split) {
    std::snprintf(buf, sizeof buf, "| %-82s|\n",
                  ("synchronizations of all streams: " + std::to_string(s.num_sync_all_streams) +
                   "   max split size: " + split_size(s.max_split_size))
                      .c_str());
    out += buf;
  }
  out += rule;
  out += "| Metric                |  Cur Usage   |  Peak Usage  |  Tot Alloc   |  Tot Freed   |\n";
  out += "|-----------------------+--------------+--------------+--------------+--------------|\n";
  const bool brief = options.abbreviated;
  block(out, "Allocated memory", s.allocated_bytes, true, brief);
  block(out, "Active memory", s.active_bytes, true, brief);
  block(out, "Requested memory", s.requested_bytes, true, brief);
  block(out, "Reserved memory", s.reserved_bytes, true, brief);
  block(out, "Non-releasable memory", s.inactive_split_bytes, true, brief);
  block(out, "Allocations", s.allocation, false, brief);
  block(out, "Active allocs", s.active, false, brief);
  block(out, "Reserved segments", s.segment, false, brief);
  block(out, "Non-releasable allocs", s.inactive_split, false, brief);
  row(out, "Oversize allocations", s.oversize_allocations, false);
  row(out, "Oversize segments", s.oversize_segments, false);
  out += rule;
  std::snprintf(
      buf, sizeof buf, "| %-82s|\n",
      ("Private pools (CUDA graphs, MemPool): " + std::to_string(s.private_pools) + ", reserving " +
       detail::format_size(static_cast<std::uint64_t>(s.private_pool_reserved_bytes)) +
       " of the reserved memory")
          .c_str());
  out += buf;
  // Tagged memory (docs/sleep.md), asleep or not.
  for (const TagState& t : tag_states(d)) {
    const std::string line = "Tag '" + t.name + "': " + detail::format_size(t.allocated_bytes) +
                             " allocated, " + detail::format_size(t.reserved_bytes) + " reserved";
    std::snprintf(buf, sizeof buf, "| %-82s|\n", line.substr(0, 82).c_str());
    out += buf;
    if (!t.asleep) continue;
    const std::string sleep = "  asleep (" +
                              std::string(t.mode == SleepMode::offload ? "offload" : "discard") +
                              "): " + detail::format_size(t.asleep_bytes) + " given back, " +
                              detail::format_size(t.offloaded_bytes) + " kept in host memory";
    std::snprintf(buf, sizeof buf, "| %-82s|\n", sleep.substr(0, 82).c_str());
    out += buf;
  }
  if (s.host_kept_bytes > 0) {
    const std::string kept = "Pinned host memory kept for the next offload: " +
                             detail::format_size(static_cast<std::uint64_t>(s.host_kept_bytes)) +
                             " (empty_host_cache)";
    std::snprintf(buf, sizeof buf, "| %-82s|\n", kept.substr(0, 82).c_str());
    out += buf;
  }
  // Who else holds memory on the device (NVML on CUDA), as the OOM report lists it.
  std::snprintf(buf, sizeof buf, "| %-82s|\n", "Processes using the device:");
  out += buf;
  for (const std::string& line : detail::process_memory_lines(backend(), d)) {
    std::snprintf(buf, sizeof buf, "|   %-80s|\n", line.substr(0, 80).c_str());
    out += buf;
  }
  out += rule;
  return out;
}

}  // namespace reservoir
