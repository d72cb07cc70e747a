// The sentences of explain.hpp. Each names the statistic it rests on, so a reader
// can check it against the table or the JSON.
#include "explain.hpp"

#include <algorithm>

#include "report.hpp"

namespace reservoir::replay {

namespace {

std::string percent(std::uint64_t part, std::uint64_t whole) {
  return whole == 0 ? "0%"
                    : printf_string("%.0f%%",
                                    100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

}  // namespace

std::string describe_oom(const OomFacts& o) {
  const std::string device = o.simulated ? "the simulated device" : "the device";
  std::string m =
      "event " + with_commas(o.event) +
      (o.wake_tag.empty() ? " (an allocation of " + human_bytes(o.requested) + " on trace stream " +
                                std::to_string(o.stream) + ") failed"
                          : " (the wake of tag '" + o.wake_tag + "', " + human_bytes(o.requested) +
                                " asleep) failed");
  if (o.device_request == 0) {
    m += ": the request is larger than any device.";
    return m;
  }
  m += ": it needed " + human_bytes(o.device_request) + " more from " + device + ", which had " +
       human_bytes(o.device_free) + " free of " + human_bytes(o.device_total);
  if (o.allowed > 0)
    m += ", and the memory fraction " + printf_string("%.4g", o.fraction) + " allows " +
         human_bytes(o.allowed);
  const std::uint64_t cached = o.reserved > o.allocated ? o.reserved - o.allocated : 0;
  m += ". After releasing what it could, Reservoir held " + human_bytes(o.reserved) + ": " +
       human_bytes(o.allocated) + " allocated, " + human_bytes(cached) +
       " cached in blocks too small for the request or waiting on other streams. ";
  // Cached memory at least as large as the request means the request would have
  // fitted but for fragmentation; otherwise live memory alone is too much.
  if (cached >= o.requested && !o.expandable_segments)
    m += "Fragmentation: compare --config expandable_segments:True, which can reuse that "
         "memory; or give a larger --capacity.";
  else
    m += "The live memory needs more room here: give a larger --capacity (--fit finds the "
         "smallest memory this setting runs in).";
  return m;
}

std::string explain_ratio(const ReplayResult& r) {
  if (r.peak_requested == 0 || r.ratio < kExplainRatio) return "";
  const CacheFacts& c = r.cache;
  const std::string why = "why " + config_label(r.config) + " reserves " +
                          printf_string("%.2f", r.ratio) + "x requested: ";
  const std::uint64_t excess = r.peak_reserved - std::min(r.peak_reserved, r.peak_requested);

  // Oversize segments: blocks of max_split_size and more are never split, and serve
  // only requests at most max_non_split_rounding smaller, so requests of new sizes
  // take new segments while the old ones stay cached.
  if (c.max_split_size > 0 && c.oversize_segments_peak > 0) {
    const std::uint64_t held =
        c.at_peak ? c.oversize_segment_bytes : c.oversize_segments_peak * c.max_split_size;
    const std::uint64_t segments = c.at_peak ? c.oversize_segment_count : c.oversize_segments_peak;
    if (2 * held >= r.peak_reserved) {
      return why + "blocks of " + human_bytes(c.max_split_size) +
             " and more are never split, and one serves only a request at most " +
             human_bytes(c.max_non_split_rounding) + " smaller; so " + with_commas(segments) +
             " such segments (" + (c.at_peak ? "" : "at least ") + human_bytes(held) + ", " +
             percent(held, r.peak_reserved) + " of peak reserved) piled up for at most " +
             with_commas(c.oversize_allocations_peak) + " oversize allocations live at once.";
    }
  }
  // Fragmentation: free memory inside split segments that requests could not use.
  if (2 * c.inactive_split_bytes_peak >= excess) {
    return why + "up to " + human_bytes(c.inactive_split_bytes_peak) +
           " sat free inside split segments (fragmentation: the free pieces were too small "
           "for the requests that came); compare --config expandable_segments:True.";
  }
  // Rounding: allocated bytes are requests rounded up to block sizes.
  const std::uint64_t rounding = r.peak_allocated - std::min(r.peak_allocated, r.peak_requested);
  if (2 * rounding >= excess) {
    return why + "rounding: at the peak, blocks held " +
           printf_string("%.2f", static_cast<double>(r.peak_allocated) /
                                     static_cast<double>(r.peak_requested)) +
           "x the requested bytes (peak allocated " + human_bytes(r.peak_allocated) + ").";
  }
  return why + human_bytes(r.peak_reserved - std::min(r.peak_reserved, r.peak_allocated)) +
         " more than the peak allocated was held: whole cached segments that later requests "
         "(of other sizes, or on other streams) did not reuse.";
}

}  // namespace reservoir::replay
