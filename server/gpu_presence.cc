#include "server/gpu_presence.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace transpose {
namespace {

bool HidesEveryGpu(const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr) return false;
  const absl::string_view v = absl::StripAsciiWhitespace(value);
  return v.empty() || v == "-1" || v == "none" || v == "void";
}

}  // namespace

int NvidiaGpuDeviceCount(const std::string& device_dir) {
  if (HidesEveryGpu("CUDA_VISIBLE_DEVICES") ||
      HidesEveryGpu("NVIDIA_VISIBLE_DEVICES")) {
    return 0;
  }
  std::error_code error;
  int count = 0;
  for (std::filesystem::directory_iterator entry(device_dir, error), end;
       !error && entry != end; entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    absl::string_view number = name;
    if (absl::ConsumePrefix(&number, "nvidia") && !number.empty() &&
        std::all_of(number.begin(), number.end(), absl::ascii_isdigit)) {
      ++count;
    }
  }
  return count;
}

}  // namespace transpose
