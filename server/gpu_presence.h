// Whether this process was given NVIDIA GPUs, asked of the device files rather
// than of CUDA: a server that cannot use them (built without CUDA, or CUDA
// failing) says so instead of serving on the CPU without a word.
#ifndef TRANSPOSE_SERVER_GPU_PRESENCE_H_
#define TRANSPOSE_SERVER_GPU_PRESENCE_H_

#include <string>

namespace transpose {

// The NVIDIA GPUs given to this process: the nvidiaN device files in
// `device_dir` (a container gets those of its own GPUs; the driver's
// /proc/driver/nvidia/gpus lists the whole host's). 0 where
// CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES hides every GPU on purpose
// ("", -1, none, void).
int NvidiaGpuDeviceCount(const std::string& device_dir = "/dev");

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_GPU_PRESENCE_H_
