#include "kernels/cpu_transpose.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/cpu_transpose_tiles.h"

namespace transpose::kernels {
namespace {

// The definition of a transpose, element by element, independent of the blocked
// code.
std::vector<uint8_t> Reference(const std::vector<uint8_t>& in, size_t size,
                               uint64_t batch, uint64_t rows, uint64_t cols) {
  std::vector<uint8_t> out(in.size());
  for (uint64_t b = 0; b < batch; ++b) {
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t c = 0; c < cols; ++c) {
        std::memcpy(&out[((b * cols + c) * rows + r) * size],
                    &in[((b * rows + r) * cols + c) * size], size);
      }
    }
  }
  return out;
}

struct Case {
  uint64_t batch, rows, cols;
  uint64_t Bytes(size_t size) const { return batch * rows * cols * size; }
};

std::vector<uint8_t> RandomBytes(uint64_t n, std::mt19937& rng) {
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

TEST(CpuTransposeTest, MatchesReferenceForEveryElementSizeAndShape) {
  std::mt19937 rng(1);
  for (size_t size : {1, 2, 4, 8, 16}) {
    for (Case c : {Case{1, 1, 1}, Case{1, 1, 1000}, Case{1, 1000, 1},
                   Case{1, 31, 33}, Case{1, 64, 64}, Case{1, 127, 65},
                   Case{3, 65, 129}, Case{5, 1, 7}, Case{1, 613, 1031}}) {
      const std::vector<uint8_t> in = RandomBytes(c.Bytes(size), rng);
      std::vector<uint8_t> out(in.size(), 0xA5);
      TransposeArgs args{size, c.batch, c.rows, c.cols, in.data(), out.data()};
      ASSERT_TRUE(TransposeOnCpu(args).ok());
      EXPECT_EQ(out, Reference(in, size, c.batch, c.rows, c.cols))
          << size << "-byte " << c.batch << "x" << c.rows << "x" << c.cols;
    }
  }
}

TEST(CpuTransposeTest, ThreadCountDoesNotChangeTheResult) {
  std::mt19937 rng(2);
  const std::vector<uint8_t> in = RandomBytes(4 * 1031 * 1029, rng);
  const std::vector<uint8_t> expected = Reference(in, 4, 1, 1031, 1029);
  for (int threads : {1, 2, 3, 8}) {
    std::vector<uint8_t> out(in.size(), 0);
    ASSERT_TRUE(
        TransposeOnCpu({4, 1, 1031, 1029, in.data(), out.data()}, threads)
            .ok());
    EXPECT_EQ(out, expected) << threads << " threads";
  }
}

// What a server does while a matrix arrives: ranges of rows, in any order, add
// up to the whole.
TEST(CpuTransposeTest, RowRangesAddUpToTheWholeTranspose) {
  std::mt19937 rng(6);
  for (size_t size : {1, 2, 4, 8, 16}) {
    const Case c{
        3, 200,
        77};  // 200 rows: ranges end at 64, 128, 192 and the matrix end.
    const std::vector<uint8_t> in = RandomBytes(c.Bytes(size), rng);
    std::vector<uint8_t> out(in.size(), 0xA5);
    const TransposeArgs args{size,   c.batch,   c.rows,
                             c.cols, in.data(), out.data()};
    const RowRange ranges[] = {{328, 400}, {0, 64},    {200, 328},
                               {64, 200},  {464, 600}, {400, 464}};
    for (const RowRange& range : ranges) {
      ASSERT_TRUE(TransposeRowsOnCpu(args, range).ok())
          << range.first << " " << range.last;
    }
    EXPECT_EQ(out, Reference(in, size, c.batch, c.rows, c.cols)) << size;
  }
}

// Ranges of long rows (a short, wide matrix's bands) split over threads too.
TEST(CpuTransposeTest, RowRangesOnSeveralThreadsAddUpToTheWholeTranspose) {
  std::mt19937 rng(7);
  const std::vector<uint8_t> in = RandomBytes(4 * 200 * 20000, rng);
  const std::vector<uint8_t> expected = Reference(in, 4, 1, 200, 20000);
  for (int threads : {1, 2, 3, 0}) {
    std::vector<uint8_t> out(in.size(), 0xA5);
    const TransposeArgs args{4, 1, 200, 20000, in.data(), out.data()};
    for (const RowRange& range : {RowRange{64, 200}, RowRange{0, 64}}) {
      ASSERT_TRUE(TransposeRowsOnCpu(args, range, threads).ok()) << threads;
    }
    EXPECT_EQ(out, expected) << threads << " threads";
  }
}

// The input as a transport delivers it: pieces of any size, each in its own
// allocation, cutting through rows and cache lines.
struct Pieces {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<InputPiece> pieces;
};
Pieces CutIntoPieces(const std::vector<uint8_t>& in, std::mt19937& rng) {
  Pieces result;
  std::uniform_int_distribution<uint64_t> size(0, 3000);
  for (uint64_t offset = 0; offset < in.size();) {
    const uint64_t n = std::min<uint64_t>(size(rng), in.size() - offset);
    result.storage.emplace_back(in.begin() + offset, in.begin() + offset + n);
    result.pieces.push_back({offset, result.storage.back().data(), n});
    offset += n;
  }
  return result;
}

TEST(CpuTransposeTest, RowRangesFromPiecesMatchReference) {
  std::mt19937 rng(7);
  for (size_t size : {1, 2, 4, 8, 16}) {
    // Rows and columns whole lines for every element size; 256 rows in four
    // ranges of the 64-row granule.
    const Case c{2, 128, 192};
    const std::vector<uint8_t> in = RandomBytes(c.Bytes(size), rng);
    const std::vector<uint8_t> expected =
        Reference(in, size, c.batch, c.rows, c.cols);
    const Pieces pieces = CutIntoPieces(in, rng);
    std::vector<uint8_t> out(in.size(), 0xA5);
    const TransposeArgs args{size,   c.batch, c.rows,
                             c.cols, nullptr, out.data()};
    ASSERT_TRUE(CanTransposeFromPieces(args));
    for (const RowRange& range : {RowRange{128, 192}, RowRange{0, 64},
                                  RowRange{192, 256}, RowRange{64, 128}}) {
      ASSERT_TRUE(TransposeRowsFromPiecesOnCpu(args, range, pieces.pieces).ok())
          << range.first;
    }
    EXPECT_EQ(out, expected) << size << "-byte";
  }
}

// The tiled transpose's builds, each tested whichever one TransposeOnCpu
// picks. A CPU without a build's instructions reports its tests skipped rather
// than passed, so a run on such a CPU does not pass for a check of that build.
enum class TiledBuild { kPortable, kAvx2, kAvx512 };

class TiledBuildTest : public testing::TestWithParam<TiledBuild> {
 protected:
  void SetUp() override {
    if (GetParam() == TiledBuild::kAvx2 && !internal::HaveAvx2()) {
      GTEST_SKIP() << "this CPU has no AVX2";
    }
    if (GetParam() == TiledBuild::kAvx512 && !internal::HaveAvx512()) {
      GTEST_SKIP() << "this CPU has no AVX-512";
    }
  }

  // Whether the build takes these args: the AVX-512 build takes only 4-, 8-
  // and 16-byte elements.
  bool Takes(const TransposeArgs& args) const {
    return GetParam() != TiledBuild::kAvx512 || internal::Avx512Takes(args);
  }

  void Run(const TransposeArgs& args, const RowRange& range, int threads,
           absl::Span<const InputPiece> pieces) const {
    switch (GetParam()) {
      case TiledBuild::kPortable:
        return internal::TransposePortable(args, range, threads, pieces);
      case TiledBuild::kAvx2:
        return internal::TransposeAvx2(args, range, threads, pieces);
      case TiledBuild::kAvx512:
        return internal::TransposeAvx512(args, range, threads, pieces);
    }
  }

  // Each case whole, for every element size the build takes, on `threads`
  // threads, against the reference on random data.
  void ExpectMatchesReference(std::initializer_list<Case> cases, int threads,
                              uint32_t seed) const {
    std::mt19937 rng(seed);
    for (size_t size : {1, 2, 4, 8, 16}) {
      for (const Case& c : cases) {
        const std::vector<uint8_t> in = RandomBytes(c.Bytes(size), rng);
        std::vector<uint8_t> out(in.size(), 0xA5);
        const TransposeArgs args{size,   c.batch,   c.rows,
                                 c.cols, in.data(), out.data()};
        if (!Takes(args)) continue;
        Run(args, {0, c.batch * c.rows}, threads, {});
        EXPECT_EQ(out, Reference(in, size, c.batch, c.rows, c.cols))
            << size << "-byte " << c.batch << "x" << c.rows << "x" << c.cols;
      }
    }
  }
};

INSTANTIATE_TEST_SUITE_P(
    Builds, TiledBuildTest,
    testing::Values(TiledBuild::kPortable, TiledBuild::kAvx2,
                    TiledBuild::kAvx512),
    [](const testing::TestParamInfo<TiledBuild>& info) -> std::string {
      switch (info.param) {
        case TiledBuild::kPortable:
          return "Portable";
        case TiledBuild::kAvx2:
          return "Avx2";
        case TiledBuild::kAvx512:
          return "Avx512";
      }
      return "Unknown";
    });

TEST_P(TiledBuildTest, MatchesReference) {
  ExpectMatchesReference(
      {Case{1, 129, 131}, Case{2, 40, 300}, Case{1, 1, 77}, Case{1, 77, 1}},
      /*threads=*/2, /*seed=*/5);
}

// Short, wide matrices have fewer strips of rows than threads: the threads
// split the strips' columns too, the edges included.
TEST_P(TiledBuildTest, FewerStripsThanThreadsMatchReference) {
  ExpectMatchesReference({Case{1, 8, 20000}, Case{2, 5, 3001},
                          Case{1, 40, 1003}, Case{1, 3, 17}, Case{3, 1, 70}},
                         /*threads=*/5, /*seed=*/17);
}

// Outputs of 8 MiB and more that start on a 64-byte line, with output rows
// of whole lines, take each build's streaming (cache-bypassing) stores;
// std::vector's large blocks start 16 bytes past a page, so the tests above
// never do. Two batch entries, and columns past the last whole block, so the
// edges run on the same path.
TEST_P(TiledBuildTest, StreamingStoresMatchReference) {
  std::mt19937 rng(13);
  for (size_t size : {1, 2, 4, 8, 16}) {
    const uint64_t rows = 512;  // rows * size: whole 64-byte lines.
    const Case c{2, rows, (uint64_t{8} << 20) / (2 * rows * size) + 3};
    const std::vector<uint8_t> in = RandomBytes(c.Bytes(size), rng);
    std::vector<uint8_t> storage(in.size() + 64, 0xA5);
    uint8_t* const out =
        storage.data() +
        (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64);
    const TransposeArgs args{size, c.batch, c.rows, c.cols, in.data(), out};
    ASSERT_GE(args.bytes(), uint64_t{8} << 20);
    if (!Takes(args)) continue;
    Run(args, {0, c.batch * c.rows}, 2, {});
    EXPECT_TRUE(
        std::equal(out, out + in.size(),
                   Reference(in, size, c.batch, c.rows, c.cols).begin()))
        << size << "-byte";
  }
}

// Each build given only the pieces of the input that its row ranges need, the
// ranges in any order.
TEST_P(TiledBuildTest, RowRangesFromPiecesMatchReference) {
  std::mt19937 rng(7);
  for (size_t size : {1, 2, 4, 8, 16}) {
    const Case c{2, 128, 192};
    const std::vector<uint8_t> in = RandomBytes(c.Bytes(size), rng);
    const Pieces pieces = CutIntoPieces(in, rng);
    std::vector<uint8_t> out(in.size(), 0xA5);
    const TransposeArgs args{size,   c.batch, c.rows,
                             c.cols, nullptr, out.data()};
    if (!Takes(args)) continue;
    const uint64_t row_bytes = c.cols * size;
    for (const RowRange& range :
         {RowRange{64, 192}, RowRange{0, 64}, RowRange{192, 256}}) {
      std::vector<InputPiece> needed;
      for (const InputPiece& piece : pieces.pieces) {
        if (piece.offset + piece.size > range.first * row_bytes &&
            piece.offset < range.last * row_bytes)
          needed.push_back(piece);
      }
      Run(args, range, 1, needed);
    }
    EXPECT_EQ(out, Reference(in, size, c.batch, c.rows, c.cols))
        << size << "-byte";
  }
}

// A whole matrix from pieces, split over threads as TransposeOnCpu splits one
// (from 1 MiB on).
TEST(CpuTransposeTest, WholeMatrixFromPiecesOnSeveralThreadsMatchesReference) {
  std::mt19937 rng(11);
  for (size_t size : {1, 4, 16}) {
    const Case c{2, 512, 1024};
    const std::vector<uint8_t> in = RandomBytes(c.Bytes(size), rng);
    const std::vector<uint8_t> expected =
        Reference(in, size, c.batch, c.rows, c.cols);
    const Pieces pieces = CutIntoPieces(in, rng);
    for (int threads : {2, 0}) {
      std::vector<uint8_t> out(in.size(), 0xA5);
      const TransposeArgs args{size,   c.batch, c.rows,
                               c.cols, nullptr, out.data()};
      ASSERT_TRUE(TransposeRowsFromPiecesOnCpu(args, {0, c.batch * c.rows},
                                               pieces.pieces, threads)
                      .ok());
      EXPECT_EQ(out, expected) << size << "-byte, threads " << threads;
    }
  }
}

// A short, wide matrix from pieces on more threads than strips: the threads
// start strips of pieces partway along their rows.
TEST(CpuTransposeTest,
     ShortWideMatrixFromPiecesOnSeveralThreadsMatchesReference) {
  std::mt19937 rng(19);
  for (size_t size : {1, 4, 16}) {
    const Case c{1, 64 / size, 65536};
    const std::vector<uint8_t> in = RandomBytes(c.Bytes(size), rng);
    const Pieces pieces = CutIntoPieces(in, rng);
    std::vector<uint8_t> out(in.size(), 0xA5);
    const TransposeArgs args{size,   c.batch, c.rows,
                             c.cols, nullptr, out.data()};
    ASSERT_TRUE(
        TransposeRowsFromPiecesOnCpu(args, {0, c.rows}, pieces.pieces, 4).ok());
    EXPECT_EQ(out, Reference(in, size, c.batch, c.rows, c.cols))
        << size << "-byte";
  }
}

TEST(CpuTransposeTest, FromPiecesRejectsEdgesGapsAndShortPieces) {
  std::vector<uint8_t> in(4 * 128 * 32), out(in.size());
  const TransposeArgs args{4, 1, 128, 32, nullptr, out.data()};
  const uint64_t half = in.size() / 2;
  const InputPiece whole[] = {{0, in.data(), in.size()}};
  const InputPiece first_half[] = {{0, in.data(), half}};
  const InputPiece gap[] = {{0, in.data(), half - 64},
                            {half, in.data() + half, half}};
  EXPECT_TRUE(TransposeRowsFromPiecesOnCpu(args, {0, 128}, whole).ok());
  EXPECT_TRUE(TransposeRowsFromPiecesOnCpu(args, {0, 64}, first_half).ok());
  EXPECT_EQ(TransposeRowsFromPiecesOnCpu(args, {0, 128}, first_half).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransposeRowsFromPiecesOnCpu(args, {0, 128}, gap).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransposeRowsFromPiecesOnCpu(args, {0, 128}, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransposeRowsFromPiecesOnCpu(args, {0, 65}, whole).code(),
            absl::StatusCode::kInvalidArgument);
  // 100 rows of float32 end in a strip shorter than a line's 16 elements.
  const TransposeArgs edges{4, 1, 100, 32, nullptr, out.data()};
  EXPECT_FALSE(CanTransposeFromPieces(edges));
  EXPECT_EQ(TransposeRowsFromPiecesOnCpu(edges, {0, 100}, whole).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuTransposeTest, RejectsRowRangesOffTheGranule) {
  std::vector<uint8_t> a(4 * 200 * 10), b(a.size());
  const TransposeArgs args{4, 1, 200, 10, a.data(), b.data()};
  for (RowRange range : {RowRange{0, 0}, RowRange{0, 65}, RowRange{3, 64},
                         RowRange{64, 201}, RowRange{128, 64}}) {
    EXPECT_EQ(TransposeRowsOnCpu(args, range).code(),
              absl::StatusCode::kInvalidArgument)
        << range.first << " " << range.last;
  }
}

TEST(CpuTransposeTest, RejectsBadArgs) {
  std::vector<uint8_t> a(64), b(64);
  EXPECT_EQ(TransposeOnCpu({3, 1, 4, 4, a.data(), b.data()}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransposeOnCpu({4, 1, 0, 4, a.data(), b.data()}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransposeOnCpu({4, 1, 4, 4, nullptr, b.data()}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransposeOnCpu({4, 1, 4, 4, a.data(), a.data() + 4}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransposeOnCpu({4, 1, uint64_t{1} << 40, uint64_t{1} << 40,
                            a.data(), b.data()})
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The builds read and write typed elements: a buffer off its elements'
  // alignment is refused, not read or written out of line.
  alignas(16) uint8_t c[256], d[256];
  const absl::Status misaligned = TransposeOnCpu({16, 1, 4, 3, c + 8, d});
  EXPECT_EQ(misaligned.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(misaligned.message().find("input buffer"), std::string::npos)
      << misaligned;
  EXPECT_EQ(TransposeOnCpu({4, 1, 4, 4, c, d + 2}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TransposeRowsOnCpu({2, 1, 4, 4, c + 1, d}, {0, 4}).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint32_t> whole(64 * 64), result(64 * 64 + 1);
  const InputPiece piece{0, whole.data(), whole.size() * 4};
  EXPECT_EQ(TransposeRowsFromPiecesOnCpu(
                {4, 1, 64, 64, nullptr,
                 reinterpret_cast<uint8_t*>(result.data()) + 2},
                {0, 64}, {&piece, 1})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(TransposeOnCpu({16, 1, 4, 3, c + 16, d + 16}).ok());
}

TEST(CpuTransposeTest, ParallelMemcpyCopiesEverything) {
  std::vector<uint8_t> src((3 << 20) + 7), dst(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<uint8_t>(i * 7 + 1);
  ParallelMemcpy(dst.data(), src.data(), src.size(), 3);
  EXPECT_EQ(dst, src);
}

// A process pinned to one core (taskset -c 0, a container's cpuset) counts
// one, not the machine's cores.
TEST(CpuTransposeTest, UsableCoresFollowTheAffinity) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_GE(internal::CountUsableCores(), 1);
  EXPECT_LE(internal::CountUsableCores(), CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int pinned = internal::CountUsableCores();
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(pinned, 1);
}

}  // namespace
}  // namespace transpose::kernels
