#include <gtest/gtest.h>
TEST(P, X) {}
