// AUTO's choice of tuning and the launcher's refusals, which need no device:
// unlike gpu_transpose_test, this runs wherever the CUDA toolkit built it.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <ostream>
#include <string>

#include "gtest/gtest.h"
#include "kernels/gpu_launch.h"
#include "kernels/gpu_transpose.h"
#include "kernels/transpose_args.h"

namespace transpose::kernels {
namespace internal {
// For gtest's messages.
void PrintTo(const Tuning& tuning, std::ostream* out) {
  *out << TuningNameOf(tuning);
}
}  // namespace internal
namespace {

// Arguments of a shape, with aligned buffers: AUTO's choices read nothing
// else.
TransposeArgs ArgsOf(size_t element_size, uint64_t batch, uint64_t rows,
                     uint64_t cols) {
  return {element_size,
          batch,
          rows,
          cols,
          reinterpret_cast<void*>(256),
          reinterpret_cast<void*>(uintptr_t{1} << 40)};
}

// AUTO's kernel for a shape.
internal::Kernel AutoKernelOf(size_t element_size, uint64_t batch,
                              uint64_t rows, uint64_t cols) {
  return internal::AutoKernel(ArgsOf(element_size, batch, rows, cols));
}

// AUTO's tuning is a function of the shape alone (no device needed); the
// figures behind it are in docs/BENCHMARKS.md.
TEST(AutoTuningTest, EvictLastFrom64MiBAndGroupsFor16ByteElementsIn128KiBRows) {
  const auto tuning = [](size_t element_size, uint64_t batch, uint64_t rows,
                         uint64_t cols) {
    const TransposeArgs args = ArgsOf(element_size, batch, rows, cols);
    return internal::AutoTuning(internal::AutoKernel(args), args);
  };
  // Under 64 MiB: the default.
  EXPECT_EQ(tuning(4, 1, 2048, 4096), (internal::Tuning{false, false}));
  EXPECT_EQ(tuning(2, 4096, 64, 64), (internal::Tuning{false, false}));
  EXPECT_EQ(tuning(1, 1, 4096, 4096), (internal::Tuning{false, false}));
  // From 64 MiB, for every element size the vector kernel or padded_64x8
  // takes, batches included.
  EXPECT_EQ(tuning(4, 1, 4096, 4096), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(4, 4096, 64, 64), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(1, 1, 8192, 8192), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(1, 1, 16384, 16384), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(2, 1, 8192, 8192), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(8, 1, 4096, 4096), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(4, 1, 16384, 16384), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(16, 1, 16384, 16384), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(2, 16, 2048, 2048), (internal::Tuning{false, true}));
  // Never for the 1-byte word kernel (rows and columns multiples of 4, not
  // 16), nor for the skewed or padded_32 kernels, which take no tuning.
  EXPECT_EQ(tuning(1, 1, 16384, 16388), (internal::Tuning{false, false}));
  EXPECT_EQ(tuning(4, 1, 12345, 6789), (internal::Tuning{false, false}));
  EXPECT_EQ(tuning(2, 1, 12345, 6789), (internal::Tuning{false, false}));
  EXPECT_EQ(tuning(4, 256, 511, 513), (internal::Tuning{false, false}));
  // Either side of 64 MiB: a 2-byte matrix the tunable padded_64x8 takes
  // (under 1024 rows, so not the skewed kernel).
  EXPECT_EQ(tuning(2, 1, 1000, 33553), (internal::Tuning{false, false}));
  EXPECT_EQ(tuning(2, 1, 1000, 33555), (internal::Tuning{false, true}));
  // Groups for 16-byte elements where input and output rows are both 128 KiB;
  // not for smaller elements with 128 KiB rows.
  EXPECT_EQ(tuning(16, 1, 8192, 8192), (internal::Tuning{true, true}));
  EXPECT_EQ(tuning(8, 1, 16384, 16384), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(16, 1, 8192, 4096), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(8, 1, 16384, 8192), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(4, 1, 32768, 32768), (internal::Tuning{false, true}));
  EXPECT_EQ(tuning(2, 1, 65536, 65536), (internal::Tuning{false, true}));
}

// AUTO's kernel is a function of the shape too: the vector kernel where its
// 16-byte accesses are possible and its tiles mostly full.
TEST(AutoKernelTest, VectorWhereItsTilesAreMostlyFull) {
  EXPECT_EQ(AutoKernelOf(1, 1, 8192, 8192), internal::Kernel::kVector);
  EXPECT_EQ(AutoKernelOf(1, 1, 4096, 4096), internal::Kernel::kVector);
  // Multiples of 4, not 16; then not even of 4 (the skewed kernel:
  // SkewedWhereOutputRowsAreNotSectorAligned).
  EXPECT_EQ(AutoKernelOf(1, 1, 8192, 8196), internal::Kernel::kWord);
  EXPECT_EQ(AutoKernelOf(1, 1, 8191, 8192), internal::Kernel::kSkewed);
  // Mostly partial 128 x 256 tiles.
  EXPECT_EQ(AutoKernelOf(1, 1000, 64, 64), internal::Kernel::kWord);
  // 2-byte batches of 64 x 64 take 64 x 64 tiles.
  EXPECT_EQ(AutoKernelOf(2, 4096, 64, 64), internal::Kernel::kVector);
  EXPECT_EQ(internal::VectorTileOf({2, 4096, 64, 64, nullptr, nullptr}).cols,
            64u);
  EXPECT_EQ(internal::VectorTileOf({2, 1, 64, 128, nullptr, nullptr}).cols,
            128u);
  EXPECT_EQ(AutoKernelOf(2, 1, 8192, 8192), internal::Kernel::kVector);
  EXPECT_EQ(AutoKernelOf(2, 16, 72, 200), internal::Kernel::kPadded32);
}

// 1- and 2-byte matrices the vector and word kernels do not take: the skewed
// kernel from 5 MiB (1-byte), 16 MiB (2-byte) or 32 MiB (2-byte, output rows
// on sectors), with at least 768 (1-byte) or 1024 (2-byte) rows; a padded
// tile otherwise (PaddedTileWhereNoOtherKernelSuits).
TEST(AutoKernelTest, SkewedForLarge1And2ByteMatrices) {
  EXPECT_EQ(AutoKernelOf(1, 1, 12345, 6789), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(1, 1, 2897, 2899), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(1, 1, 2401, 2403), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(1, 1, 2400, 2401), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(1, 16, 2047, 2049), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(1, 1, 1025, 8193), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(1, 1, 768, 8193), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(1, 1, 767, 10937), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(1, 1, 16385, 383), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(1, 1, 98305, 64), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(1, 1, 400009, 33), internal::Kernel::kSkewed);
  // 1-byte output rows on sectors (8192 or 4096 rows) too.
  EXPECT_EQ(AutoKernelOf(1, 1, 8192, 8191), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(1, 1, 4096, 4097), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(2, 1, 12345, 6789), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(2, 1, 4097, 4099), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(2, 1, 2897, 2899), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(2, 1, 2895, 2897), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(2, 1, 16385, 513), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(2, 1, 511, 16417), internal::Kernel::kPadded32);
  // 2-byte output rows on sectors (rows a multiple of 16): from 32 MiB.
  EXPECT_EQ(AutoKernelOf(2, 1, 4096, 8193), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(2, 1, 4096, 4097), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(2, 1, 2048, 4097), internal::Kernel::kPadded64x8);
}

// Matrices with at most 20 rows or columns (N x 3 points, their 3 x N
// coordinates), of every element size, take the thin kernel, unless they are
// small enough to stage whole; so do those with up to 32 columns of elements
// up to 8 bytes, up to 31 rows of elements up to 4 bytes and 32 of bytes, at
// least 4096 long.
TEST(AutoKernelTest, ThinWhereRowsOrColumnsAreFew) {
  for (size_t element_size : {1, 2, 4, 8, 16}) {
    for (const auto& [rows, cols] : {std::pair<uint64_t, uint64_t>{10000001, 3},
                                     {3, 10000001},
                                     {1000001, 20},
                                     {20, 1000001}}) {
      EXPECT_EQ(AutoKernelOf(element_size, 1, rows, cols),
                internal::Kernel::kThin)
          << element_size << "-byte " << rows << " x " << cols;
    }
  }
  EXPECT_EQ(AutoKernelOf(4, 1, 1000001, 1), internal::Kernel::kThin);
  EXPECT_EQ(AutoKernelOf(2, 1, 16, 4096), internal::Kernel::kThin);
  EXPECT_EQ(AutoKernelOf(4, 1000, 5000, 3), internal::Kernel::kThin);
  // 21 to 32 columns: up to 8-byte elements.
  EXPECT_EQ(AutoKernelOf(8, 1, 1000001, 32), internal::Kernel::kThin);
  EXPECT_EQ(AutoKernelOf(16, 1, 1000001, 21), internal::Kernel::kVector);
  // 21 to 31 rows: up to 4-byte elements; 32: 1-byte only.
  EXPECT_EQ(AutoKernelOf(4, 1, 31, 1000001), internal::Kernel::kThin);
  EXPECT_EQ(AutoKernelOf(8, 1, 21, 1000001), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(1, 1, 32, 1000001), internal::Kernel::kThin);
  EXPECT_EQ(AutoKernelOf(2, 1, 32, 1000001), internal::Kernel::kPadded32);
  // Past 20, not for short runs: batches of 32 x 32 or 64 x 32 matrices.
  EXPECT_EQ(AutoKernelOf(1, 1000, 32, 32), internal::Kernel::kWord);
  EXPECT_EQ(AutoKernelOf(4, 1000, 64, 32), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(4, 100, 4095, 32), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(4, 100, 4096, 32), internal::Kernel::kThin);
  // Past 32.
  EXPECT_EQ(AutoKernelOf(1, 1, 1000001, 33), internal::Kernel::kSkewed);
  EXPECT_EQ(AutoKernelOf(4, 1, 1000001, 33), internal::Kernel::kPadded32);
  // Small enough to stage whole: 4-byte 1000 x 3, a batch of 2 x 3.
  EXPECT_EQ(AutoKernelOf(4, 1, 1000, 3), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(4, 70000, 2, 3), internal::Kernel::kSmallMatrices);
}

// Where neither a vector, word, skewed nor small_matrices kernel suits a 1- or
// 2-byte matrix: the 32 x 32 tile below 16 MiB or where most 64 x 64 tiles
// would be partial, the 64 x 64 tile otherwise.
TEST(AutoKernelTest, PaddedTileWhereNoOtherKernelSuits) {
  EXPECT_EQ(AutoKernelOf(1, 1, 2047, 2049), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(2, 1, 2047, 2049), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(2, 1, 1023, 8191), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(2, 1, 1023, 8201), internal::Kernel::kPadded64x8);
  EXPECT_EQ(AutoKernelOf(2, 1, 1023, 16385), internal::Kernel::kPadded64x8);
  // Batches of matrices a 64 x 64 tile leaves mostly partial, past 16 MiB.
  EXPECT_EQ(AutoKernelOf(1, 1000, 300, 301), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(2, 200, 255, 257), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(2, 40, 1000, 1001), internal::Kernel::kPadded64x8);
}

// Matrices of at most 16 KiB (some larger: SmallMatricesSuitAuto) that 32 x 32
// tiles would leave mostly partial are staged whole; those the tiles cover, or
// larger ones, are tiled.
TEST(AutoKernelTest, SmallMatricesWhereTilesWouldBeMostlyPartial) {
  for (size_t element_size : {1, 2, 4}) {
    EXPECT_EQ(AutoKernelOf(element_size, 2048, 63, 65),
              internal::Kernel::kSmallMatrices)
        << element_size;
  }
  EXPECT_EQ(AutoKernelOf(4, 32768, 15, 17), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(4, 4096, 48, 80), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(8, 4096, 31, 33), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(16, 2048, 31, 33), internal::Kernel::kSmallMatrices);
  // Whole 32 x 32 tiles.
  EXPECT_EQ(AutoKernelOf(4, 4096, 64, 64), internal::Kernel::kPadded64x8);
  // Mostly partial 32 x 32 tiles, but 2-byte ones the vector kernel's 64 x 64
  // tiles mostly cover.
  EXPECT_EQ(AutoKernelOf(2, 1000, 64, 72), internal::Kernel::kVector);
  EXPECT_EQ(AutoKernelOf(1, 1000, 64, 72), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(1, 1000, 64, 64), internal::Kernel::kWord);
  // Past 16 KiB: 8-byte 63 x 65 (32 KiB), 16-byte 63 x 65.
  EXPECT_EQ(AutoKernelOf(8, 1024, 63, 65), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(16, 512, 63, 65), internal::Kernel::kVector);
  EXPECT_EQ(AutoKernelOf(4, 512, 127, 129), internal::Kernel::kPadded32);
  // The kernel takes one matrix of up to 48 KiB less its 32 bytes of slack;
  // past 16 KiB AUTO gives it 1-byte ones of that size and 2-byte ones of up
  // to 32 KiB unless their rows and columns are both even.
  EXPECT_TRUE(internal::TakesSmallMatrices(
      {4, 1, 8, 1535, reinterpret_cast<void*>(256), nullptr}));
  EXPECT_FALSE(internal::TakesSmallMatrices(
      {1, 1, 1, 49121, reinterpret_cast<void*>(256), nullptr}));
  EXPECT_EQ(AutoKernelOf(1, 100, 181, 180), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(1, 100, 180, 180), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(1, 100, 191, 257), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(1, 100, 191, 258), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(2, 100, 127, 129), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(2, 100, 126, 129), internal::Kernel::kSmallMatrices);
  EXPECT_EQ(AutoKernelOf(2, 100, 126, 130), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(2, 100, 129, 129), internal::Kernel::kPadded32);
  EXPECT_EQ(AutoKernelOf(4, 100, 63, 67), internal::Kernel::kPadded32);
  EXPECT_FALSE(internal::TakesSmallMatrices(
      {4, 1, uint64_t{1} << 32, 1, reinterpret_cast<void*>(256), nullptr}));
}

// Refused before anything reaches the device.
TEST(TuningTest, TheUntunableKernelsRefuseTunings) {
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

// Whether a kernel fits a device's shared memory is a function of the shape and
// the device's limit: 16-byte elements in padded_64's 64x65 tile need 66560
// bytes, more than a T4's 64 KiB; every kernel AUTO picks needs at most 48 KiB
// (small_matrices, one matrix per block), what every device gives a block.
TEST(CheckFitsDeviceTest, RefusesAKernelLargerThanTheDevicesSharedMemory) {
  constexpr size_t kT4 = 64 << 10, kH200 = 227 << 10;
  for (const size_t element_size : {1, 2, 4, 8, 16}) {
    for (const bool aligned : {true, false}) {
      const TransposeArgs args{element_size,
                               1,
                               4096,
                               4096,
                               reinterpret_cast<void*>(aligned ? 256 : 1),
                               reinterpret_cast<void*>(uintptr_t{1} << 40)};
      EXPECT_TRUE(CheckFitsDevice(Algorithm::kAuto, args, 48 << 10).ok())
          << element_size;
      EXPECT_TRUE(CheckFitsDevice(Algorithm::kPadded32, args, kT4).ok())
          << element_size;
      EXPECT_TRUE(CheckFitsDevice(Algorithm::kPadded64, args, kH200).ok())
          << element_size;
      EXPECT_EQ(CheckFitsDevice(Algorithm::kPadded64, args, kT4).ok(),
                element_size < 16)
          << element_size;
    }
  }
  for (const size_t element_size : {1, 2, 4, 8, 16}) {
    const TransposeArgs batch{element_size, 100, 31, 33, nullptr, nullptr};
    EXPECT_TRUE(CheckFitsDevice(Algorithm::kAuto, batch, 48 << 10).ok())
        << element_size;
  }
  const TransposeArgs complex128{16, 1, 64, 64, nullptr, nullptr};
  const absl::Status refused =
      CheckFitsDevice(Algorithm::kPadded64, complex128, kT4);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(refused.message(),
            "kernel padded_64 needs 66560 bytes of shared memory per block "
            "for 16-byte elements; the device has 65536");
  EXPECT_EQ(
      CheckFitsDevice(static_cast<Algorithm>(99), complex128, kH200).code(),
      absl::StatusCode::kInvalidArgument);
}

// Row tiles beyond the grid's x: refused before the upload, not failed at
// launch as INTERNAL.
TEST(CheckFitsDeviceTest, RefusesMoreRowTilesThanAGridTakes) {
  constexpr uint64_t kMaxRows = uint64_t{32} * 0x7fffffff;
  for (const Algorithm algorithm :
       {Algorithm::kAuto, Algorithm::kNaive, Algorithm::kPadded32}) {
    const TransposeArgs fits{1, 1, kMaxRows, 1, nullptr, nullptr};
    EXPECT_TRUE(CheckFitsDevice(algorithm, fits, 48 << 10).ok());
    const TransposeArgs too_tall{1, 1, kMaxRows + 1, 1, nullptr, nullptr};
    const absl::Status refused = CheckFitsDevice(algorithm, too_tall, 48 << 10);
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(refused.message().find("more than a launch grid takes"),
              std::string::npos);
  }
}

// A buffer not aligned to its elements is refused before anything reaches the
// device: a kernel's loads from it would fault, and the fault would end the
// device's context. (Neither call below touches a device.)
TEST(AlignmentTest, BuffersNotAlignedToTheirElementsAreRefused) {
  alignas(16) static uint8_t buffer[2][256];
  for (const size_t element_size : {2, 4, 8, 16}) {
    for (const size_t offset : {size_t{1}, element_size / 2}) {
      const TransposeArgs misaligned_input{element_size,       1,        2, 2,
                                           buffer[0] + offset, buffer[1]};
      const TransposeArgs misaligned_output{
          element_size, 1, 2, 2, buffer[0], buffer[1] + offset};
      for (const TransposeArgs& args : {misaligned_input, misaligned_output}) {
        EXPECT_EQ(CanImplement(Algorithm::kAuto, args).code(),
                  absl::StatusCode::kInvalidArgument)
            << element_size << " " << offset;
        EXPECT_EQ(LaunchTranspose(Algorithm::kPadded32, args, nullptr).code(),
                  absl::StatusCode::kInvalidArgument)
            << element_size << " " << offset;
      }
    }
  }
}

}  // namespace
}  // namespace transpose::kernels
