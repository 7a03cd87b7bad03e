// Every GPU kernel against the CPU reference, on random data with poisoned
// outputs, for every element size and edge-heavy shapes. Skips (and says so)
// where no GPU is visible.
#include "kernels/gpu_transpose.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu_transpose.h"
#include "kernels/gpu_launch.h"

namespace transpose::kernels {
namespace internal {
// For gtest's messages.
void PrintTo(const Tuning& tuning, std::ostream* out) {
  *out << TuningNameOf(tuning);
}
}  // namespace internal
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

// Where the input and output start, in elements past the start of their
// allocations (which cudaMalloc aligns to 256 bytes).
struct Placement {
  uint64_t input_offset = 0, output_offset = 0;
};

// Bytes allocated past a buffer's end, poisoned, which must stay so.
constexpr size_t kGuardBytes = 64;

// Runs `kernel` (a public Algorithm, or an internal::Kernel) on the GPU and
// returns the first mismatch against the CPU transpose, or "".
template <typename Kernel>
std::string RunAndCompare(Kernel kernel, size_t element_size,
                          const Shape& shape,
                          const internal::Tuning& tuning = {},
                          const Placement& placement = {}) {
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

  const size_t input_lead = placement.input_offset * element_size,
               output_lead = placement.output_offset * element_size;
  const size_t output_allocation = output_lead + bytes + kGuardBytes;
  void* device_in = nullptr;
  void* device_out = nullptr;
  if (cudaMalloc(&device_in, input_lead + bytes) != cudaSuccess ||
      cudaMalloc(&device_out, output_allocation) != cudaSuccess) {
    cudaFree(device_in);
    return "cudaMalloc failed";
  }
  cudaMemcpy(static_cast<uint8_t*>(device_in) + input_lead, input.data(), bytes,
             cudaMemcpyHostToDevice);
  // Poison: every element must be written, and nothing around them.
  cudaMemset(device_out, 0xA5, output_allocation);
  args.input = static_cast<uint8_t*>(device_in) + input_lead;
  args.output = static_cast<uint8_t*>(device_out) + output_lead;
  std::string error;
  if constexpr (std::is_same_v<Kernel, Algorithm>) {
    if (!(tuning == internal::Tuning{})) {
      error = "a tuning applies to internal kernels only";
    } else if (absl::Status s = CanImplement(kernel, args); !s.ok()) {
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
  std::vector<uint8_t> around(output_allocation, 0);
  cudaMemcpy(around.data(), device_out, output_allocation,
             cudaMemcpyDeviceToHost);
  cudaFree(device_in);
  cudaFree(device_out);
  if (!error.empty()) return error;
  for (size_t i = 0; i < output_allocation; ++i) {
    if (i == output_lead) i += bytes;
    if (i < output_allocation && around[i] != 0xA5) {
      return absl::StrCat("wrote outside the output: byte ",
                          static_cast<int64_t>(i - output_lead),
                          " from its start");
    }
  }
  const uint8_t* actual = around.data() + output_lead;
  if (!std::equal(expected.begin(), expected.end(), actual)) {
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
      (kernel == internal::Kernel::kSkewed && !internal::CanSkew(probe)) ||
      (kernel == internal::Kernel::kSmallMatrices &&
       !internal::TakesSmallMatrices(probe)) ||
      (kernel == internal::Kernel::kThin && !internal::TakesThin(probe)));
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
    ::testing::Combine(
        ::testing::Values(internal::Kernel::kVector, internal::Kernel::kWord,
                          internal::Kernel::kSkewed,
                          internal::Kernel::kPadded64x8,
                          internal::Kernel::kSmallMatrices,
                          internal::Kernel::kThin),
        ::testing::Values(1, 2, 4, 8, 16),
        ::testing::Values(Shape{1, 64, 64}, Shape{1, 1000, 1000},
                          Shape{3, 72, 136}, Shape{1, 16, 4096},
                          Shape{1, 4096, 16}, Shape{2, 200, 8},
                          Shape{70000, 8, 8}, Shape{1, 1, 1}, Shape{1, 1, 1000},
                          Shape{1, 1000, 1}, Shape{1, 31, 33},
                          Shape{3, 65, 129}, Shape{1, 4097, 4099},
                          Shape{2, 129, 4095}, Shape{2, 4112, 272},
                          Shape{5, 72, 48},
                          // Groups of small matrices, the last one partial.
                          Shape{1000, 15, 17}, Shape{37, 63, 65},
                          Shape{4099, 3, 5}, Shape{9, 64, 1},
                          // One matrix per block past 16 KiB.
                          Shape{3, 181, 180})),
    InternalCaseName);

// The batch kernel copies one side of the transpose in 16-byte units, which
// its buffers need not be aligned to: every element offset within a unit, on
// shapes that scatter the input (odd rows) and gather the output (even rows),
// with groups whose units straddle their neighbours' and buffers whose first
// and last units lie partly outside them, units that change row or matrix
// once (the branch-free path) or many times (37 x 1), and groups
// of over 1024 units (more than one round of loads: 20 x 32 x 32 and
// 20 x 1 x 1024 for 1-byte elements), and matrices past 16 KiB, one per block
// (181 x 180 and 180 x 180, 1-byte only).
using PlacedCase = std::tuple<size_t, Shape>;

class GpuSmallMatricesPlacementTest
    : public ::testing::TestWithParam<PlacedCase> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  }
};

// Runs `kernel` with its input at every element offset within a `unit_bytes`
// unit and its output at two others for each.
void ExpectMatchesAtEveryOffset(internal::Kernel kernel, size_t element_size,
                                const Shape& shape, size_t unit_bytes) {
  const uint64_t per_unit = std::max<uint64_t>(1, unit_bytes / element_size);
  for (uint64_t in = 0; in < per_unit; ++in) {
    for (uint64_t out :
         std::set<uint64_t>{(in + 1) % per_unit, (per_unit - in) % per_unit}) {
      EXPECT_EQ(
          RunAndCompare(kernel, element_size, shape, {}, Placement{in, out}),
          "")
          << "input at element " << in << ", output at element " << out;
    }
  }
}

TEST_P(GpuSmallMatricesPlacementTest, MatchesCpuReferenceAtAnyOffset) {
  const auto& [element_size, shape] = GetParam();
  if (!KernelTakes(internal::Kernel::kSmallMatrices, element_size, shape)) {
    GTEST_SKIP() << "a matrix past the kernel's 48 KiB";
  }
  ExpectMatchesAtEveryOffset(internal::Kernel::kSmallMatrices, element_size,
                             shape, 16);
}

std::string PlacedCaseName(const ::testing::TestParamInfo<PlacedCase>& info) {
  const auto& [element_size, shape] = info.param;
  return absl::StrCat(element_size, "B_", shape.batch, "x", shape.rows, "x",
                      shape.cols);
}

INSTANTIATE_TEST_SUITE_P(
    SmallMatrices, GpuSmallMatricesPlacementTest,
    ::testing::Combine(::testing::Values(1, 2, 4, 8, 16),
                       ::testing::Values(Shape{5, 31, 33}, Shape{7, 30, 32},
                                         Shape{9, 32, 31}, Shape{3, 1, 37},
                                         Shape{4, 37, 1}, Shape{1, 1, 1},
                                         Shape{1000, 15, 17}, Shape{37, 21, 47},
                                         Shape{6, 24, 41}, Shape{20, 32, 32},
                                         Shape{20, 1, 1024}, Shape{2, 181, 180},
                                         Shape{2, 180, 180})),
    PlacedCaseName);

// The skewed kernel moves 1- and 2-byte elements in 4-byte words, which its
// buffers need not be aligned to: every element offset within a word, on
// shapes with interior tiles and edge tiles on every side (4097 x 4099, 1031
// x 517 in a batch), rows shorter than a tile (1000 x 3), a single row or
// column, and words past the buffer's ends at both; 3 x 256 x 127 and 2 x 256
// x 131 end a matrix with an interior tile's last row. Reads past the buffers
// show only under compute-sanitizer memcheck (run on the GPU machine).
class GpuSkewedPlacementTest : public ::testing::TestWithParam<PlacedCase> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  }
};

