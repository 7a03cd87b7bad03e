// GPU utilisation and memory as NVML (the driver's libnvidia-ml) reports them,
// read at each scrape. Loaded at run time: where the driver has no NVML the
// server runs without these gauges.
#ifndef TRANSPOSE_SERVER_NVML_COLLECTOR_H_
#define TRANSPOSE_SERVER_NVML_COLLECTOR_H_

#include <memory>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace transpose {

class NvmlCollector final : public prometheus::Collectable {
 public:
  struct Device {
    std::string backend;     // "cuda:N", the label value.
    std::string pci_bus_id;  // As CUDA reports it, e.g. "0000:3B:00.0".
  };

  // nullptr when NVML cannot be loaded or initialised, or knows none of
  // `devices`.
  static std::unique_ptr<NvmlCollector> Create(
      const std::vector<Device>& devices);
  ~NvmlCollector() override;

  // transpose_gpu_utilization_ratio, transpose_gpu_memory_used_bytes and
  // transpose_gpu_memory_total_bytes, one series per device.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct Api;
  NvmlCollector(std::unique_ptr<Api> api,
                std::vector<std::pair<std::string, void*>> handles);

  std::unique_ptr<Api> api_;
  // Backend label and NVML device handle.
  std::vector<std::pair<std::string, void*>> handles_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_NVML_COLLECTOR_H_
