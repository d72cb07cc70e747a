// reservoir_gpu_bench's tables, printed and as markdown: the first column left-aligned
// (what was measured), every other column right-aligned (numbers). Plain C++.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace reservoir_bench {

// Invariant: every row has header.size() cells.
struct TextTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

// 1234567 -> "1,234,567" (as in the anchors' tables).
std::string with_separators(long long v);

// v < 0: "n/a"; a ratio with 3 decimals; ns under 1000 with one decimal, from 1000 on
// whole, with thousands separators.
std::string format_value(double v, bool ratio = false);

void print_table(const TextTable& t, std::FILE* out);
std::string markdown_table(const TextTable& t);

}  // namespace reservoir_bench