TEST_P(GpuSkewedPlacementTest, MatchesCpuReferenceAtAnyOffset) {
  const auto& [element_size, shape] = GetParam();
  ExpectMatchesAtEveryOffset(internal::Kernel::kSkewed, element_size, shape, 4);
}

INSTANTIATE_TEST_SUITE_P(
    Skewed, GpuSkewedPlacementTest,
    ::testing::Combine(::testing::Values(1, 2),
                       ::testing::Values(Shape{1, 4097, 4099},
                                         Shape{3, 1031, 517}, Shape{2, 1000, 3},
                                         Shape{1, 1, 1000}, Shape{1, 1000, 1},
                                         Shape{1, 1, 1}, Shape{2, 300, 129},
                                         Shape{3, 256, 127},
                                         Shape{2, 256, 131})),
    PlacedCaseName);

// The thin kernel copies its k short rows in 16-byte units and its contiguous
// side too, neither of which need be aligned: every element offset within a
// unit, on tall (N x k) and short (k x N) matrices, k from 1 to kThinMaxK,
// spans that end inside a unit, several spans per matrix (100003 x 3, 40000 x
// 2) and batches, past 65535 matrices too (more than one grid: 70001 matrices
// of k = 2 to 5 and 8 both ways, on ThinGroupsTranspose and on ThinTranspose).
// 1-byte matrices with k = 2 to 8 take ThinGroupsTranspose, as do 2-byte k x N
// ones with k = 2 to 4 and 8, and N x 4; the others (k = 12 and 16 among
// them) take ThinTranspose. Its k x N path shifts each output unit by up to k
// - 1 elements: by a word or more from 1-byte k = 5 and 2-byte k = 3, by up to
// three words for 2-byte 8 x N. It has a variant for outputs that each start on
// a unit: one matrix with its output on a unit, or batches of matrices of a
// multiple of 16 bytes (3 x 4 x 4000, 3 x 3 x 4000, 5 x 2 x 24, 70001 x 2 x 8,
// 70001 x 4 x 8) so placed, each run with every input offset; any other output
// offset, and batches of other sizes (3 x 2 x 9001, 3 x 3 x 5001, 3 x 4 x 2001,
// 70001 x 3 x 5, 70001 x 4 x 5), take the other.
class GpuThinPlacementTest : public ::testing::TestWithParam<PlacedCase> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  }
};

