// One mapping from CUDA runtime errors to absl::Status, for the kernels' host
// library and the server's CUDA backend. Internal: it carries a CUDA type.
#ifndef TRANSPOSE_KERNELS_CUDA_STATUS_H_
#define TRANSPOSE_KERNELS_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace transpose::kernels::internal {

// OK for cudaSuccess; RESOURCE_EXHAUSTED for memory the device does not have
// now; INTERNAL, naming `what` and the error, otherwise.
inline absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrFormat(
      "%s: %s (%s)", what, cudaGetErrorString(error), cudaGetErrorName(error));
  if (error == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

// Whether `error` leaves the CUDA context unusable: every later call on the
// device fails with it, so nothing the device computes can be trusted until the
// process restarts. The codes CUDA's driver_types.h documents so ("any further
// CUDA work will return the same error ... the process must be terminated and
// relaunched"), and two more that end a context: an uncorrectable ECC error
// and a destroyed context.
inline bool IsStickyCudaError(cudaError_t error) {
  switch (error) {
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

}  // namespace transpose::kernels::internal

#endif  // TRANSPOSE_KERNELS_CUDA_STATUS_H_
