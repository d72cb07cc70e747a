// SVG canvas for the replay chart.
#include "plot_svg.hpp"

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace reservoir::replay {

namespace {

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

std::string stroke_attributes(const Stroke& s) {
  return " fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"" + num(s.width) + "\"" +
         (s.dashed ? " stroke-dasharray=\"6 3\"" : "");
}

class SvgCanvas final : public Canvas {
 public:
  explicit SvgCanvas(std::string* out) : out_(*out) {}

  void line(double x1, double y1, double x2, double y2, const Stroke& s) override {
    out_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
            num(y2) + "\"" + stroke_attributes(s) + "/>\n";
  }
  void polyline(const std::vector<double>& xy, const Stroke& s) override {
    out_ += "<polyline" + stroke_attributes(s) + " points=\"";
    for (std::size_t i = 0; i + 1 < xy.size(); i += 2)
      out_ += num(xy[i]) + "," + num(xy[i + 1]) + " ";
    out_ += "\"/>\n";
  }
  void frame(double x, double y, double w, double h, const Stroke& s) override {
    out_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" +
            num(h) + "\"" + stroke_attributes(s) + "/>\n";
  }
  void text(double x, double y, const std::string& s, Anchor anchor, double size,
            bool vertical) override {
    static constexpr const char* kAnchors[] = {"start", "middle", "end"};
    const std::string where =
        vertical ? " transform=\"translate(" + num(x) + " " + num(y) + ") rotate(-90)\""
                 : " x=\"" + num(x) + "\" y=\"" + num(y) + "\"";
    out_ += "<text" + where + " text-anchor=\"" + kAnchors[static_cast<int>(anchor)] +
            "\" font-size=\"" + num(size) + "\">" + escape(s) + "</text>\n";
  }

 private:
  std::string& out_;
};

}  // namespace

std::string render_svg(const ChartLayout& layout, const std::string& trace_name) {
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(layout.width) + "\" height=\"" +
         num(layout.height) + "\" viewBox=\"0 0 " + num(layout.width) + " " + num(layout.height) +
         "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  SvgCanvas canvas(&svg);
  draw_chart(canvas, layout, trace_name);
  svg += "</svg>\n";
  return svg;
}

std::string render_svg(const std::string& trace_name, const std::vector<ReplayResult>& results) {
  return render_svg(layout_chart(results), trace_name);
}

void write_svg(const std::string& path, const ChartLayout& layout, const std::string& trace_name) {
  std::ofstream out(path, std::ios::binary);
  if (out) out << render_svg(layout, trace_name);
  if (!out) throw std::runtime_error("cannot write plot '" + path + "'");
}

}  // namespace reservoir::replay
