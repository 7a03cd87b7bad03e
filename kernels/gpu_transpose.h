// The GPU transpose kernels, behind an interface with no CUDA types: a caller
// passes device pointers in TransposeArgs and its cudaStream_t as an opaque
// pointer. Kernels never allocate or synchronise; every launch is checked.
#ifndef TRANSPOSE_KERNELS_GPU_TRANSPOSE_H_
#define TRANSPOSE_KERNELS_GPU_TRANSPOSE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/transpose_args.h"

namespace transpose::kernels {

// The name of the kernel `algorithm` runs for `args` (for kAuto, the kernel it
// picks). A small, fixed set of names, fit for metric labels.
absl::string_view KernelName(Algorithm algorithm, const TransposeArgs& args);

// Every name KernelName can return.
absl::Span<const absl::string_view> AllKernelNames();

// OK when `algorithm` can run `args` on the current device: CheckArgs holds,
// each buffer is aligned to its elements (as every allocation is; a kernel's
// loads would fault on others, and such a fault ends the device's context) and
// the kernel fits the device. INVALID_ARGUMENT or UNIMPLEMENTED otherwise.
absl::Status CanImplement(Algorithm algorithm, const TransposeArgs& args);

// OK when the kernel `algorithm` runs for `args` fits a device with
// `max_shared_bytes` of shared memory per block (CUDA's opt-in maximum), and
// its tiles fit a launch grid, as CanImplement checks on the current device;
// UNIMPLEMENTED naming what does not fit otherwise, INVALID_ARGUMENT for an
// algorithm this build does not know. Needs no device, and only the shape and
// element size of `args` (a caller can ask before it has buffers; AUTO's pick
// also reads their alignment).
absl::Status CheckFitsDevice(Algorithm algorithm, const TransposeArgs& args,
                             size_t max_shared_bytes);

// Enqueues the transpose on `cuda_stream` (a cudaStream_t; nullptr is the
// legacy default stream) of the current device. Returns INVALID_ARGUMENT for
// buffers not aligned to their elements (before anything reaches the device),
// INTERNAL with CUDA's message if the launch failed.
absl::Status LaunchTranspose(Algorithm algorithm, const TransposeArgs& args,
                             void* cuda_stream);

}  // namespace transpose::kernels

#endif  // TRANSPOSE_KERNELS_GPU_TRANSPOSE_H_
