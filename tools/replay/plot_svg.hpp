// The chart of plot.hpp as SVG: plain SVG 1.1 with inline styles, so the file
// renders the same in browsers and image viewers without scripts or fonts.
#pragma once

#include <string>
#include <vector>

#include "plot.hpp"

namespace reservoir::replay {

std::string render_svg(const ChartLayout& layout, const std::string& trace_name);
std::string render_svg(const std::string& trace_name, const std::vector<ReplayResult>& results);

// Writes render_svg(...) to path; throws std::runtime_error naming path on failure.
void write_svg(const std::string& path, const ChartLayout& layout, const std::string& trace_name);

}  // namespace reservoir::replay
