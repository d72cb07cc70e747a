// An SVG chart of requested and reserved memory over a trace, one series pair per
// config, readable on its own (title, axes with units, legend). Uses the timelines of
// ReplayResult (ReplayOptions::timeline_points).
#pragma once

#include <string>
#include <vector>

#include "replay.hpp"

namespace reservoir::replay {

// The SVG document. trace_name is shown in the title.
std::string render_svg(const std::string& trace_name, const std::vector<ReplayResult>& results);

// Writes render_svg(...) to path; throws std::runtime_error naming path on failure.
void write_svg(const std::string& path, const std::string& trace_name,
               const std::vector<ReplayResult>& results);

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about target ticks
// over [0, range]. Exposed for tests.
double nice_step(double range, int target);

}  // namespace reservoir::replay
