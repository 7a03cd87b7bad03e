#include "server/core/cgroup.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace transpose {
namespace {

using internal::BytesFromMemoryMax;
using internal::CoresFromCpuMax;
using internal::ReadCgroupLimits;

TEST(CgroupTest, CoresFromCpuMaxRoundsQuotasUp) {
  EXPECT_EQ(CoresFromCpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(CoresFromCpuMax("400000 100000\n"), 4);
  EXPECT_EQ(CoresFromCpuMax("150000 100000"), 2);
  EXPECT_EQ(CoresFromCpuMax("50000 100000"), 1);
  EXPECT_EQ(CoresFromCpuMax("0 100000"), std::nullopt);
  EXPECT_EQ(CoresFromCpuMax("-1 100000"), std::nullopt);  // v1: none.
  EXPECT_EQ(CoresFromCpuMax(""), std::nullopt);
  EXPECT_EQ(CoresFromCpuMax("100000"), std::nullopt);
  EXPECT_EQ(CoresFromCpuMax("lots 100000"), std::nullopt);
}

TEST(CgroupTest, BytesFromMemoryMaxReadsNumbersOnly) {
  EXPECT_EQ(BytesFromMemoryMax("max\n"), std::nullopt);
  EXPECT_EQ(BytesFromMemoryMax("8589934592\n"), uint64_t{8} << 30);
  EXPECT_EQ(BytesFromMemoryMax("9223372036854771712\n"),
            uint64_t{9223372036854771712u});  // v1's "none".
  EXPECT_EQ(BytesFromMemoryMax(""), std::nullopt);
  EXPECT_EQ(BytesFromMemoryMax("-1"), std::nullopt);
}

// A fake /sys/fs/cgroup in a temporary directory.
class CgroupTreeTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(testing::TempDir()) /
            testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = root_ / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  std::string root() const { return root_.string(); }

 private:
  std::filesystem::path root_;
};

// cgroup v2: the tightest of the process's cgroup and its ancestors'.
TEST_F(CgroupTreeTest, V2TakesTheTightestAncestor) {
  Write("cpu.max", "max 100000\n");
  Write("kubepods/cpu.max", "800000 100000\n");
  Write("kubepods/memory.max", "max\n");
  Write("kubepods/pod1/cpu.max", "max 100000\n");
  Write("kubepods/pod1/memory.max", "4294967296\n");
  Write("kubepods/pod1/c1/memory.max", "8589934592\n");
  const CgroupLimits limits =
      ReadCgroupLimits("0::/kubepods/pod1/c1\n", root());
  EXPECT_EQ(limits.cpu_cores, 8);
  EXPECT_EQ(limits.memory_bytes, uint64_t{4} << 30);
}

// A container with its own cgroup namespace sees its cgroup as "/", and the
// mount shows that cgroup.
TEST_F(CgroupTreeTest, V2InsideAContainerReadsTheMountsRoot) {
  Write("cpu.max", "150000 100000\n");
  Write("memory.max", "1073741824\n");
  const CgroupLimits limits = ReadCgroupLimits("0::/\n", root());
  EXPECT_EQ(limits.cpu_cores, 2);
  EXPECT_EQ(limits.memory_bytes, uint64_t{1} << 30);
}

// cgroup v1 (and v2 beside it, without controllers): the cpu and memory
// controllers' own hierarchies. A path that the mount does not show (the
// host's, inside a container whose mount is its own cgroup) is skipped.
TEST_F(CgroupTreeTest, V1ReadsTheCpuAndMemoryControllers) {
  Write("memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write("memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
  Write("cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  Write("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  Write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000\n");
  Write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  const CgroupLimits limits = ReadCgroupLimits(
      "12:memory:/docker/abc\n"
      "4:cpu,cpuacct:/docker/abc\n"
      "1:name=systemd:/docker/abc\n"
      "0::/docker/abc\n",
      root());
  EXPECT_EQ(limits.cpu_cores, 3);
  EXPECT_EQ(limits.memory_bytes, uint64_t{2} << 30);

  const CgroupLimits in_container = ReadCgroupLimits(
      "12:memory:/kubepods/pod9/c9\n4:cpu,cpuacct:/kubepods/pod9/c9\n", root());
  EXPECT_EQ(in_container.cpu_cores, std::nullopt);
  EXPECT_EQ(in_container.memory_bytes, uint64_t{9223372036854771712u});
}

TEST_F(CgroupTreeTest, NoFilesNoLimits) {
  const CgroupLimits limits =
      ReadCgroupLimits("0::/user.slice\n4:memory:/x\nnot a line\n", root());
  EXPECT_EQ(limits.cpu_cores, std::nullopt);
  EXPECT_EQ(limits.memory_bytes, std::nullopt);
}

// Whatever this machine has, the live read agrees with reading its files.
TEST(CgroupTest, CurrentLimitsAreThisProcesssFiles) {
  std::ifstream file("/proc/self/cgroup");
  std::string self((std::istreambuf_iterator<char>(file)),
                   std::istreambuf_iterator<char>());
  const CgroupLimits expected = ReadCgroupLimits(self, "/sys/fs/cgroup");
  const CgroupLimits current = CurrentCgroupLimits();
  EXPECT_EQ(current.cpu_cores, expected.cpu_cores);
  EXPECT_EQ(current.memory_bytes, expected.memory_bytes);
}

}  // namespace
}  // namespace transpose
