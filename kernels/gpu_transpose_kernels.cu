// The classic transpose kernels. Every kernel handles any shape: partial edge
// tiles are bounds checked, and the grid strides over row tiles and batch
// entries past the grid's y and z limits, with 64-bit offsets throughout.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/gpu_launch.h"

namespace transpose::kernels::internal {
namespace {

struct alignas(16) Element16 {
  uint64_t lo, hi;
};

constexpr unsigned kMaxGridY = 65535;
constexpr unsigned kMaxGridZ = 65535;

// Coalesced reads, strided writes: a warp reads one 128-byte line of a row but
// writes 32 elements 'rows' apart, one cache line each, so writes run at a
// fraction of DRAM bandwidth.
template <typename T, int kTile, int kBlockRows>
__global__ void NaiveTranspose(const T* __restrict__ in, T* __restrict__ out,
                               uint64_t rows, uint64_t cols, uint64_t batch,
                               uint64_t row_tiles) {
  const uint64_t matrix = rows * cols;
  const uint64_t c = uint64_t{blockIdx.x} * kTile + threadIdx.x;
  for (uint64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const T* src = in + b * matrix;
    T* dst = out + b * matrix;
    for (uint64_t ty = blockIdx.y; ty < row_tiles; ty += gridDim.y) {
#pragma unroll
      for (int j = 0; j < kTile; j += kBlockRows) {
        const uint64_t r = ty * kTile + threadIdx.y + j;
        if (r < rows && c < cols) dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
}

// Stages a kTile x kTile tile in shared memory so both the global read and the
// global write are row-contiguous. kPad = 0 is the unpadded lesson: reading a
// tile column touches one bank per element, a 32-way conflict for 4-byte
// elements. kPad = 1 shifts each row by one bank, so a column spans all 32
// banks and the kernel runs near copy speed.
template <typename T, int kTile, int kBlockRows, int kPad>
__global__ void TiledTranspose(const T* __restrict__ in, T* __restrict__ out,
                               uint64_t rows, uint64_t cols, uint64_t batch,
                               uint64_t row_tiles) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* tile = reinterpret_cast<T*>(shared_bytes);
  constexpr int kStride = kTile + kPad;
  const uint64_t matrix = rows * cols;
  const uint64_t col0 = uint64_t{blockIdx.x} * kTile;
  for (uint64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const T* src = in + b * matrix;
    T* dst = out + b * matrix;
    for (uint64_t ty = blockIdx.y; ty < row_tiles; ty += gridDim.y) {
      const uint64_t row0 = ty * kTile;
      const uint64_t c = col0 + threadIdx.x;
#pragma unroll
      for (int j = 0; j < kTile; j += kBlockRows) {
        const uint64_t r = row0 + threadIdx.y + j;
        if (r < rows && c < cols) {
          tile[(threadIdx.y + j) * kStride + threadIdx.x] = src[r * cols + c];
        }
      }
      __syncthreads();
      // Output row = input column, output column = input row.
      const uint64_t out_c = row0 + threadIdx.x;
#pragma unroll
      for (int j = 0; j < kTile; j += kBlockRows) {
        const uint64_t out_r = col0 + threadIdx.y + j;
        if (out_r < cols && out_c < rows) {
          dst[out_r * rows + out_c] =
              tile[threadIdx.x * kStride + threadIdx.y + j];
        }
      }
      __syncthreads();
    }
  }
}

struct LaunchShape {
  int tile;
  int block_rows;
  int pad;
};

LaunchShape ShapeOf(Kernel kernel) {
  switch (kernel) {
    case Kernel::kNaive:
      return {32, 8, 0};
    case Kernel::kShared:
      return {32, 8, 0};
    case Kernel::kPadded32:
      return {32, 8, 1};
    case Kernel::kPadded64:
      return {64, 16, 1};
    case Kernel::kPadded64x8:
      return {64, 8, 1};
  }
  return {32, 8, 1};
}

template <typename T>
cudaError_t LaunchTyped(Kernel kernel, const TransposeArgs& args,
                        cudaStream_t stream) {
  const LaunchShape shape = ShapeOf(kernel);
  const uint64_t row_tiles = (args.rows + shape.tile - 1) / shape.tile;
  const uint64_t col_tiles = (args.cols + shape.tile - 1) / shape.tile;
  if (col_tiles > 0x7fffffffULL) return cudaErrorInvalidConfiguration;
  const dim3 grid(
      static_cast<unsigned>(col_tiles),
      static_cast<unsigned>(std::min<uint64_t>(row_tiles, kMaxGridY)),
      static_cast<unsigned>(std::min<uint64_t>(args.batch, kMaxGridZ)));
  const dim3 block(shape.tile, shape.block_rows);
  const T* in = static_cast<const T*>(args.input);
  T* out = static_cast<T*>(args.output);
  const size_t shared = SharedMemoryBytes(kernel, sizeof(T));

  void (*function)(const T*, T*, uint64_t, uint64_t, uint64_t, uint64_t) =
      nullptr;
  switch (kernel) {
    case Kernel::kNaive:
      function = NaiveTranspose<T, 32, 8>;
      break;
    case Kernel::kShared:
      function = TiledTranspose<T, 32, 8, 0>;
      break;
    case Kernel::kPadded32:
      function = TiledTranspose<T, 32, 8, 1>;
      break;
    case Kernel::kPadded64:
      function = TiledTranspose<T, 64, 16, 1>;
      break;
    case Kernel::kPadded64x8:
      function = TiledTranspose<T, 64, 8, 1>;
      break;
  }
  if (shared > 48 * 1024) {
    // Opting in past 48 KiB is per function and per device; it is a host-side
    // attribute, cheap enough to set on every launch.
    cudaError_t error = cudaFuncSetAttribute(
        function, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(shared));
    if (error != cudaSuccess) return error;
  }
  function<<<grid, block, shared, stream>>>(in, out, args.rows, args.cols,
                                            args.batch, row_tiles);
  return cudaGetLastError();
}

}  // namespace

size_t SharedMemoryBytes(Kernel kernel, size_t element_size) {
  if (kernel == Kernel::kNaive) return 0;
  const LaunchShape shape = ShapeOf(kernel);
  return static_cast<size_t>(shape.tile) * (shape.tile + shape.pad) *
         element_size;
}

int Launch(Kernel kernel, const TransposeArgs& args, void* stream) {
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  switch (args.element_size) {
    case 1:
      return LaunchTyped<uint8_t>(kernel, args, cuda_stream);
    case 2:
      return LaunchTyped<uint16_t>(kernel, args, cuda_stream);
    case 4:
      return LaunchTyped<uint32_t>(kernel, args, cuda_stream);
    case 8:
      return LaunchTyped<uint64_t>(kernel, args, cuda_stream);
    case 16:
      return LaunchTyped<Element16>(kernel, args, cuda_stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace transpose::kernels::internal
