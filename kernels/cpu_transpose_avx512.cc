// The CPU transpose's AVX-512 micro-kernels: a 512-bit register holds one
// cache line, so a block of a line's worth of rows and columns is transposed
// entirely in registers, loaded and stored one line per instruction, with no
// local buffer in between (against the AVX2 build: a float32 4096² request
// from 64 KiB pieces in 5.9 ms instead of 9.4 on the CI machine's cores;
// docs/BENCHMARKS.md). Every loop over registers carries `#pragma GCC unroll`:
// at -O2 GCC leaves 16-iteration loops rolled, which puts the register arrays
// on the stack. Compiled with -mavx512f; called only when the CPU has
// AVX-512F.
#include <immintrin.h>

#include "kernels/cpu_transpose_tiles.h"

namespace transpose::kernels::internal {
namespace {

// Stores the tile's output lines, streaming when asked (the caller fences).
template <int kLines>
void StoreLines(const __m512i (&lines)[kLines], void* out,
                uint64_t out_stride_bytes, bool stream) {
  auto* dst = static_cast<uint8_t*>(out);
#pragma GCC unroll 16
  for (int j = 0; j < kLines; ++j) {
    auto* line = reinterpret_cast<__m512i*>(dst + j * out_stride_bytes);
    if (stream) {
      _mm512_stream_si512(line, lines[j]);
    } else {
      _mm512_storeu_si512(line, lines[j]);
    }
  }
}

// What every AVX-512 micro-kernel shares: it loads and stores whole lines
// itself, and streaming stores end with a fence.
struct Avx512Lines {
  static constexpr bool kWholeLines = true;
  static void Fence() { _mm_sfence(); }
};

template <typename T>
struct Avx512Micro;

// 16 x 16 32-bit elements: unpacks of 32 and 64 bits within 128-bit lanes,
// then two rounds of 128-bit lane shuffles.
template <>
struct Avx512Micro<uint32_t> : Avx512Lines {
  static constexpr uint64_t kBlock = 16;
  static void Tile(const uint32_t* const* in, uint32_t* out,
                   uint64_t out_stride, bool stream) {
    __m512 r[16], t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in[i]);
#pragma GCC unroll 16
    for (int k = 0; k < 8; ++k) {
      t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
#pragma GCC unroll 16
    for (int g = 0; g < 4; ++g) {
      r[4 * g + 0] =
          _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * g + 1] =
          _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3],
                                       _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3],
                                       _MM_SHUFFLE(3, 2, 3, 2));
    }
// r[4g + q]: columns q, q + 4, q + 8, q + 12 (one per lane) of rows
// 4g..4g+3.
#pragma GCC unroll 16
    for (int q = 0; q < 4; ++q) {
      t[q] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88);
      t[4 + q] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xdd);
      t[8 + q] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88);
      t[12 + q] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xdd);
    }
    __m512i lines[16];
#pragma GCC unroll 16
    for (int q = 0; q < 8; ++q) {
      lines[q] =
          _mm512_castps_si512(_mm512_shuffle_f32x4(t[q], t[8 + q], 0x88));
      lines[8 + q] =
          _mm512_castps_si512(_mm512_shuffle_f32x4(t[q], t[8 + q], 0xdd));
    }
    StoreLines(lines, out, out_stride * sizeof(uint32_t), stream);
  }
};

// 8 x 8 64-bit elements: unpacks of 64 bits, then two rounds of 128-bit lane
// shuffles.
template <>
struct Avx512Micro<uint64_t> : Avx512Lines {
  static constexpr uint64_t kBlock = 8;
  static void Tile(const uint64_t* const* in, uint64_t* out,
                   uint64_t out_stride, bool stream) {
    __m512i r[8], t[8];
#pragma GCC unroll 16
    for (int i = 0; i < 8; ++i) r[i] = _mm512_loadu_si512(in[i]);
#pragma GCC unroll 16
    for (int k = 0; k < 4; ++k) {
      t[2 * k] = _mm512_unpacklo_epi64(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_epi64(r[2 * k], r[2 * k + 1]);
    }
// t[2k + h]: columns h, h + 2, h + 4, h + 6 (one per lane) of rows 2k and
// 2k + 1.
#pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      r[h] = _mm512_shuffle_i64x2(t[h], t[2 + h], 0x88);
      r[2 + h] = _mm512_shuffle_i64x2(t[h], t[2 + h], 0xdd);
      r[4 + h] = _mm512_shuffle_i64x2(t[4 + h], t[6 + h], 0x88);
      r[6 + h] = _mm512_shuffle_i64x2(t[4 + h], t[6 + h], 0xdd);
    }
    __m512i lines[8];
#pragma GCC unroll 16
    for (int q = 0; q < 4; ++q) {
      lines[q] = _mm512_shuffle_i64x2(r[q], r[4 + q], 0x88);
      lines[4 + q] = _mm512_shuffle_i64x2(r[q], r[4 + q], 0xdd);
    }
    StoreLines(lines, out, out_stride * sizeof(uint64_t), stream);
  }
};

// 4 x 4 16-byte elements: two rounds of 128-bit lane shuffles.
template <>
struct Avx512Micro<Element16> : Avx512Lines {
  static constexpr uint64_t kBlock = 4;
  static void Tile(const Element16* const* in, Element16* out,
                   uint64_t out_stride, bool stream) {
    __m512i r[4];
#pragma GCC unroll 16
    for (int i = 0; i < 4; ++i) r[i] = _mm512_loadu_si512(in[i]);
    const __m512i t0 =
        _mm512_shuffle_i64x2(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i t1 =
        _mm512_shuffle_i64x2(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i t2 =
        _mm512_shuffle_i64x2(r[2], r[3], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i t3 =
        _mm512_shuffle_i64x2(r[2], r[3], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i lines[4] = {
        _mm512_shuffle_i64x2(t0, t2, _MM_SHUFFLE(2, 0, 2, 0)),
        _mm512_shuffle_i64x2(t1, t3, _MM_SHUFFLE(2, 0, 2, 0)),
        _mm512_shuffle_i64x2(t0, t2, _MM_SHUFFLE(3, 1, 3, 1)),
        _mm512_shuffle_i64x2(t1, t3, _MM_SHUFFLE(3, 1, 3, 1))};
    StoreLines(lines, out, out_stride * sizeof(Element16), stream);
  }
};

}  // namespace

bool HaveAvx512() { return __builtin_cpu_supports("avx512f"); }

bool Avx512Takes(const TransposeArgs& args) {
  return args.element_size == 4 || args.element_size == 8 ||
         args.element_size == 16;
}

void TransposeAvx512(const TransposeArgs& args, const RowRange& range,
                     int threads, absl::Span<const InputPiece> pieces) {
  switch (args.element_size) {
    case 4:
      TransposeFrom<uint32_t, Avx512Micro<uint32_t>>(args, range, threads,
                                                     pieces);
      break;
    case 8:
      TransposeFrom<uint64_t, Avx512Micro<uint64_t>>(args, range, threads,
                                                     pieces);
      break;
    case 16:
      TransposeFrom<Element16, Avx512Micro<Element16>>(args, range, threads,
                                                       pieces);
      break;
  }
}

}  // namespace transpose::kernels::internal
