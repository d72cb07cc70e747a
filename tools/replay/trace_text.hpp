// Field and message helpers shared by the trace reader's files (trace_reader.cpp,
// trace_pools.cpp).
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

namespace reservoir::replay {

// Unsigned decimal filling the whole field; false on anything else (sign, space,
// overflow, empty).
inline bool parse_u64(std::string_view field, std::uint64_t& value) {
  if (field.empty()) return false;
  const char* end = field.data() + field.size();
  auto [ptr, ec] = std::from_chars(field.data(), end, value);
  return ec == std::errc{} && ptr == end;
}

// Whether a byte would reach a terminal as itself: printable ASCII.
inline bool printable(char c) {
  return c >= 0x20 && c < 0x7f;
}

// The start of line in quotes, for messages: bytes that are not printable ASCII are
// written \xHH, so binary input never reaches the terminal raw.
inline std::string quoted(std::string_view line) {
  constexpr std::size_t kMax = 60;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "'";
  for (const char c : line.substr(0, kMax)) {
    if (printable(c)) {
      s += c;
    } else {
      const auto u = static_cast<unsigned char>(c);
      s += "\\x";
      s += kHex[u >> 4];
      s += kHex[u & 15];
    }
  }
  if (line.size() > kMax) s += "...";
  s += "'";
  return s;
}

}  // namespace reservoir::replay
