#include "client/bench.h"

#include <vector>

#include "gtest/gtest.h"

namespace transpose {
namespace {

TEST(NearestRankPercentileTest, TakesTheSmallestValueWithPAtOrBelowIt) {
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_EQ(NearestRankPercentile(hundred, 0.50), 50);
  EXPECT_EQ(NearestRankPercentile(hundred, 0.90), 90);
  EXPECT_EQ(NearestRankPercentile(hundred, 0.99), 99);
  EXPECT_EQ(NearestRankPercentile(hundred, 1.0), 100);
  // Few samples: p99 of ten is the largest, p50 of two the smaller.
  const std::vector<double> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(NearestRankPercentile(ten, 0.90), 9);
  EXPECT_EQ(NearestRankPercentile(ten, 0.99), 10);
  EXPECT_EQ(NearestRankPercentile({1, 2}, 0.50), 1);
  EXPECT_EQ(NearestRankPercentile({7}, 0.01), 7);
  EXPECT_EQ(NearestRankPercentile({}, 0.5), 0);
}

}  // namespace
}  // namespace transpose
