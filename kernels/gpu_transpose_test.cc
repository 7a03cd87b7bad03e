// Every GPU kernel against the CPU reference, on random data with poisoned
// outputs, for every element size and edge-heavy shapes. Skips (and says so)
// where no GPU is visible.
#include "kernels/gpu_transpose.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu_transpose.h"
#include "kernels/gpu_launch.h"

namespace transpose::kernels {
namespace {

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

struct Shape {
  uint64_t batch, rows, cols;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> bytes(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, 8);
  }
  for (; i < n; ++i) bytes[i] = static_cast<uint8_t>(rng());
  return bytes;
}

// Runs `kernel` (a public Algorithm, or an internal::Kernel) on the GPU and
// returns the first mismatch against the CPU transpose, or "".
template <typename Kernel>
std::string RunAndCompare(Kernel kernel, size_t element_size,
                          const Shape& shape,
                          const internal::Tuning& tuning = {}) {
  TransposeArgs args{element_size, shape.batch, shape.rows,
                     shape.cols,   nullptr,     nullptr};
  const size_t bytes = args.bytes();
  const std::vector<uint8_t> input =
      RandomBytes(bytes, static_cast<uint32_t>(bytes));
  std::vector<uint8_t> expected(bytes, 0);
  TransposeArgs host = args;
  host.input = input.data();
  host.output = expected.data();
  if (absl::Status s = TransposeOnCpu(host); !s.ok()) return s.ToString();

  void* device_in = nullptr;
  void* device_out = nullptr;
  if (cudaMalloc(&device_in, bytes) != cudaSuccess ||
      cudaMalloc(&device_out, bytes) != cudaSuccess) {
    cudaFree(device_in);
    return "cudaMalloc failed";
  }
  cudaMemcpy(device_in, input.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemset(device_out, 0xA5,
             bytes);  // Poison: every element must be written.
  args.input = device_in;
  args.output = device_out;
  std::string error;
  if constexpr (std::is_same_v<Kernel, Algorithm>) {
    if (absl::Status s = CanImplement(kernel, args); !s.ok()) {
      error = s.ToString();
    } else if (absl::Status s = LaunchTranspose(kernel, args, nullptr);
               !s.ok()) {
      error = s.ToString();
    }
  } else if (cudaError_t e = static_cast<cudaError_t>(
                 internal::Launch(kernel, args, nullptr, tuning));
             e != cudaSuccess) {
    error = cudaGetErrorString(e);
  }
  if (!error.empty()) {
  } else if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    error = cudaGetErrorString(e);
  }
  std::vector<uint8_t> actual(bytes, 0);
  cudaMemcpy(actual.data(), device_out, bytes, cudaMemcpyDeviceToHost);
  cudaFree(device_in);
  cudaFree(device_out);
  if (!error.empty()) return error;
  if (actual != expected) {
    for (size_t i = 0; i < bytes; ++i) {
      if (actual[i] != expected[i]) {
        return absl::StrCat("first wrong byte at ", i, " (element ",
                            i / element_size, "): got ", actual[i], ", want ",
                            expected[i]);
      }
    }
  }
  return "";
}

using Case = std::tuple<Algorithm, size_t, Shape>;

class GpuTransposeTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  }
};

TEST_P(GpuTransposeTest, MatchesCpuReference) {
  const auto& [algorithm, element_size, shape] = GetParam();
  EXPECT_EQ(RunAndCompare(algorithm, element_size, shape), "");
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const auto& [algorithm, element_size, shape] = info.param;
  return absl::StrCat(AlgorithmName(algorithm), "_", element_size, "B_",
                      shape.batch, "x", shape.rows, "x", shape.cols);
}

INSTANTIATE_TEST_SUITE_P(
    AllKernels, GpuTransposeTest,
    ::testing::Combine(::testing::ValuesIn(AllAlgorithms()),
                       ::testing::Values(1, 2, 4, 8, 16),
                       ::testing::Values(Shape{1, 1, 1}, Shape{1, 1, 1000},
                                         Shape{1, 1000, 1}, Shape{1, 31, 33},
                                         Shape{1, 64, 64}, Shape{1, 4097, 4099},
                                         Shape{3, 65, 129}, Shape{70000, 2, 3},
                                         Shape{1, 1000, 1000},
                                         Shape{3, 72, 136})),
    CaseName);

// The production kernels AUTO chooses from, run directly on shapes they accept,
// with partial edge tiles, so each is tested whatever AUTO picks today.
using InternalCase = std::tuple<internal::Kernel, size_t, Shape>;

