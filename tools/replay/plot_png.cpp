// PNG canvas for the replay chart, on a cairo image surface. Without cairo at
// configure time this file only says so (png_supported() is false).
#include "plot_png.hpp"

#include <stdexcept>

#if RESERVOIR_REPLAY_HAVE_CAIRO
#include <cairo.h>

#include <cmath>
#include <memory>
#endif

#if RESERVOIR_REPLAY_HAVE_CAIRO

// cairo's text goes through fontconfig, whose caches live until exit: not a leak of
// ours, so LeakSanitizer is told to let it pass in sanitized builds (of the tool and
// of its tests; both link this file).
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RESERVOIR_REPLAY_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(RESERVOIR_REPLAY_ASAN)
extern "C" __attribute__((visibility("default"), used)) const char* __lsan_default_suppressions() {
  return "leak:libfontconfig.so\n";
}
#endif

#endif

namespace reservoir::replay {

#if RESERVOIR_REPLAY_HAVE_CAIRO

namespace {

class CairoCanvas final : public Canvas {
 public:
  explicit CairoCanvas(cairo_t* cr) : cr_(cr) {
    cairo_select_font_face(cr_, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  }

  void line(double x1, double y1, double x2, double y2, const Stroke& s) override {
    cairo_move_to(cr_, x1, y1);
    cairo_line_to(cr_, x2, y2);
    stroke(s);
  }
  void polyline(const std::vector<double>& xy, const Stroke& s) override {
    if (xy.size() < 2) return;
    cairo_move_to(cr_, xy[0], xy[1]);
    for (std::size_t i = 2; i + 1 < xy.size(); i += 2) cairo_line_to(cr_, xy[i], xy[i + 1]);
    cairo_set_line_join(cr_, CAIRO_LINE_JOIN_ROUND);
    stroke(s);
  }
  void frame(double x, double y, double w, double h, const Stroke& s) override {
    cairo_rectangle(cr_, x, y, w, h);
    stroke(s);
  }
  void text(double x, double y, const std::string& s, Anchor anchor, double size,
            bool vertical) override {
    cairo_save(cr_);
    cairo_set_source_rgb(cr_, 0, 0, 0);
    cairo_set_font_size(cr_, size);
    cairo_translate(cr_, x, y);
    if (vertical) cairo_rotate(cr_, -M_PI / 2);
    cairo_text_extents_t ext;
    cairo_text_extents(cr_, s.c_str(), &ext);
    const double shift = anchor == Anchor::start    ? 0
                         : anchor == Anchor::middle ? ext.x_advance / 2
                                                    : ext.x_advance;
    cairo_move_to(cr_, -shift, 0);
    cairo_show_text(cr_, s.c_str());
    cairo_restore(cr_);
  }

 private:
  void stroke(const Stroke& s) {
    const unsigned long rgb = std::stoul(s.color.substr(1), nullptr, 16);
    cairo_set_source_rgb(cr_, static_cast<double>((rgb >> 16) & 0xff) / 255.0,
                         static_cast<double>((rgb >> 8) & 0xff) / 255.0,
                         static_cast<double>(rgb & 0xff) / 255.0);
    cairo_set_line_width(cr_, s.width);
    static constexpr double kDash[] = {6, 3};
    cairo_set_dash(cr_, kDash, s.dashed ? 2 : 0, 0);
    cairo_stroke(cr_);
  }

  cairo_t* cr_;
};

}  // namespace

bool png_supported() {
  return true;
}

void write_png(const std::string& path, const ChartLayout& layout, const std::string& trace_name) {
  const auto w = static_cast<int>(std::ceil(layout.width));
  const auto h = static_cast<int>(std::ceil(layout.height));
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
      cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h), &cairo_surface_destroy);
  std::unique_ptr<cairo_t, decltype(&cairo_destroy)> cr(cairo_create(surface.get()),
                                                        &cairo_destroy);
  cairo_set_source_rgb(cr.get(), 1, 1, 1);
  cairo_paint(cr.get());
  CairoCanvas canvas(cr.get());
  draw_chart(canvas, layout, trace_name);
  cairo_surface_flush(surface.get());
  const cairo_status_t status = cairo_surface_write_to_png(surface.get(), path.c_str());
  if (status != CAIRO_STATUS_SUCCESS)
    throw std::runtime_error("cannot write plot '" + path + "': " + cairo_status_to_string(status));
}

#else

bool png_supported() {
  return false;
}

void write_png(const std::string& path, const ChartLayout&, const std::string&) {
  throw std::runtime_error(plot_refusal(path));
}

#endif

}  // namespace reservoir::replay
