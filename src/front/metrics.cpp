// Allocator::metrics_prometheus / metrics_json: the statistics of every device in
// the Prometheus text exposition format (version 0.0.4) and as JSON, for scraping
// and dashboards. docs/observability.md lists the series.
#include <cstdint>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"

namespace reservoir {
namespace {

constexpr const char* kPools[kPoolKinds] = {"all", "small", "large"};

// One StatArray exported as a gauge family (current value) and its *_peak family.
struct ArrayMetric {
  const char* name;
  const char* help;
  StatArray DeviceStats::*member;
  const char* json_name;  // the torch.cuda.memory_stats() family name
};
constexpr ArrayMetric kArrays[] = {
    {"reservoir_allocated_bytes", "Bytes of blocks handed to the program (rounded sizes).",
     &DeviceStats::allocated_bytes, "allocated_bytes"},
    {"reservoir_reserved_bytes", "Bytes held from the device (segments).",
     &DeviceStats::reserved_bytes, "reserved_bytes"},
    {"reservoir_active_bytes", "Bytes of blocks allocated or freed but awaiting stream work.",
     &DeviceStats::active_bytes, "active_bytes"},
    {"reservoir_requested_bytes", "Bytes the program asked for (before rounding).",
     &DeviceStats::requested_bytes, "requested_bytes"},
    {"reservoir_inactive_split_bytes",
     "Bytes of free blocks inside split segments (not releasable without defragmenting).",
     &DeviceStats::inactive_split_bytes, "inactive_split_bytes"},
    {"reservoir_allocations", "Blocks handed to the program.", &DeviceStats::allocation,
     "allocation"},
    {"reservoir_active_allocations", "Blocks allocated or freed but awaiting stream work.",
     &DeviceStats::active, "active"},
    {"reservoir_segments", "Device allocations (segments) held.", &DeviceStats::segment, "segment"},
    {"reservoir_inactive_split_blocks", "Free blocks inside split segments.",
     &DeviceStats::inactive_split, "inactive_split"},
};

struct CounterMetric {
  const char* name;
  const char* help;
  std::int64_t DeviceStats::*member;
  const char* json_name;
};
constexpr CounterMetric kCounters[] = {
    {"reservoir_alloc_retries_total", "Device allocations retried after releasing the cache.",
     &DeviceStats::num_alloc_retries, "num_alloc_retries"},
    {"reservoir_ooms_total", "Out-of-memory errors raised.", &DeviceStats::num_ooms, "num_ooms"},
    {"reservoir_sync_all_streams_total", "Waits for every pending free (cache release).",
     &DeviceStats::num_sync_all_streams, "num_sync_all_streams"},
    {"reservoir_device_allocs_total", "Device allocations (cudaMalloc and maps).",
     &DeviceStats::num_device_alloc, "num_device_alloc"},
    {"reservoir_device_frees_total", "Device frees (cudaFree and unmaps).",
     &DeviceStats::num_device_free, "num_device_free"},
    {"reservoir_device_maps_total", "Pages mapped (expandable segments, policy:compact).",
     &DeviceStats::num_device_map, "num_device_map"},
    {"reservoir_device_unmaps_total", "Pages unmapped.", &DeviceStats::num_device_unmap,
     "num_device_unmap"},
    {"reservoir_stream_waits_total",
     "Device-side waits inserted to reuse memory across streams (policy:compact).",
     &DeviceStats::num_stream_waits, "num_stream_waits"},
};

struct DeviceMetrics {
  int device;
  DeviceStats stats;
  std::size_t largest_cached_block;
  std::vector<TagState> tags;
};

// The devices to report. Allocator has no way to ask which engines exist without
// creating them, so every device is reported: creating an engine is host-only.
std::vector<DeviceMetrics> collect(Allocator& a) {
  std::vector<DeviceMetrics> out;
  for (int d : a.devices_in_use())  // never creates an engine (or a CUDA context)
    out.push_back(DeviceMetrics{d, a.stats(d), a.largest_cached_block(d), a.tag_states(d)});
  return out;
}

std::int64_t unallocated(const DeviceStats& s, int pool) {
  return s.reserved_bytes.pool[pool].current - s.allocated_bytes.pool[pool].current;
}

void header(std::string& out, const std::string& name, const char* help, const char* type) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels,
            std::int64_t value) {
  out += name + "{" + labels + "} " + std::to_string(value) + "\n";
}

std::string device_label(int device) {
  return "device=\"" + std::to_string(device) + "\"";
}
std::string pool_labels(int device, int pool) {
  return device_label(device) + ",pool=\"" + kPools[pool] + "\"";
}

void json_stat(std::string& out, const Stat& s) {
  out += "{\"current\":" + std::to_string(s.current) + ",\"peak\":" + std::to_string(s.peak) +
         ",\"allocated\":" + std::to_string(s.allocated) + ",\"freed\":" + std::to_string(s.freed) +
         "}";
}

}  // namespace

