// The CPU transpose's AVX2 micro-kernels: each transposes a square block of a
// local buffer in registers with unpack and shuffle instructions, and whole
// cache lines move between memory and the buffers in 32-byte loads and stores.
// Compiled with -mavx2; called only when the CPU has AVX2.
#include <immintrin.h>

#include "kernels/cpu_transpose_tiles.h"

namespace transpose::kernels::internal {
namespace {

__m128i Load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
__m256i Load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
void Store(void* p, __m128i v) {
  _mm_storeu_si128(static_cast<__m128i*>(p), v);
}
void Store(void* p, __m256i v) {
  _mm256_storeu_si256(static_cast<__m256i*>(p), v);
}

// Moving whole cache lines between memory and a block's local buffer, for every
// element size.
struct Avx2Lines {
  static constexpr bool kWholeLines = false;
  static void LoadLine(void* line, const void* src) {
    const auto* s = static_cast<const __m256i*>(src);
    auto* l = static_cast<__m256i*>(line);
    _mm256_store_si256(l, _mm256_loadu_si256(s));
    _mm256_store_si256(l + 1, _mm256_loadu_si256(s + 1));
  }
  // Streaming stores skip the read-for-ownership of a line that is overwritten
  // whole.
  static void StoreLine(void* dst, const void* line, bool stream) {
    const auto* l = static_cast<const __m256i*>(line);
    auto* d = static_cast<__m256i*>(dst);
    if (stream) {
      _mm256_stream_si256(d, _mm256_load_si256(l));
      _mm256_stream_si256(d + 1, _mm256_load_si256(l + 1));
    } else {
      _mm256_storeu_si256(d, _mm256_load_si256(l));
      _mm256_storeu_si256(d + 1, _mm256_load_si256(l + 1));
    }
  }
  static void Fence() { _mm_sfence(); }
};

template <typename T>
struct Avx2Micro;

// 16 x 16 bytes: four rounds of unpacks (8, 16, 32, 64 bits).
template <>
struct Avx2Micro<uint8_t> : Avx2Lines {
  static constexpr uint64_t kBlock = 16;
  static void Block(const uint8_t* in, uint64_t in_stride, uint8_t* out,
                    uint64_t out_stride) {
    __m128i r[16], a[16], b[16];
    for (int i = 0; i < 16; ++i) r[i] = Load128(in + i * in_stride);
    for (int k = 0; k < 8; ++k) {
      a[2 * k] = _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]);
      a[2 * k + 1] = _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1]);
    }
    // a[4g + 0..3]: columns 0-7 and 8-15 of row pairs (4g, 4g+1) and (4g+2,
    // 4g+3).
    for (int g = 0; g < 4; ++g) {
      b[4 * g + 0] = _mm_unpacklo_epi16(a[4 * g], a[4 * g + 2]);
      b[4 * g + 1] = _mm_unpackhi_epi16(a[4 * g], a[4 * g + 2]);
      b[4 * g + 2] = _mm_unpacklo_epi16(a[4 * g + 1], a[4 * g + 3]);
      b[4 * g + 3] = _mm_unpackhi_epi16(a[4 * g + 1], a[4 * g + 3]);
    }
    // b[4g + q]: columns 4q..4q+3 of rows 4g..4g+3.
    for (int h = 0; h < 2; ++h) {
      for (int q = 0; q < 4; ++q) {
        a[8 * h + 2 * q] = _mm_unpacklo_epi32(b[8 * h + q], b[8 * h + 4 + q]);
        a[8 * h + 2 * q + 1] =
            _mm_unpackhi_epi32(b[8 * h + q], b[8 * h + 4 + q]);
      }
    }
    // a[8h + p]: columns 2p, 2p+1 of rows 8h..8h+7.
    for (int p = 0; p < 8; ++p) {
      Store(out + (2 * p) * out_stride, _mm_unpacklo_epi64(a[p], a[8 + p]));
      Store(out + (2 * p + 1) * out_stride, _mm_unpackhi_epi64(a[p], a[8 + p]));
    }
  }
};

