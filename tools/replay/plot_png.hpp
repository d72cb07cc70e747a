// The chart of plot.hpp as PNG, drawn with cairo when the build found it
// (libcairo2-dev; plot.hpp's png_supported() says whether it did).
#pragma once

#include <string>

#include "plot.hpp"

namespace reservoir::replay {

// Throws std::runtime_error naming path when it cannot be written, or when this
// build has no cairo.
void write_png(const std::string& path, const ChartLayout& layout, const std::string& trace_name);

}  // namespace reservoir::replay
