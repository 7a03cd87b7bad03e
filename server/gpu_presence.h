// Whether the machine has NVIDIA GPUs, asked of the driver rather than of
// CUDA: a server that cannot use them (built without CUDA, or CUDA failing)
// says so instead of serving on the CPU without a word.
#ifndef TRANSPOSE_SERVER_GPU_PRESENCE_H_
#define TRANSPOSE_SERVER_GPU_PRESENCE_H_

#include <string>

namespace transpose {

// The GPUs the NVIDIA driver lists: the entries of `driver_gpus_dir` (the
// driver's /proc/driver/nvidia/gpus has one per GPU). 0 without the driver.
int NvidiaDriverGpuCount(
    const std::string& driver_gpus_dir = "/proc/driver/nvidia/gpus");

// Why this server sees no CUDA device: a build without CUDA, or CUDA's error.
std::string WhyNoCudaDevice();

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_GPU_PRESENCE_H_
