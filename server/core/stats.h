// What one transpose cost; filled by the engine, returned to callers and
// exported as metrics.
#ifndef TRANSPOSE_SERVER_CORE_STATS_H_
#define TRANSPOSE_SERVER_CORE_STATS_H_

#include <cstdint>
#include <string>

namespace transpose {

struct TransposeStats {
  std::string backend;    // "cuda:N" or "cpu".
  std::string algorithm;  // The kernel that ran, e.g. "padded_64x8".
  double kernel_seconds = 0;
  // (bytes read + bytes written) / kernel_seconds.
  double bandwidth_bytes_per_second = 0;
  // bandwidth / the backend's calibrated copy bandwidth.
  double peak_fraction = 0;
  double queue_seconds = 0;
  double copy_in_seconds = 0;
  double copy_out_seconds = 0;
  double total_seconds = 0;
};

// Fills kernel_seconds, bandwidth and peak_fraction for a kernel that read and
// wrote `bytes` each way, against a backend whose copy ceiling is
// `peak_bytes_per_second` (also read + written).
inline void SetKernelTime(double kernel_seconds, uint64_t bytes,
                          double peak_bytes_per_second, TransposeStats& stats) {
  stats.kernel_seconds = kernel_seconds;
  stats.bandwidth_bytes_per_second =
      kernel_seconds > 0 ? 2.0 * static_cast<double>(bytes) / kernel_seconds
                         : 0;
  stats.peak_fraction =
      peak_bytes_per_second > 0
          ? stats.bandwidth_bytes_per_second / peak_bytes_per_second
          : 0;
}

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_STATS_H_