// 8 x 8 16-bit elements: unpacks of 16, 32 and 64 bits.
template <>
struct Avx2Micro<uint16_t> : Avx2Lines {
  static constexpr uint64_t kBlock = 8;
  static void Block(const uint16_t* in, uint64_t in_stride, uint16_t* out,
                    uint64_t out_stride) {
    __m128i r[8], a[8], b[8];
    for (int i = 0; i < 8; ++i) r[i] = Load128(in + i * in_stride);
    for (int k = 0; k < 4; ++k) {
      a[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);
      a[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);
    }
    for (int g = 0; g < 2; ++g) {
      b[4 * g + 0] = _mm_unpacklo_epi32(a[4 * g], a[4 * g + 2]);
      b[4 * g + 1] = _mm_unpackhi_epi32(a[4 * g], a[4 * g + 2]);
      b[4 * g + 2] = _mm_unpacklo_epi32(a[4 * g + 1], a[4 * g + 3]);
      b[4 * g + 3] = _mm_unpackhi_epi32(a[4 * g + 1], a[4 * g + 3]);
    }
    // b[4g + q]: columns 2q, 2q+1 of rows 4g..4g+3.
    for (int q = 0; q < 4; ++q) {
      Store(out + (2 * q) * out_stride, _mm_unpacklo_epi64(b[q], b[4 + q]));
      Store(out + (2 * q + 1) * out_stride, _mm_unpackhi_epi64(b[q], b[4 + q]));
    }
  }
};

// 8 x 8 32-bit elements in 256-bit registers.
template <>
struct Avx2Micro<uint32_t> : Avx2Lines {
  static constexpr uint64_t kBlock = 8;
  static void Block(const uint32_t* in, uint64_t in_stride, uint32_t* out,
                    uint64_t out_stride) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i)
      r[i] = _mm256_castsi256_ps(Load256(in + i * in_stride));
    for (int k = 0; k < 4; ++k) {
      t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int g = 0; g < 2; ++g) {
      r[4 * g + 0] =
          _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * g + 1] =
          _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3],
                                       _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3],
                                       _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int q = 0; q < 4; ++q) {
      Store(out + q * out_stride,
            _mm256_castps_si256(_mm256_permute2f128_ps(r[q], r[4 + q], 0x20)));
      Store(out + (q + 4) * out_stride,
            _mm256_castps_si256(_mm256_permute2f128_ps(r[q], r[4 + q], 0x31)));
    }
  }
};

// 4 x 4 64-bit elements in 256-bit registers.
template <>
struct Avx2Micro<uint64_t> : Avx2Lines {
  static constexpr uint64_t kBlock = 4;
  static void Block(const uint64_t* in, uint64_t in_stride, uint64_t* out,
                    uint64_t out_stride) {
    __m256d r[4];
    for (int i = 0; i < 4; ++i)
      r[i] = _mm256_castsi256_pd(Load256(in + i * in_stride));
    const __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]);
    const __m256d t1 = _mm256_unpackhi_pd(r[0], r[1]);
    const __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]);
    const __m256d t3 = _mm256_unpackhi_pd(r[2], r[3]);
    Store(out, _mm256_castpd_si256(_mm256_permute2f128_pd(t0, t2, 0x20)));
    Store(out + out_stride,
          _mm256_castpd_si256(_mm256_permute2f128_pd(t1, t3, 0x20)));
    Store(out + 2 * out_stride,
          _mm256_castpd_si256(_mm256_permute2f128_pd(t0, t2, 0x31)));
    Store(out + 3 * out_stride,
          _mm256_castpd_si256(_mm256_permute2f128_pd(t1, t3, 0x31)));
  }
};

// 16-byte elements need no shuffling: each is one 128-bit load and store.
template <>
struct Avx2Micro<Element16> : Avx2Lines {
  static constexpr uint64_t kBlock = 4;
  static void Block(const Element16* in, uint64_t in_stride, Element16* out,
                    uint64_t out_stride) {
    for (int c = 0; c < 4; ++c) {
      for (int r = 0; r < 4; ++r)
        Store(out + c * out_stride + r, Load128(in + r * in_stride + c));
    }
  }
};

}  // namespace

bool HaveAvx2() { return __builtin_cpu_supports("avx2"); }

void TransposeAvx2(const TransposeArgs& args, const RowRange& range,
                   int threads, absl::Span<const InputPiece> pieces) {
  TransposeBySize<Avx2Micro>(args, range, threads, pieces);
}

}  // namespace transpose::kernels::internal