TEST_P(GpuThinPlacementTest, MatchesCpuReferenceAtAnyOffset) {
  const auto& [element_size, shape] = GetParam();
  ExpectMatchesAtEveryOffset(internal::Kernel::kThin, element_size, shape, 16);
  // Outputs on a unit: every input offset with them, as short matrices of
  // k = 2 to 8 then take ThinGroupsTranspose's variant for them (batches of
  // matrices of a multiple of 16 bytes; other batches take the general path).
  for (uint64_t in = 0; in < std::max<size_t>(1, 16 / element_size); ++in) {
    EXPECT_EQ(RunAndCompare(internal::Kernel::kThin, element_size, shape, {},
                            Placement{in, 0}),
              "")
        << "input at element " << in << ", output on a unit";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Thin, GpuThinPlacementTest,
    ::testing::Combine(
        ::testing::Values(1, 2, 4, 8, 16),
        ::testing::Values(
            Shape{1, 100003, 3}, Shape{1, 3, 100003}, Shape{3, 5001, 17},
            Shape{2, 17, 5001}, Shape{1, 777, 64}, Shape{1, 64, 777},
            Shape{5, 1, 999}, Shape{5, 999, 1}, Shape{1, 40000, 2},
            Shape{1, 2, 2}, Shape{7, 33, 35}, Shape{70001, 7, 2},
            Shape{70001, 2, 7}, Shape{1, 20001, 4}, Shape{1, 4, 20001},
            Shape{3, 9001, 2}, Shape{3, 2, 9001}, Shape{2, 17, 4},
            Shape{2, 3, 17}, Shape{3, 4, 4000}, Shape{5, 2, 24},
            Shape{1, 2, 40001}, Shape{3, 3, 4000}, Shape{3, 5001, 3},
            Shape{2, 5, 3}, Shape{1, 3, 7}, Shape{70001, 2, 8},
            Shape{3, 3, 5001}, Shape{3, 4, 2001}, Shape{70001, 3, 5},
            Shape{70001, 4, 5}, Shape{70001, 4, 8}, Shape{70001, 5, 4},
            Shape{70001, 5, 3}, Shape{70001, 6, 5}, Shape{70001, 5, 6},
            Shape{3, 1001, 6}, Shape{3, 6, 1001}, Shape{2, 2001, 7},
            Shape{2, 7, 2001}, Shape{1, 4001, 8}, Shape{1, 8, 4001},
            Shape{3, 8, 1000}, Shape{3, 5, 1600}, Shape{2, 999, 12},
            Shape{2, 12, 999}, Shape{3, 12, 1000}, Shape{1, 3001, 16},
            Shape{1, 16, 3001}, Shape{3, 16, 1000}, Shape{70001, 8, 5},
            Shape{70001, 5, 8}, Shape{70001, 9, 8}, Shape{70001, 8, 9})),
    PlacedCaseName);

// The tunable kernels under each tuning other than the default. 2 x 4104 x 136
// fills full groups of 32 tile rows and leaves a partial one for every
// kernel's tile height (33 word tiles of 128 rows, 65 of 64, 129 of 32), in a
// batch; the other shapes add partial edge tiles (4097 x 4099 for the kernels
// that take odd shapes), one partial group (3 x 2056 x 136), many small
// matrices, and for the vector kernel's 1-byte 128 x 256 tiles a partial group
// and partial edge tiles (2 x 4112 x 272), and for its 2-byte 64 x 64 tiles
// partial ones in a batch (5 x 72 x 48) and whole ones (3 x 128 x 64).
using TunedCase = std::tuple<internal::Kernel, internal::Tuning, size_t, Shape>;

// More than 65535 tile columns: the host launches two grids, and each maps its
// blocks to tiles on its own.
TEST(GpuTunedKernelTest, AcrossGridsOfTileColumns) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  for (const internal::Tuning& tuning : internal::kAllTunings) {
    EXPECT_EQ(RunAndCompare(internal::Kernel::kPadded64x8, 1,
                            Shape{1, 72, 65537 * 64 + 3}, tuning),
              "")
        << internal::TuningNameOf(tuning);
  }
}

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
        ::testing::Values(Shape{2, 4104, 136}, Shape{1, 4097, 4099},
                          Shape{1, 4096, 2048}, Shape{3, 2056, 136},
                          Shape{2, 129, 4095}, Shape{1, 31, 33},
                          Shape{70000, 8, 8}, Shape{2, 4112, 272},
                          Shape{5, 72, 48}, Shape{3, 128, 64})),
    TunedCaseName);

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

