// SVG writer for reservoir-replay --plot. Plain SVG 1.1 with inline styles, so the
// file renders the same in browsers and image viewers without scripts or fonts.
#include "plot_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "report.hpp"

namespace reservoir::replay {

namespace {

// kHeight: down to the x axis label; the legend rows follow.
constexpr double kWidth = 1000, kHeight = 580;
constexpr double kLeft = 80, kRight = 24, kTop = 64, kBottom = 64;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr double kGiBf = 1024.0 * 1024.0 * 1024.0;  // for plotting in GiB

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
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

struct Series {
  const std::vector<std::uint64_t>* values;
  std::size_t bucket;
  std::string color;
  bool dashed;
  std::string label;
};

}  // namespace

double nice_step(double range, int target) {
  if (!(range > 0) || target < 1) return 1;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double m = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  return m * mag;
}

std::string render_svg(const std::string& trace_name, const std::vector<ReplayResult>& results) {
  // Requested memory is the same for every config unless OOMs made them differ;
  // then it is drawn once, in gray.
  bool same_requested = true;
  for (const ReplayResult& r : results)
    same_requested = same_requested && r.timeline.requested == results.front().timeline.requested;

  std::vector<Series> series;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const ReplayResult& r = results[i];
    const std::string color = kColors[i % std::size(kColors)];
    const std::string label = config_label(r.config);
    if (!same_requested)
      series.push_back(
          {&r.timeline.requested, r.timeline.bucket, color, true, "requested (" + label + ")"});
    series.push_back(
        {&r.timeline.reserved, r.timeline.bucket, color, false, "reserved (" + label + ")"});
  }
  if (same_requested && !results.empty())
    series.insert(series.begin(), {&results.front().timeline.requested,
                                   results.front().timeline.bucket, "#444444", true, "requested"});

  double max_bytes = 0, max_events = 0;
  for (const Series& s : series) {
    for (const std::uint64_t v : *s.values) max_bytes = std::max(max_bytes, static_cast<double>(v));
    max_events = std::max(max_events, static_cast<double>(s.values->size() * s.bucket));
  }
  const double y_step = nice_step(std::max(max_bytes / kGiBf, 1e-3), 6);
  const double y_max = std::max(y_step, std::ceil(max_bytes / kGiBf / y_step) * y_step);
  const double x_step = nice_step(std::max(max_events, 1.0), 8);
  const double x_max = std::max(x_step, std::ceil(max_events / x_step) * x_step);
  auto px = [&](double event) { return kLeft + event / x_max * kPlotW; };
  auto py = [&](double gib) { return kTop + kPlotH - gib / y_max * kPlotH; };

  std::string svg;
  svg += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kWidth) +
         "\" height=\"@HEIGHT@\" viewBox=\"0 0 " + num(kWidth) + " @HEIGHT@" +
         "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + num(kWidth / 2) + "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" +
         "Reservoir replay: " + escape(trace_name) + " - requested and reserved memory</text>\n";

  // Grid, ticks and labels.
  // Integer counters: summing a fractional step would drift.
  const long y_ticks = std::lround(y_max / y_step), x_ticks = std::lround(x_max / x_step);
  for (long k = 0; k <= y_ticks; ++k) {
    const double y = static_cast<double>(k) * y_step;
    const std::string yy = num(py(y));
    svg += "<line x1=\"" + num(kLeft) + "\" y1=\"" + yy + "\" x2=\"" + num(kLeft + kPlotW) +
           "\" y2=\"" + yy + "\" stroke=\"#e0e0e0\"/>\n";
    svg += "<text x=\"" + num(kLeft - 8) + "\" y=\"" + num(py(y) + 4) + "\" text-anchor=\"end\">" +
           tick_label(y, y_step) + "</text>\n";
  }
  for (long k = 0; k <= x_ticks; ++k) {
    const double x = static_cast<double>(k) * x_step;
    const std::string xx = num(px(x));
    svg += "<line x1=\"" + xx + "\" y1=\"" + num(kTop + kPlotH) + "\" x2=\"" + xx + "\" y2=\"" +
           num(kTop + kPlotH + 5) + "\" stroke=\"black\"/>\n";
    svg += "<text x=\"" + xx + "\" y=\"" + num(kTop + kPlotH + 20) + "\" text-anchor=\"middle\">" +
           tick_label(x, x_step) + "</text>\n";
  }
  svg += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(kPlotW) +
         "\" height=\"" + num(kPlotH) + "\" fill=\"none\" stroke=\"black\"/>\n";
  svg += "<text x=\"" + num(kLeft + kPlotW / 2) + "\" y=\"" + num(kHeight - 18) +
         "\" text-anchor=\"middle\">event index</text>\n";
  svg += "<text transform=\"translate(22 " + num(kTop + kPlotH / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">memory (GiB)</text>\n";

  // Data: one point per bucket, at its middle.
  for (const Series& s : series) {
    svg += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.5\"" +
           (s.dashed ? " stroke-dasharray=\"6 3\"" : "") + " points=\"";
    for (std::size_t i = 0; i < s.values->size(); ++i) {
      const double event = (static_cast<double>(i) + 0.5) * static_cast<double>(s.bucket);
      svg += num(px(event)) + "," + num(py(static_cast<double>((*s.values)[i]) / kGiBf)) + " ";
    }
    svg += "\"/>\n";
  }

  // Legend below the plot, wrapping into rows: inside the plot it would hide data.
  constexpr double kRow = 18;
  double lx = kLeft, ly = kHeight + kRow / 2;
  for (const Series& se : series) {
    const double item = 52 + 7.0 * static_cast<double>(se.label.size());
    if (lx > kLeft && lx + item > kLeft + kPlotW) {
      lx = kLeft;
      ly += kRow;
    }
    svg += "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(lx + 28) + "\" y2=\"" +
           num(ly) + "\" stroke=\"" + se.color + "\" stroke-width=\"2\"" +
           (se.dashed ? " stroke-dasharray=\"6 3\"" : "") + "/>\n";
    svg += "<text x=\"" + num(lx + 34) + "\" y=\"" + num(ly + 4) + "\">" + escape(se.label) +
           "</text>\n";
    lx += item;
  }
  const double height = ly + kRow;
  // The height is known only now: patch it into the header.
  const std::string placeholder = "@HEIGHT@";
  for (std::size_t p = svg.find(placeholder); p != std::string::npos; p = svg.find(placeholder))
    svg.replace(p, placeholder.size(), num(height));
  svg += "</svg>\n";
  return svg;
}

void write_svg(const std::string& path, const std::string& trace_name,
               const std::vector<ReplayResult>& results) {
  std::ofstream out(path, std::ios::binary);
  if (out) out << render_svg(trace_name, results);
  if (!out) throw std::runtime_error("cannot write plot '" + path + "'");
}

}  // namespace reservoir::replay
