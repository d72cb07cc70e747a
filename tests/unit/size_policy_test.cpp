#include "engine/books/size_policy.hpp"

#include <gtest/gtest.h>

namespace reservoir::detail {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(SizePolicy, RoundToPower2Division) {
  EXPECT_EQ(SizePolicy::round_to_power2_division(1200, 4), 1280u);
  EXPECT_EQ(SizePolicy::round_to_power2_division(1024, 4), 1024u);
  EXPECT_EQ(SizePolicy::round_to_power2_division(1281, 4), 1536u);
  EXPECT_EQ(SizePolicy::round_to_power2_division(300 * MiB, 2), 384 * MiB);
  EXPECT_EQ(SizePolicy::round_to_power2_division(3, 8), 4u);  // step 0 -> next power
}

TEST(SizePolicy, SegmentSizes) {
  EXPECT_EQ(SizePolicy::segment_size(512), 2 * MiB);
  EXPECT_EQ(SizePolicy::segment_size(MiB), 2 * MiB);
  EXPECT_EQ(SizePolicy::segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(SizePolicy::segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(SizePolicy::segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(SizePolicy::segment_size(10 * MiB + 512), 12 * MiB);
}

TEST(SizePolicy, SplitRules) {
  SizePolicy p{Config{}};
  EXPECT_TRUE(p.should_split(detail::kSmallPool, 2 * MiB, 2 * MiB - 512));  // small: >= 512 left
  EXPECT_FALSE(p.should_split(detail::kSmallPool, 2 * MiB, 2 * MiB - 256));
  EXPECT_TRUE(p.should_split(detail::kLargePool, 20 * MiB, 18 * MiB));  // large: > 1 MiB left
  EXPECT_FALSE(p.should_split(detail::kLargePool, 20 * MiB, 19 * MiB));
  SizePolicy capped{Config::parse("max_split_size_mb:64")};
  EXPECT_FALSE(capped.should_split(detail::kLargePool, 200 * MiB, 64 * MiB));  // oversize: never
  EXPECT_TRUE(capped.should_split(detail::kLargePool, 200 * MiB, 63 * MiB));
  SizePolicy expandable{Config::parse("expandable_segments:True")};
  EXPECT_TRUE(expandable.should_split(detail::kLargePool, 20 * MiB, 19 * MiB));
}

TEST(SizePolicy, OversizeServing) {
  SizePolicy p{Config::parse("max_split_size_mb:100")};
  EXPECT_FALSE(p.may_serve(200 * MiB, 50 * MiB));
  EXPECT_TRUE(p.may_serve(200 * MiB, 190 * MiB));
  EXPECT_FALSE(p.may_serve(200 * MiB, 180 * MiB));
  EXPECT_TRUE(p.may_serve(99 * MiB, 50 * MiB));
}

TEST(SizePolicy, RoundingWithDivisions) {
  SizePolicy p{Config::parse("roundup_power2_divisions:[1:1,>:4]")};
  EXPECT_EQ(p.round(1), 512u);
  EXPECT_EQ(p.round(5000), 5120u);  // 4 divisions apply from the first interval on
  EXPECT_EQ(p.round(3 * MiB + 1), 3 * MiB + 512 * 1024);
}

}  // namespace
}  // namespace reservoir::detail