// The skewed kernel's shifted windows past 2^31 elements: 1-byte elements
// (words) with rows and columns both odd; 4-byte elements, odd rows. Each
// runs where the machine holds it.
TEST(GpuTransposeLargeTest, SkewedPastTwoToThe31Elements) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  std::string skipped;
  for (const auto& [element_size, shape] :
       {std::pair<size_t, Shape>{1, Shape{1, (1u << 15) + 33, (1u << 16) + 3}},
        std::pair<size_t, Shape>{4, Shape{1, (1u << 15) + 33, 1u << 16}}}) {
    if (std::string why;
        !EnoughMemoryFor(element_size * shape.rows * shape.cols, &why)) {
      absl::StrAppend(&skipped, element_size, "-byte: ", why, "; ");
      continue;
    }
    EXPECT_EQ(RunAndCompare(internal::Kernel::kSkewed, element_size, shape), "")
        << element_size << "-byte";
  }
  if (!skipped.empty()) GTEST_SKIP() << skipped;
}

// The thin kernel's runs and spans past 2^31 elements: 1-byte N x 3 and 3 x N
// with N odd (2^31 + 1 elements), N x 9 and 9 x N (2^31 + 7).
TEST(GpuTransposeLargeTest, ThinPastTwoToThe31Elements) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  // k = 3 takes the register-transposing path (ThinGroupsTranspose), k = 9
  // the element-by-element one.
  constexpr uint64_t kN = ((uint64_t{1} << 31) + 2) / 3;
  constexpr uint64_t kN9 = ((uint64_t{1} << 31) + 8) / 9;
  static_assert(3 * kN > (uint64_t{1} << 31) && kN % 2 == 1);
  static_assert(9 * kN9 > (uint64_t{1} << 31) && 9 * kN9 >= 3 * kN);
  if (std::string why; !EnoughMemoryFor(9 * kN9, &why)) GTEST_SKIP() << why;
  for (const Shape& shape :
       {Shape{1, kN, 3}, Shape{1, 3, kN}, Shape{1, kN9, 9}, Shape{1, 9, kN9}}) {
    EXPECT_EQ(RunAndCompare(internal::Kernel::kThin, 1, shape), "")
        << shape.rows << " x " << shape.cols;
  }
  // An output off units takes the k x N path's general variant (the loop's
  // outputs start on units).
  EXPECT_EQ(RunAndCompare(internal::Kernel::kThin, 1, Shape{1, 3, kN}, {},
                          Placement{0, 1}),
            "")
      << "3 x N, output at element 1";
}

// 2-byte thin matrices past 2^31 elements, on ThinGroupsTranspose's k x N
// path (outputs on units and off them; 8 x N off them shifts its units by
// more than a word) and its N x 4 path: 2^31 + 4 and 2^31 + 8 elements.
TEST(GpuTransposeLargeTest, TwoByteThinPastTwoToThe31Elements) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  constexpr uint64_t kN = (uint64_t{1} << 29) + 1;
  constexpr uint64_t kN8 = (uint64_t{1} << 28) + 1;
  static_assert(4 * kN > (uint64_t{1} << 31) && 8 * kN8 > (uint64_t{1} << 31));
  static_assert(8 * kN8 >= 4 * kN);
  if (std::string why; !EnoughMemoryFor(2 * 8 * kN8, &why)) GTEST_SKIP() << why;
  for (const auto& [shape, output_offset] :
       {std::pair{Shape{1, 4, kN}, 0}, std::pair{Shape{1, 4, kN}, 3},
        std::pair{Shape{1, kN, 4}, 0}, std::pair{Shape{1, 8, kN8}, 3}}) {
    EXPECT_EQ(RunAndCompare(internal::Kernel::kThin, 2, shape, {},
                            Placement{0, uint64_t(output_offset)}),
              "")
        << shape.rows << " x " << shape.cols << ", output at element "
        << output_offset;
  }
}

}  // namespace
}  // namespace transpose::kernels