class GpuInternalKernelTest : public ::testing::TestWithParam<InternalCase> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  }
};

// Whether `kernel` takes `shape` (with aligned buffers: only the shape
// decides).
bool KernelTakes(internal::Kernel kernel, size_t element_size,
                 const Shape& shape) {
  const TransposeArgs probe{element_size,
                            shape.batch,
                            shape.rows,
                            shape.cols,
                            reinterpret_cast<void*>(256),
                            reinterpret_cast<void*>(uintptr_t{1} << 40)};
  return !(
      (kernel == internal::Kernel::kVector && !internal::CanVectorize(probe)) ||
      (kernel == internal::Kernel::kWord && !internal::CanUseWords(probe)) ||
      (kernel == internal::Kernel::kSkewed && !internal::CanSkew(probe)));
}

TEST_P(GpuInternalKernelTest, MatchesCpuReference) {
  const auto& [kernel, element_size, shape] = GetParam();
  if (!KernelTakes(kernel, element_size, shape)) {
    GTEST_SKIP() << "this kernel does not take this shape";
  }
  EXPECT_EQ(RunAndCompare(kernel, element_size, shape), "");
}

std::string InternalCaseName(
    const ::testing::TestParamInfo<InternalCase>& info) {
  const auto& [kernel, element_size, shape] = info.param;
  return absl::StrCat(internal::KernelNameOf(kernel), "_", element_size, "B_",
                      shape.batch, "x", shape.rows, "x", shape.cols);
}

INSTANTIATE_TEST_SUITE_P(
    ProductionKernels, GpuInternalKernelTest,
    ::testing::Combine(::testing::Values(internal::Kernel::kVector,
                                         internal::Kernel::kWord,
                                         internal::Kernel::kSkewed,
                                         internal::Kernel::kPadded64x8),
                       ::testing::Values(1, 2, 4, 8, 16),
                       ::testing::Values(Shape{1, 64, 64}, Shape{1, 1000, 1000},
                                         Shape{3, 72, 136}, Shape{1, 16, 4096},
                                         Shape{1, 4096, 16}, Shape{2, 200, 8},
                                         Shape{70000, 8, 8}, Shape{1, 1, 1},
                                         Shape{1, 1, 1000}, Shape{1, 1000, 1},
                                         Shape{1, 31, 33}, Shape{3, 65, 129},
                                         Shape{1, 4097, 4099},
                                         Shape{2, 129, 4095})),
    InternalCaseName);

// The tunable kernels under each tuning other than the default, on shapes
// whose tile rows fill several groups and leave a partial one (4097 rows: 65
// tile rows of 64, 33 of 128), with partial edge tiles and batches.
using TunedCase = std::tuple<internal::Kernel, internal::Tuning, size_t, Shape>;

class GpuTunedKernelTest : public ::testing::TestWithParam<TunedCase> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  }
};

TEST_P(GpuTunedKernelTest, MatchesCpuReference) {
  const auto& [kernel, tuning, element_size, shape] = GetParam();
  if (!KernelTakes(kernel, element_size, shape)) {
    GTEST_SKIP() << "this kernel does not take this shape";
  }
  EXPECT_EQ(RunAndCompare(kernel, element_size, shape, tuning), "");
}

std::string TunedCaseName(const ::testing::TestParamInfo<TunedCase>& info) {
  const auto& [kernel, tuning, element_size, shape] = info.param;
  return absl::StrCat(internal::KernelNameOf(kernel),
                      tuning.grouped_tile_rows ? "_grouped" : "",
                      tuning.input_evict_last ? "_evictlast" : "", "_",
                      element_size, "B_", shape.batch, "x", shape.rows, "x",
                      shape.cols);
}

INSTANTIATE_TEST_SUITE_P(
    TunedKernels, GpuTunedKernelTest,
    ::testing::Combine(
        ::testing::Values(internal::Kernel::kVector, internal::Kernel::kWord,
                          internal::Kernel::kPadded64x8),
        ::testing::Values(internal::Tuning{false, true},
                          internal::Tuning{true, false},
                          internal::Tuning{true, true}),
        ::testing::Values(1, 2, 4, 8, 16),
        ::testing::Values(Shape{1, 4097, 4099}, Shape{1, 4096, 2048},
                          Shape{3, 2056, 136}, Shape{2, 129, 4095},
                          Shape{1, 31, 33}, Shape{70000, 8, 8})),
    TunedCaseName);

