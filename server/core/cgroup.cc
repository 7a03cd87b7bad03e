#include "server/core/cgroup.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace transpose {
namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// The tightest limit that `read` finds in the cgroup directory of `path`
// under `mount` and in each of its ancestors', up to `mount` itself.
template <typename T>
std::optional<T> Tightest(
    const std::string& mount, std::string path,
    const std::function<std::optional<T>(const std::string& dir)>& read) {
  if (path.empty() || path[0] != '/') return std::nullopt;
  std::optional<T> limit;
  while (true) {
    if (const std::optional<T> here =
            read(path == "/" ? mount : mount + path)) {
      limit = limit.has_value() ? std::min(*limit, *here) : *here;
    }
    if (path == "/") break;
    path.resize(std::max<size_t>(path.rfind('/'), 1));
  }
  return limit;
}

template <typename T>
std::optional<T> Min(std::optional<T> a, std::optional<T> b) {
  if (!a.has_value()) return b;
  if (!b.has_value()) return a;
  return std::min(*a, *b);
}

}  // namespace

namespace internal {

std::optional<int> CoresFromCpuMax(absl::string_view cpu_max) {
  const std::vector<absl::string_view> parts = absl::StrSplit(
      absl::StripAsciiWhitespace(cpu_max), ' ', absl::SkipEmpty());
  uint64_t quota, period;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &quota) ||
      !absl::SimpleAtoi(parts[1], &period) || quota == 0 || period == 0) {
    return std::nullopt;
  }
  return static_cast<int>(
      std::min<uint64_t>(quota / period + (quota % period != 0), INT_MAX));
}

std::optional<uint64_t> BytesFromMemoryMax(absl::string_view memory_max) {
  uint64_t bytes;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(memory_max), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

CgroupLimits ReadCgroupLimits(absl::string_view proc_self_cgroup,
                              const std::string& root) {
  const auto file = [](const std::string& dir, absl::string_view name) {
    return ReadSmallFile(absl::StrCat(dir, "/", name));
  };
  const std::function<std::optional<int>(const std::string&)> v2_cpu =
      [&](const std::string& dir) -> std::optional<int> {
    const std::optional<std::string> text = file(dir, "cpu.max");
    return text ? CoresFromCpuMax(*text) : std::nullopt;
  };
  const std::function<std::optional<uint64_t>(const std::string&)> v2_memory =
      [&](const std::string& dir) -> std::optional<uint64_t> {
    const std::optional<std::string> text = file(dir, "memory.max");
    return text ? BytesFromMemoryMax(*text) : std::nullopt;
  };
  const std::function<std::optional<int>(const std::string&)> v1_cpu =
      [&](const std::string& dir) -> std::optional<int> {
    const std::optional<std::string> quota = file(dir, "cpu.cfs_quota_us");
    const std::optional<std::string> period = file(dir, "cpu.cfs_period_us");
    if (!quota || !period) return std::nullopt;
    return CoresFromCpuMax(absl::StrCat(absl::StripAsciiWhitespace(*quota), " ",
                                        absl::StripAsciiWhitespace(*period)));
  };
  const std::function<std::optional<uint64_t>(const std::string&)> v1_memory =
      [&](const std::string& dir) -> std::optional<uint64_t> {
    const std::optional<std::string> text = file(dir, "memory.limit_in_bytes");
    return text ? BytesFromMemoryMax(*text) : std::nullopt;
  };

  CgroupLimits limits;
  // Lines "ID:CONTROLLERS:PATH"; v2's has ID 0 and no controllers.
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    const std::string path(fields[2]);
    if (fields[0] == "0" && fields[1].empty()) {
      limits.cpu_cores = Min(limits.cpu_cores, Tightest(root, path, v2_cpu));
      limits.memory_bytes =
          Min(limits.memory_bytes, Tightest(root, path, v2_memory));
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "cpu") {
        // Mounted as cpu, or as cpu,cpuacct where the two share a hierarchy.
        for (const char* mount : {"/cpu", "/cpu,cpuacct"}) {
          limits.cpu_cores =
              Min(limits.cpu_cores, Tightest(root + mount, path, v1_cpu));
        }
      } else if (controller == "memory") {
        limits.memory_bytes = Min(limits.memory_bytes,
                                  Tightest(root + "/memory", path, v1_memory));
      }
    }
  }
  return limits;
}

}  // namespace internal

CgroupLimits CurrentCgroupLimits() {
  const std::optional<std::string> self = ReadSmallFile("/proc/self/cgroup");
  if (!self) return {};
  return internal::ReadCgroupLimits(*self, "/sys/fs/cgroup");
}

}  // namespace transpose
