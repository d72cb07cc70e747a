// reservoir-replay --plot: requested and reserved memory over a trace, one panel per
// setting, each with its own y scale, so a setting that reserves 85 GiB does not
// squash one that reserves 13 GiB to a line. Uses the timelines of ReplayResult
// (ReplayOptions::timeline_points).
//
// The chart is laid out once (layout_chart) and drawn on a Canvas; plot_svg.hpp and
// plot_png.hpp are the two canvases. The format follows the file name: .svg always,
// .png when the build found cairo (libcairo2-dev).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "replay.hpp"

namespace reservoir::replay {

enum class PlotFormat { svg, png };

// The format a file name asks for (.svg or .png, any case); nullopt for others.
std::optional<PlotFormat> plot_format(const std::string& path);
// Whether this build writes PNG (cairo was found at configure time).
bool png_supported();
// Why path cannot be plotted by this build, as a message for the user; "" if it
// can. Checked before any replay.
std::string plot_refusal(const std::string& path);
// Writes the chart to path in its format. Throws std::runtime_error naming path.
void write_plot(const std::string& path, const std::string& trace_name,
                const std::vector<ReplayResult>& results);

// ---- Layout, shared by the canvases (exposed for tests) ----

// A y axis: memory in unit (GiB, MiB or KiB, whichever keeps the top >= 1), from 0 to
// max, ticks every step.
struct Axis {
  double max = 1, step = 1;
  double unit_bytes = 1;
  std::string unit;  // "GiB", ...
};

// One setting: its series and its own y axis. Pixel coordinates of the plot area.
struct Panel {
  const ReplayResult* result = nullptr;
  std::string title;
  std::string color;  // of the reserved series
  Axis y;
  double left = 0, top = 0, width = 0, height = 0;
};

struct ChartLayout {
  double width = 0, height = 0;
  double x_max = 1, x_step = 1;  // events, shared by every panel
  std::vector<Panel> panels;
};

ChartLayout layout_chart(const std::vector<ReplayResult>& results);

// ---- Drawing surface ----

enum class Anchor { start, middle, end };

struct Stroke {
  std::string color = "#000000";  // "#rrggbb"
  double width = 1;
  bool dashed = false;
};

class Canvas {
 public:
  virtual ~Canvas() = default;
  virtual void line(double x1, double y1, double x2, double y2, const Stroke& s) = 0;
  virtual void polyline(const std::vector<double>& xy, const Stroke& s) = 0;  // x0,y0,x1,...
  virtual void frame(double x, double y, double w, double h, const Stroke& s) = 0;
  // y is the baseline; vertical text reads bottom to top around (x, y).
  virtual void text(double x, double y, const std::string& s, Anchor anchor, double size,
                    bool vertical = false) = 0;
};

// Draws the whole chart (white background assumed) onto canvas.
void draw_chart(Canvas& canvas, const ChartLayout& layout, const std::string& trace_name);

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about target ticks
// over [0, range].
double nice_step(double range, int target);

}  // namespace reservoir::replay