std::string Allocator::metrics_prometheus() {
  const std::vector<DeviceMetrics> devices = collect(*this);
  std::string out;
  for (const ArrayMetric& m : kArrays) {
    for (bool peak : {false, true}) {
      const std::string name = peak ? std::string(m.name) + "_peak" : std::string(m.name);
      header(out, name, peak ? "Highest value since the last peak reset." : m.help, "gauge");
      for (const DeviceMetrics& d : devices)
        for (int pool = 0; pool < kPoolKinds; ++pool) {
          const Stat& s = (d.stats.*(m.member)).pool[pool];
          sample(out, name, pool_labels(d.device, pool), peak ? s.peak : s.current);
        }
    }
  }
  header(out, "reservoir_reserved_unallocated_bytes",
         "Reserved bytes not allocated to the program (cached, free for reuse).", "gauge");
  for (const DeviceMetrics& d : devices)
    for (int pool = 0; pool < kPoolKinds; ++pool)
      sample(out, "reservoir_reserved_unallocated_bytes", pool_labels(d.device, pool),
             unallocated(d.stats, pool));
  header(out, "reservoir_largest_cached_block_bytes", "Size of the largest cached (free) block.",
         "gauge");
  for (const DeviceMetrics& d : devices)
    sample(out, "reservoir_largest_cached_block_bytes", device_label(d.device),
           static_cast<std::int64_t>(d.largest_cached_block));
  for (const CounterMetric& m : kCounters) {
    header(out, m.name, m.help, "counter");
    for (const DeviceMetrics& d : devices)
      sample(out, m.name, device_label(d.device), d.stats.*(m.member));
  }
  // Tagged memory (docs/sleep.md); tag names need no escaping (letters, digits, _-.:).
  header(out, "reservoir_tag_bytes",
         "Memory of a tag: allocated, reserved (mapped now), asleep (given back by sleep), "
         "offloaded (its contents in host memory).",
         "gauge");
  for (const DeviceMetrics& d : devices)
    for (const TagState& t : d.tags) {
      const std::string labels = device_label(d.device) + ",tag=\"" + t.name + "\",kind=\"";
      sample(out, "reservoir_tag_bytes", labels + "allocated\"",
             static_cast<std::int64_t>(t.allocated_bytes));
      sample(out, "reservoir_tag_bytes", labels + "reserved\"",
             static_cast<std::int64_t>(t.reserved_bytes));
      sample(out, "reservoir_tag_bytes", labels + "asleep\"",
             static_cast<std::int64_t>(t.asleep_bytes));
      sample(out, "reservoir_tag_bytes", labels + "offloaded\"",
             static_cast<std::int64_t>(t.offloaded_bytes));
    }
  header(out, "reservoir_host_kept_bytes",
         "Pinned host memory kept after a wake for the next offload (empty_host_cache frees "
         "it).",
         "gauge");
  for (const DeviceMetrics& d : devices)
    sample(out, "reservoir_host_kept_bytes", device_label(d.device), d.stats.host_kept_bytes);
  header(out, "reservoir_tag_asleep", "1 while the tag sleeps.", "gauge");
  for (const DeviceMetrics& d : devices)
    for (const TagState& t : d.tags)
      sample(out, "reservoir_tag_asleep", device_label(d.device) + ",tag=\"" + t.name + "\"",
             t.asleep ? 1 : 0);
  return out;
}

std::string Allocator::metrics_json() {
  const std::vector<DeviceMetrics> devices = collect(*this);
  std::string out = "{\"devices\":[";
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const DeviceMetrics& d = devices[i];
    if (i) out += ",";
    out += "{\"device\":" + std::to_string(d.device) + ",\"stats\":{";
    bool first = true;
    for (const ArrayMetric& m : kArrays) {
      out += first ? "\"" : ",\"";
      first = false;
      out += std::string(m.json_name) + "\":{";
      for (int pool = 0; pool < kPoolKinds; ++pool) {
        out += std::string(pool ? ",\"" : "\"") + kPools[pool] + "\":";
        json_stat(out, (d.stats.*(m.member)).pool[pool]);
      }
      out += "}";
    }
    out += ",\"oversize_allocations\":";
    json_stat(out, d.stats.oversize_allocations);
    out += ",\"oversize_segments\":";
    json_stat(out, d.stats.oversize_segments);
    out += "}";
    for (const CounterMetric& m : kCounters)
      out += ",\"" + std::string(m.json_name) + "\":" + std::to_string(d.stats.*(m.member));
    out += ",\"max_split_size\":" + std::to_string(d.stats.max_split_size);
    out += ",\"largest_cached_block\":" + std::to_string(d.largest_cached_block);
    out += ",\"host_kept_bytes\":" + std::to_string(d.stats.host_kept_bytes);
    out += ",\"reserved_unallocated_bytes\":{";
    for (int pool = 0; pool < kPoolKinds; ++pool)
      out += std::string(pool ? ",\"" : "\"") + kPools[pool] +
             "\":" + std::to_string(unallocated(d.stats, pool));
    out += "},\"tags\":[";
    for (std::size_t t = 0; t < d.tags.size(); ++t) {
      const TagState& g = d.tags[t];
      out += std::string(t ? "," : "") + "{\"name\":\"" + g.name +
             "\",\"asleep\":" + (g.asleep ? "true" : "false") +
             ",\"allocated_bytes\":" + std::to_string(g.allocated_bytes) +
             ",\"reserved_bytes\":" + std::to_string(g.reserved_bytes) +
             ",\"asleep_bytes\":" + std::to_string(g.asleep_bytes) +
             ",\"offloaded_bytes\":" + std::to_string(g.offloaded_bytes) + "}";
    }
    out += "]}";
  }
  out += "]}";
  return out;
}

}  // namespace reservoir
