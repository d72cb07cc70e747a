// The version query: C++ (reservoir/version.hpp) and C (reservoir_version()) agree
// with each other and with CMake's project(VERSION), passed in by the build.
#include "reservoir/version.hpp"

#include <gtest/gtest.h>

#include <string>

#include "reservoir/reservoir.h"

#ifndef RESERVOIR_EXPECTED_VERSION
#error "the build passes project(VERSION) as RESERVOIR_EXPECTED_VERSION"
#endif

namespace reservoir {
namespace {

TEST(Version, MatchesTheProjectVersion) {
  EXPECT_STREQ(version(), RESERVOIR_EXPECTED_VERSION);
  EXPECT_STREQ(kVersionString, RESERVOIR_EXPECTED_VERSION);
}

TEST(Version, NumbersSpellTheString) {
  const Version v = version_numbers();
  EXPECT_EQ(v.major, kVersionMajor);
  EXPECT_EQ(v.minor, kVersionMinor);
  EXPECT_EQ(v.patch, kVersionPatch);
  EXPECT_EQ(std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch),
            version());
}

TEST(Version, CApiReturnsTheSameStaticString) {
  const char* c = reservoir_version();
  ASSERT_NE(c, nullptr);
  EXPECT_STREQ(c, version());
  EXPECT_EQ(c, reservoir_version());  // static: the same pointer every call
}

}  // namespace
}  // namespace reservoir
