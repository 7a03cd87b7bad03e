// CUDA errors as statuses, and which of them end a device's service. Runs
// without a GPU: nothing here calls the device.
#include "kernels/cuda_status.h"

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace transpose::kernels::internal {
namespace {

// The codes the toolkit's own header documents as sticky, read from it, so
// that a toolkit which adds one fails here rather than leaving a dead device in
// service.
std::vector<std::pair<std::string, int>> DocumentedStickyErrors() {
  std::ifstream header(TRANSPOSE_CUDA_DRIVER_TYPES_H);
  std::stringstream text;
  text << header.rdbuf();
  const std::string s = text.str();
  std::vector<std::pair<std::string, int>> sticky;
  const std::regex entry(
      R"(/\*\*((?:[^*]|\*(?!/))*)\*/\s*(cudaError\w+)\s*=\s*(\d+))");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), entry);
       it != std::sregex_iterator(); ++it) {
    // The comment's words, without its line breaks and leading stars.
    const std::string doc = std::regex_replace(std::string((*it)[1]),
                                               std::regex(R"((\s|\*)+)"), " ");
    if (doc.find("terminated and relaunched") != std::string::npos) {
      sticky.emplace_back((*it)[2], std::stoi((*it)[3]));
    }
  }
  return sticky;
}

TEST(CudaStatusTest, EveryErrorTheToolkitCallsStickyIsSticky) {
  const std::vector<std::pair<std::string, int>> sticky =
      DocumentedStickyErrors();
  // The header was found and read: CUDA 13 documents 13 such codes.
  ASSERT_GE(sticky.size(), 10u) << TRANSPOSE_CUDA_DRIVER_TYPES_H;
  for (const auto& [name, code] : sticky) {
    EXPECT_TRUE(IsStickyCudaError(static_cast<cudaError_t>(code))) << name;
  }
}

TEST(CudaStatusTest, PassingErrorsAreNotSticky) {
  for (cudaError_t error :
       {cudaSuccess, cudaErrorMemoryAllocation, cudaErrorInvalidValue,
        cudaErrorInvalidConfiguration, cudaErrorLaunchOutOfResources,
        cudaErrorNotReady}) {
    EXPECT_FALSE(IsStickyCudaError(error)) << error;
  }
}

TEST(CudaStatusTest, OutOfMemoryIsResourceExhaustedAndTheRestInternal) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "copy").ok());
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "copy").code(),
            absl::StatusCode::kResourceExhausted);
  const absl::Status fault = CudaStatus(cudaErrorIllegalAddress, "copy in");
  EXPECT_EQ(fault.code(), absl::StatusCode::kInternal);
  EXPECT_NE(fault.message().find("copy in: "), std::string::npos);
  EXPECT_NE(fault.message().find("cudaErrorIllegalAddress"), std::string::npos);
}

}  // namespace
}  // namespace transpose::kernels::internal
