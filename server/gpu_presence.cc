#include "server/gpu_presence.h"

#include <filesystem>
#include <system_error>

namespace transpose {

int NvidiaDriverGpuCount(const std::string& driver_gpus_dir) {
  std::error_code error;
  int count = 0;
  for (std::filesystem::directory_iterator entry(driver_gpus_dir, error), end;
       !error && entry != end; entry.increment(error)) {
    ++count;
  }
  return count;
}

}  // namespace transpose
