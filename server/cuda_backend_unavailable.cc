// CudaBackend for builds without the CUDA toolkit: there is never a GPU.
#include "absl/status/status.h"
#include "server/cuda_backend.h"

namespace transpose {

int CudaDeviceCount() { return 0; }

std::string WhyNoCudaDevice() {
  return "this server was built without CUDA (no nvcc at build time: install "
         "the CUDA toolkit at /usr/local/cuda and build again)";
}

absl::StatusOr<CudaBackends> CreateCudaBackends(const CudaBackendOptions&,
                                                Metrics&) {
  return absl::UnavailableError("this server was built without CUDA");
}

}  // namespace transpose
