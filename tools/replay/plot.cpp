// Layout and drawing of reservoir-replay's chart, independent of the file format.
#include "plot.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "plot_png.hpp"
#include "plot_svg.hpp"
#include "report.hpp"

namespace reservoir::replay {

namespace {

// Pixels. A panel: its title, the plot area, then tick labels and a gap.
constexpr double kWidth = 1000, kLeft = 84, kRight = 40;
constexpr double kHeader = 70;  // chart title and legend
constexpr double kPanelTitle = 26, kPlotHeight = 180, kPanelBelow = 44;
constexpr double kFooter = 30;  // x axis label under the last panel
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr const char* kRequestedColor = "#555555";

std::string lower_extension(const std::string& path) {
  const std::size_t dot = path.rfind('.');
  const std::size_t slash = path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

// Tick labels: no trailing zeros ("0.5", "2", "1.25"), thousands separated for
// event counts.
std::string tick_label(double v, double step) {
  char buf[32];
  if (step >= 1 && v >= 1000) return with_commas(static_cast<std::uint64_t>(std::llround(v)));
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

Axis memory_axis(std::uint64_t max_bytes) {
  Axis a;
  static constexpr struct {
    double bytes;
    const char* name;
  } kUnits[] = {{1024.0 * 1024 * 1024, "GiB"}, {1024.0 * 1024, "MiB"}, {1024.0, "KiB"}};
  a.unit_bytes = kUnits[2].bytes;
  a.unit = kUnits[2].name;
  for (const auto& u : kUnits) {
    if (static_cast<double>(max_bytes) >= u.bytes) {
      a.unit_bytes = u.bytes;
      a.unit = u.name;
      break;
    }
  }
  const double top = std::max(static_cast<double>(max_bytes) / a.unit_bytes, 1e-3);
  a.step = nice_step(top, 5);
  a.max = std::max(a.step, std::ceil(top / a.step - 1e-9) * a.step);
  return a;
}

std::uint64_t highest(const std::vector<std::uint64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

}  // namespace

double nice_step(double range, int target) {
  if (!(range > 0) || target < 1) return 1;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double m = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  return m * mag;
}

std::optional<PlotFormat> plot_format(const std::string& path) {
  const std::string ext = lower_extension(path);
  if (ext == ".svg") return PlotFormat::svg;
  if (ext == ".png") return PlotFormat::png;
  return std::nullopt;
}

std::string plot_refusal(const std::string& path) {
  const auto format = plot_format(path);
  if (!format)
    return "--plot '" + path + "': the name must end in .svg or .png (the format follows it)";
  if (*format == PlotFormat::png && !png_supported())
    return "--plot '" + path +
           "': this build writes no PNG: install libcairo2-dev (Debian/Ubuntu) and rebuild "
           "(CMake finds it), or plot to a .svg file";
  return "";
}

void write_plot(const std::string& path, const std::string& trace_name,
                const std::vector<ReplayResult>& results) {
  if (const std::string why = plot_refusal(path); !why.empty()) throw std::runtime_error(why);
  const ChartLayout layout = layout_chart(results);
  if (*plot_format(path) == PlotFormat::png)
    write_png(path, layout, trace_name);
  else
    write_svg(path, layout, trace_name);
}

ChartLayout layout_chart(const std::vector<ReplayResult>& results) {
  ChartLayout l;
  l.width = kWidth;
  double max_events = 0;
  for (const ReplayResult& r : results)
    max_events =
        std::max(max_events, static_cast<double>(r.timeline.reserved.size() * r.timeline.bucket));
  l.x_step = nice_step(std::max(max_events, 1.0), 8);
  l.x_max = std::max(l.x_step, std::ceil(max_events / l.x_step - 1e-9) * l.x_step);

  for (std::size_t i = 0; i < results.size(); ++i) {
    const ReplayResult& r = results[i];
    Panel p;
    p.result = &r;
    p.color = kColors[i % std::size(kColors)];
    p.y = memory_axis(std::max(highest(r.timeline.reserved), highest(r.timeline.requested)));
    p.title = config_label(r.config) + ": peak reserved " + human_bytes(r.peak_reserved) + ", " +
              printf_string("%.2f", r.ratio) + "x the peak requested " +
              human_bytes(r.peak_requested);
    p.left = kLeft;
    p.width = kWidth - kLeft - kRight;
    p.top =
        kHeader + static_cast<double>(i) * (kPanelTitle + kPlotHeight + kPanelBelow) + kPanelTitle;
    p.height = kPlotHeight;
    l.panels.push_back(std::move(p));
  }
  l.height = kHeader +
             static_cast<double>(results.size()) * (kPanelTitle + kPlotHeight + kPanelBelow) +
             kFooter;
  return l;
}

void draw_chart(Canvas& c, const ChartLayout& l, const std::string& trace_name) {
  c.text(l.width / 2, 28, "Reservoir replay: " + trace_name + " - memory over the trace",
         Anchor::middle, 16);
  // Legend, once for all panels: inside a panel it would hide data.
  const double ly = 52;
  c.line(kLeft, ly - 4, kLeft + 28, ly - 4, {kRequestedColor, 2, true});
  c.text(kLeft + 34, ly, "requested (what the program asked for)", Anchor::start, 12);
  const double rx = kLeft + 300;
  for (std::size_t i = 0; i < std::min<std::size_t>(l.panels.size(), 4); ++i)
    c.line(rx + 7.0 * static_cast<double>(i), ly - 4, rx + 7.0 * static_cast<double>(i) + 6, ly - 4,
           {l.panels[i].color, 3, false});
  c.text(rx + 34, ly, "reserved (held from the device; one color per setting)", Anchor::start, 12);

  // Integer tick counters: summing a fractional step would drift.
  const long x_ticks = std::lround(l.x_max / l.x_step);
  for (const Panel& p : l.panels) {
    auto px = [&](double event) { return p.left + event / l.x_max * p.width; };
    auto py = [&](double bytes) {
      return p.top + p.height - bytes / p.y.unit_bytes / p.y.max * p.height;
    };
    c.text(p.left, p.top - 9, p.title, Anchor::start, 13);

    const long y_ticks = std::lround(p.y.max / p.y.step);
    for (long k = 0; k <= y_ticks; ++k) {
      const double v = static_cast<double>(k) * p.y.step;
      const double y = p.top + p.height - v / p.y.max * p.height;
      c.line(p.left, y, p.left + p.width, y, {"#e0e0e0", 1, false});
      c.text(p.left - 8, y + 4, tick_label(v, p.y.step), Anchor::end, 11);
    }
    for (long k = 0; k <= x_ticks; ++k) {
      const double v = static_cast<double>(k) * l.x_step;
      c.line(px(v), p.top + p.height, px(v), p.top + p.height + 5, {"#000000", 1, false});
      c.text(px(v), p.top + p.height + 18, tick_label(v, l.x_step), Anchor::middle, 11);
    }
    c.text(p.left - 58, p.top + p.height / 2, p.y.unit, Anchor::middle, 12, true);

    // One point per bucket of events, at its middle.
    auto series = [&](const std::vector<std::uint64_t>& values, std::size_t bucket,
                      const Stroke& stroke) {
      std::vector<double> xy;
      xy.reserve(values.size() * 2);
      for (std::size_t i = 0; i < values.size(); ++i) {
        xy.push_back(px((static_cast<double>(i) + 0.5) * static_cast<double>(bucket)));
        xy.push_back(py(static_cast<double>(values[i])));
      }
      c.polyline(xy, stroke);
    };
    const Timeline& t = p.result->timeline;
    series(t.reserved, t.bucket, {p.color, 1.5, false});
    series(t.requested, t.bucket, {kRequestedColor, 1.5, true});
    c.frame(p.left, p.top, p.width, p.height, {"#000000", 1, false});
  }
  if (!l.panels.empty())
    c.text(kLeft + (kWidth - kLeft - kRight) / 2, l.height - 10, "event index", Anchor::middle, 12);
}

}  // namespace reservoir::replay