// AUTO's tuning is a function of the shape alone (no device needed); the
// figures behind it are in docs/BENCHMARKS.md.
TEST(AutoTuningTest, EvictLastFrom128MiBAndGroupsFor128KiBRows) {
  const auto tuning = [](size_t element_size, uint64_t batch, uint64_t rows,
                         uint64_t cols) {
    const TransposeArgs args{element_size,
                             batch,
                             rows,
                             cols,
                             reinterpret_cast<void*>(256),
                             reinterpret_cast<void*>(uintptr_t{1} << 40)};
    return internal::AutoTuning(internal::AutoKernel(args), args);
  };
  // Under 128 MiB: the default.
  EXPECT_EQ(tuning(4, 1, 4096, 4096), (internal::Tuning{false, false}));
  EXPECT_EQ(tuning(2, 4096, 64, 64), (internal::Tuning{false, false}));
  // From 128 MiB, for 2- to 16-byte elements, batches included.
  EXPECT_EQ(tuning(2, 1, 8192, 8192), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(8, 1, 4096, 4096), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(4, 1, 16384, 16384), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(16, 1, 16384, 16384), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(2, 16, 2048, 2048), (internal::Tuning{false, true}));
  // Never for the 1-byte word kernel, nor for the skewed or padded_32
  // kernels, which take no tuning.
  EXPECT_EQ(tuning(1, 1, 16384, 16384), (internal::Tuning{false, false}));
  EXPECT_EQ(tuning(4, 1, 12345, 6789), (internal::Tuning{false, false}));
  EXPECT_EQ(tuning(4, 64, 511, 513), (internal::Tuning{false, false}));
  // Groups for 8- and 16-byte elements where input and output rows are both
  // 128 KiB.
  EXPECT_EQ(tuning(8, 1, 16384, 16384), (internal::Tuning{true, true}));
  EXPECT_EQ(tuning(16, 1, 8192, 8192), (internal::Tuning{true, true}));
  EXPECT_EQ(tuning(8, 1, 16384, 8192), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(4, 1, 32768, 32768), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(2, 1, 65536, 65536), (internal::Tuning{false, true}));
}

// Refused before anything reaches the device.
TEST(TuningTest, TheClassicKernelsRefuseTunings) {
  const TransposeArgs args{4, 1, 64, 64, nullptr, nullptr};
  for (internal::Kernel kernel :
       {internal::Kernel::kNaive, internal::Kernel::kShared,
        internal::Kernel::kPadded32, internal::Kernel::kPadded64,
        internal::Kernel::kSkewed}) {
    EXPECT_FALSE(internal::SupportsTuning(kernel));
    EXPECT_EQ(
        internal::Launch(kernel, args, nullptr, internal::Tuning{true, false}),
        cudaErrorInvalidValue)
        << internal::KernelNameOf(kernel);
  }
}

// Whether the device and the host can hold a `bytes`-byte case: input and
// output on the device; input, expected and actual on the host.
bool EnoughMemoryFor(uint64_t bytes, std::string* why) {
  size_t device_free = 0, device_total = 0;
  if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess) {
    *why = "cudaMemGetInfo failed";
    return false;
  }
  const uint64_t host_free =
      uint64_t(sysconf(_SC_AVPHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  if (device_free < 2 * bytes + (256 << 20) ||
      host_free < 3 * bytes + (1ull << 30)) {
    *why = absl::StrCat("needs ", 2 * bytes >> 20, " MiB free on the device (",
                        device_free >> 20, " there) and ", 3 * bytes >> 20,
                        " MiB on the host (", host_free >> 20, " there)");
    return false;
  }
  return true;
}

// 2^31 + 2^20 one-byte elements: offsets past 32 bits.
TEST(GpuTransposeLargeTest, PastTwoToThe31Elements) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  const Shape shape{1, (1u << 16) + 32, 1u << 15};
  if (std::string why; !EnoughMemoryFor(shape.rows * shape.cols, &why)) {
    GTEST_SKIP() << why;
  }
  for (Algorithm algorithm : {Algorithm::kAuto, Algorithm::kPadded32}) {
    EXPECT_EQ(RunAndCompare(algorithm, 1, shape), "")
        << AlgorithmName(algorithm);
  }
}

// The skewed kernel's shifted windows past 2^31 elements: 4-byte elements,
// odd rows.
TEST(GpuTransposeLargeTest, SkewedPastTwoToThe31Elements) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  const Shape shape{1, (1u << 15) + 33, 1u << 16};
  if (std::string why; !EnoughMemoryFor(4 * shape.rows * shape.cols, &why)) {
    GTEST_SKIP() << why;
  }
  EXPECT_EQ(RunAndCompare(internal::Kernel::kSkewed, 4, shape), "");
}

}  // namespace
}  // namespace transpose::kernels
