#include "server/nvml_collector.h"

#include <dlfcn.h>

#include <utility>

#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace transpose {

// The few NVML entry points used, declared by hand: NVML's header ships with
// the driver's development files, not with the toolkit this builds against, and
// the C ABI is stable.
struct NvmlCollector::Api {
  struct Utilization {
    unsigned int gpu;
    unsigned int memory;
  };
  struct Memory {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
  };
  using Init = int (*)();
  using Shutdown = int (*)();
  using HandleByPciBusId = int (*)(const char*, void**);
  using UtilizationRates = int (*)(void*, Utilization*);
  using MemoryInfo = int (*)(void*, Memory*);

  void* library = nullptr;
  Shutdown shutdown = nullptr;
  HandleByPciBusId handle_by_pci_bus_id = nullptr;
  UtilizationRates utilization_rates = nullptr;
  MemoryInfo memory_info = nullptr;

  ~Api() {
    if (shutdown != nullptr) shutdown();
    if (library != nullptr) dlclose(library);
  }
};

std::unique_ptr<NvmlCollector> NvmlCollector::Create(
    const std::vector<Device>& devices) {
  auto api = std::make_unique<Api>();
  api->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api->library == nullptr) return nullptr;
  auto init = reinterpret_cast<Api::Init>(dlsym(api->library, "nvmlInit_v2"));
  api->handle_by_pci_bus_id = reinterpret_cast<Api::HandleByPciBusId>(
      dlsym(api->library, "nvmlDeviceGetHandleByPciBusId_v2"));
  api->utilization_rates = reinterpret_cast<Api::UtilizationRates>(
      dlsym(api->library, "nvmlDeviceGetUtilizationRates"));
  api->memory_info = reinterpret_cast<Api::MemoryInfo>(
      dlsym(api->library, "nvmlDeviceGetMemoryInfo"));
  auto shutdown =
      reinterpret_cast<Api::Shutdown>(dlsym(api->library, "nvmlShutdown"));
  if (init == nullptr || shutdown == nullptr ||
      api->handle_by_pci_bus_id == nullptr ||
      api->utilization_rates == nullptr || api->memory_info == nullptr ||
      init() != 0) {
    return nullptr;
  }
  api->shutdown = shutdown;
  std::vector<std::pair<std::string, void*>> handles;
  for (const Device& device : devices) {
    void* handle = nullptr;
    if (api->handle_by_pci_bus_id(device.pci_bus_id.c_str(), &handle) == 0) {
      handles.emplace_back(device.backend, handle);
    }
  }
  if (handles.empty()) return nullptr;
  return std::unique_ptr<NvmlCollector>(
      new NvmlCollector(std::move(api), std::move(handles)));
}

NvmlCollector::NvmlCollector(std::unique_ptr<Api> api,
                             std::vector<std::pair<std::string, void*>> handles)
    : api_(std::move(api)), handles_(std::move(handles)) {}

NvmlCollector::~NvmlCollector() = default;

std::vector<prometheus::MetricFamily> NvmlCollector::Collect() const {
  prometheus::MetricFamily utilization{"transpose_gpu_utilization_ratio",
                                       "Fraction of the last sample period in "
                                       "which a kernel ran on the GPU (NVML).",
                                       prometheus::MetricType::Gauge,
                                       {}};
  prometheus::MetricFamily used{"transpose_gpu_memory_used_bytes",
                                "GPU memory in use by all processes (NVML).",
                                prometheus::MetricType::Gauge,
                                {}};
  prometheus::MetricFamily total{"transpose_gpu_memory_total_bytes",
                                 "GPU memory (NVML).",
                                 prometheus::MetricType::Gauge,
                                 {}};
  for (const auto& [backend, handle] : handles_) {
    prometheus::ClientMetric metric;
    metric.label = {{"backend", backend}};
    Api::Utilization rates{};
    if (api_->utilization_rates(handle, &rates) == 0) {
      metric.gauge.value = rates.gpu / 100.0;
      utilization.metric.push_back(metric);
    }
    Api::Memory memory{};
    if (api_->memory_info(handle, &memory) == 0) {
      metric.gauge.value = static_cast<double>(memory.used);
      used.metric.push_back(metric);
      metric.gauge.value = static_cast<double>(memory.total);
      total.metric.push_back(metric);
    }
  }
  return {utilization, used, total};
}

}  // namespace transpose
