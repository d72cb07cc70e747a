// Replays every file of tests/corpus/ (seeds and minimized crashers) through the
// random-walk interpreter, one test per file, so that each CI flavour (release,
// checks, ASan/UBSan, TSan) runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/random_walk.hpp"

namespace {

namespace fs = std::filesystem;

std::vector<std::string> corpus_files() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(RESERVOIR_CORPUS_DIR))
    if (entry.is_regular_file()) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class Corpus : public ::testing::TestWithParam<std::string> {};

TEST_P(Corpus, ReplaysWithoutFinding) {
  std::ifstream in(fs::path(RESERVOIR_CORPUS_DIR) / GetParam(), std::ios::binary);
  ASSERT_TRUE(in) << "cannot open " << GetParam();
  const std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(in),
                                        std::istreambuf_iterator<char>()};
  EXPECT_EQ(reservoir::fuzz::run_walk(bytes.data(), bytes.size()), "") << GetParam();
}

TEST(CorpusDir, HoldsTheSeeds) {
  EXPECT_GE(corpus_files().size(), 20u);
}

// Test names allow only [A-Za-z0-9_].
std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Files, Corpus, ::testing::ValuesIn(corpus_files()), test_name);

}  // namespace
