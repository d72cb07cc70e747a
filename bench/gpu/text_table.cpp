#include "text_table.hpp"

#include <algorithm>
#include <cmath>

namespace reservoir_bench {

std::string with_separators(long long v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out = v < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string format_value(double v, bool ratio) {
  char buf[64];
  if (v < 0) return "n/a";
  if (ratio) {
    std::snprintf(buf, sizeof buf, "%.3f", v);
    return buf;
  }
  if (v < 1000) {
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
  }
  return with_separators(std::llround(v));
}

void print_table(const TextTable& t, std::FILE* out) {
  std::vector<std::size_t> width(t.header.size());
  for (std::size_t c = 0; c < width.size(); ++c) {
    width[c] = t.header[c].size();
    for (const auto& r : t.rows) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const int w = static_cast<int>(width[c]);
      if (c == 0) {
        std::fprintf(out, "%-*s", w, cells[c].c_str());
      } else {
        std::fprintf(out, " | %*s", w, cells[c].c_str());
      }
    }
    std::fprintf(out, "\n");
  };
  line(t.header);
  std::size_t total = 0;
  for (std::size_t c = 0; c < width.size(); ++c) total += width[c] + (c == 0 ? 0 : 3);
  std::fprintf(out, "%s\n", std::string(total, '-').c_str());
  for (const auto& r : t.rows) line(r);
  std::fflush(out);
}

std::string markdown_table(const TextTable& t) {
  auto line = [](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (const auto& c : cells) s += ' ' + c + " |";
    return s + '\n';
  };
  std::string s = line(t.header) + "|";
  for (std::size_t c = 0; c < t.header.size(); ++c) s += c == 0 ? "---|" : "---:|";
  s += '\n';
  for (const auto& r : t.rows) s += line(r);
  return s;
}

}  // namespace reservoir_bench
