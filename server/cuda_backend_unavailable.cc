// CudaBackend for builds without the CUDA toolkit: there is never a GPU.
#include "absl/status/status.h"
#include "server/cuda_backend.h"

namespace transpose {

int CudaDeviceCount() { return 0; }

absl::StatusOr<std::vector<std::unique_ptr<Backend>>> CreateCudaBackends(
    const CudaBackendOptions&, Metrics&) {
  return absl::UnavailableError("this server was built without CUDA");
}

}  // namespace transpose
