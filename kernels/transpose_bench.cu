// transpose_bench: every GPU transpose kernel next to cudaMemcpy
// device-to-device of the same bytes, in one run. For each case it prints GB/s
// ((bytes read + bytes written) / time, median of --reps timed runs after
// warm-up, CUDA events; each run from an L2 holding none of its data, its
// launch queued before its start is stamped) and the fraction of the memcpy
// figure: memcpy, the classic kernels, the production kernels AUTO chooses
// from, cuBLAS geam (4- and 8-byte, loaded at run time if the machine has it)
// and AUTO, then AUTO's kernel under each tuning. Every result is spot-checked
// on the device. A Markdown table goes to stdout, the figures as JSON to
// --json. --case=TEXT runs only the cases whose label ("8B 16384^2") contains
// TEXT; --shape=SIZE:ROWSxCOLS (or SIZE:BATCHxROWSxCOLS, SIZE in bytes), as
// often as wanted, runs those shapes instead of the built-in cases. Exits 1
// when a result is wrong or a launch that should run fails ("n/a" marks a
// kernel that does not take the case), 2 for a usage mistake.
//
//   transpose_bench [--json=FILE] [--reps=25] [--quick] [--case=TEXT]
//                   [--shape=4:12345x6789 ...]
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/gpu_launch.h"
#include "kernels/gpu_transpose.h"
#include "kernels/transpose_args.h"

namespace transpose::kernels {
namespace {

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

// Counts positions (sampled) where out is not the transpose of in.
__global__ void CountMismatches(const uint8_t* in, const uint8_t* out,
                                uint64_t batch, uint64_t rows, uint64_t cols,
                                int size, uint64_t samples,
                                unsigned long long* mismatches) {
  const uint64_t total = batch * rows * cols;
  for (uint64_t s = blockIdx.x * blockDim.x + threadIdx.x; s < samples;
       s += gridDim.x * blockDim.x) {
    uint64_t x = (s + 1) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    const uint64_t e =
        (s < 64 ? s * (total / 64) + s % 7 : x) % total;  // Spread + random.
    const uint64_t b = e / (rows * cols), r = e / cols % rows, c = e % cols;
    const uint8_t* a = in + e * size;
    const uint8_t* t = out + ((b * cols + c) * rows + r) * size;
    for (int k = 0; k < size; ++k) {
      if (a[k] != t[k]) {
        atomicAdd(mismatches, 1ull);
        break;
      }
    }
  }
}

// Keeps the device busy for `ns` while the host queues a timed launch behind
// it, so that the start event is stamped when the launch can begin: host-side
// launch work (argument checks, cuBLAS's own code) stays out of the time.
__global__ void Spin(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// Reads `words` through L2, leaving it full of clean lines: the lines a timed
// run finds there cost it nothing to evict. (A memset would leave them dirty,
// and the run would pay for writing them back.)
__global__ void ReadThrough(const uint4* data, uint64_t words, uint32_t* sink) {
  uint32_t x = 0;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += gridDim.x * blockDim.x) {
    const uint4 v = data[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9E3779B9u) *sink = x;  // Keeps the loads; almost never stores.
}

__global__ void Fill(uint32_t* data, uint64_t words, uint32_t seed) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += gridDim.x * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u + seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    // Finite as float32 and float64 (exponent bits pinned near 1.0), so
    // cuBLAS's arithmetic (alpha * a + beta * b) returns every bit pattern
    // unchanged and can be checked bitwise.
    data[i] = (x & 0x807fffffu) | 0x3f000000u;
  }
}

// cuBLAS through dlopen, so the benchmark runs where the library is missing.
struct Cublas {
  using Create = cublasStatus_t (*)(cublasHandle_t*);
  using Sgeam = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t,
                                   cublasOperation_t, int, int, const float*,
                                   const float*, int, const float*,
                                   const float*, int, float*, int);
  using Dgeam = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t,
                                   cublasOperation_t, int, int, const double*,
                                   const double*, int, const double*,
                                   const double*, int, double*, int);
  cublasHandle_t handle = nullptr;
  Sgeam sgeam = nullptr;
  Dgeam dgeam = nullptr;

  Cublas() {
    void* lib = dlopen("libcublas.so.13", RTLD_NOW);
    if (lib == nullptr) lib = dlopen("libcublas.so", RTLD_NOW);
    if (lib == nullptr) return;
    auto create = reinterpret_cast<Create>(dlsym(lib, "cublasCreate_v2"));
    sgeam = reinterpret_cast<Sgeam>(dlsym(lib, "cublasSgeam"));
    dgeam = reinterpret_cast<Dgeam>(dlsym(lib, "cublasDgeam"));
    if (create == nullptr || create(&handle) != CUBLAS_STATUS_SUCCESS)
      handle = nullptr;
  }
  bool ok() const {
    return handle != nullptr && sgeam != nullptr && dgeam != nullptr;
  }
};

struct Case {
  std::string name;
  size_t size;
  uint64_t batch, rows, cols;

  // As tables and --case name it: "8B 16384^2".
  std::string label() const { return std::to_string(size) + "B " + name; }
};

constexpr const char* kNotApplicable = "n/a";

struct Result {
  std::string column;
  double gbps = 0;  // 0: not run.
  bool correct = true;
  std::string note;
};

int reps = 25;

// Read through before each timed run, so that every run starts from an L2
// holding none of its data, and none dirty: without it, cases up to about the
// L2's size read and wrote partly in cache (a 16 MiB memcpy ran at 5 TB/s,
// above the HBM's peak), and each run's output waited in L2 to be written
// back during the next.
struct L2Flush {
  void* scratch = nullptr;
  size_t bytes = 0;
  uint32_t* sink = nullptr;
};
L2Flush l2_flush;

// Median milliseconds of `launch` over `reps` runs after 3 warm-ups, each run
// from a cold L2 and stamped from when the device could start it. Each run
// starts from an L2 without the evict-last marks the runs before it left (an
// evict-last load's mark outlives its kernel, and a normal read-through evicts
// normal lines first, so marked input would stay for the next run).
float Time(const std::function<void()>& launch) {
  Check(cudaDeviceSynchronize(), "synchronize");
  Check(cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache");
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) launch();
  Check(cudaGetLastError(), "launch");
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    Check(cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache");
    ReadThrough<<<1024, 256>>>(static_cast<const uint4*>(l2_flush.scratch),
                               l2_flush.bytes / sizeof(uint4), l2_flush.sink);
    Spin<<<1, 1>>>(100 * 1000);
    Check(cudaEventRecord(start), "cudaEventRecord");
    launch();
    Check(cudaEventRecord(stop), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "timed launch");
    float t = 0;
    Check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  Check(cudaGetLastError(), "timed launches");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Parses --shape's value, "2:4097x4099" or "4:16x2048x2048", into a case
// named as the built-in ones are ("4097x4099", "16x(2048x2048)").
absl::StatusOr<Case> ParseShape(const char* text) {
  const auto malformed = [text] {
    return absl::InvalidArgumentError(
        std::string("--shape=") + text +
        ": expected SIZE:ROWSxCOLS or SIZE:BATCHxROWSxCOLS, e.g. 2:4097x4099");
  };
  std::vector<uint64_t> numbers;
  const char* p = text;
  while (true) {
    // Digits only: strtoull alone would take "-1" and " 7".
    if (*p < '0' || *p > '9') return malformed();
    char* end = nullptr;
    errno = 0;
    numbers.push_back(std::strtoull(p, &end, 10));
    if (errno != 0) return malformed();
    if (*end == '\0') break;
    if (*end != (numbers.size() == 1 ? ':' : 'x')) return malformed();
    p = end + 1;
  }
  if (numbers.size() != 3 && numbers.size() != 4) return malformed();
  if (numbers.size() == 3) numbers.insert(numbers.begin() + 1, 1);
  const TransposeArgs args{numbers[0], numbers[1], numbers[2], numbers[3]};
  if (const absl::Status shape = CheckShape(args); !shape.ok()) {
    return absl::InvalidArgumentError(std::string("--shape=") + text + ": " +
                                      std::string(shape.message()));
  }
  const std::string matrix =
      std::to_string(args.rows) + "x" + std::to_string(args.cols);
  return Case{args.batch == 1
                  ? matrix
                  : std::to_string(args.batch) + "x(" + matrix + ")",
              args.element_size, args.batch, args.rows, args.cols};
}

std::vector<Case> BuiltInCases(bool quick) {
  std::vector<Case> cases;
  for (uint64_t n : {4096, 8192, 16384}) {
    if (quick && n != 8192) continue;
    for (size_t size : {1, 2, 4, 8, 16}) {
      cases.push_back({std::to_string(n) + "^2", size, 1, n, n});
    }
  }
  // The other square shapes with 128 KiB rows (4 and 8 GiB each way): AUTO
  // walks groups of tile rows for 16-byte 8192², and these show why not for
  // smaller elements.
  if (!quick) {
    cases.push_back({"32768^2", 4, 1, 32768, 32768});
    cases.push_back({"65536^2", 2, 1, 65536, 65536});
  }
  // Odd shapes: rows start at every alignment. 4-byte is the target case; 8-
  // byte shows the skewed kernel beyond it (1- and 2-byte: at the end).
  for (size_t size : {4, 8}) {
    cases.push_back({"12345x6789", size, 1, 12345, 6789});
  }
  for (size_t size : {2, 4}) {
    cases.push_back({"4096x(64x64)", size, 4096, 64, 64});
    cases.push_back({"16x(2048x2048)", size, 16, 2048, 2048});
  }
  // Batches of odd matrices, small and middling: where AUTO switches from
  // whole matrices in shared memory to the padded tile, then to the skewed
  // kernel.
  for (uint64_t n : {63, 127, 255, 511}) {
    const uint64_t batch = (32 << 20) / (4 * n * (n + 2));
    cases.push_back({std::to_string(batch) + "x(" + std::to_string(n) + "x" +
                         std::to_string(n + 2) + ")",
                     4, batch, n, n + 2});
  }
  // Batches of small matrices that 32 x 32 tiles leave mostly partial, 32 MiB
  // each way: AUTO stages them whole in shared memory.
  const uint64_t tiny = (32 << 20) / (4 * 15 * 17);
  cases.push_back({std::to_string(tiny) + "x(15x17)", 4, tiny, 15, 17});
  for (size_t size : {1, 2, 8, 16}) {
    const uint64_t batch = (32 << 20) / (size * 31 * 33);
    cases.push_back({std::to_string(batch) + "x(31x33)", size, batch, 31, 33});
  }
  // Past 16 KiB a matrix, one per block: AUTO gives small_matrices 1-byte
  // ones up to 48 KiB and 2-byte ones up to 32 KiB not even both ways.
  cases.push_back({std::to_string((32 << 20) / (181 * 180)) + "x(181x180)", 1,
                   (32 << 20) / (181 * 180), 181, 180});
  cases.push_back({std::to_string((32 << 20) / (2 * 127 * 129)) + "x(127x129)",
                   2, (32 << 20) / (2 * 127 * 129), 127, 129});
  // The odd shape with 1- and 2-byte elements, which the skewed kernel moves
  // in words. Last, so that every case above allocates its buffers after the
  // same ones as before these were added: some figures depend on where
  // buffers land (docs/BENCHMARKS.md, attempt 31).
  for (size_t size : {1, 2}) {
    cases.push_back({"12345x6789", size, 1, 12345, 6789});
  }
  // Thin matrices, 4-byte N x 3 points and their 3 x N coordinates (an array
  // of structures to a structure of arrays and back): AUTO's thin kernel. Last,
  // for the same reason.
  cases.push_back({"10000001x3", 4, 1, 10000001, 3});
  cases.push_back({"3x10000001", 4, 1, 3, 10000001});
  return cases;
}

int Run(const char* json_path, std::vector<Case> cases, const char* only) {
  if (only != nullptr) {
    std::vector<Case> chosen;
    for (const Case& c : cases) {
      if (c.label().find(only) != std::string::npos) chosen.push_back(c);
    }
    if (chosen.empty()) {
      std::fprintf(stderr, "--case=%s matches no case\n", only);
      return 2;
    }
    cases = chosen;
  }

  // Opened now, so that a path that cannot be written fails before the run
  // rather than after it; without truncating it, so that a run that fails
  // leaves an earlier run's figures as they were.
  FILE* json_file = nullptr;
  if (json_path != nullptr) {
    json_file = std::fopen(json_path, "a");
    if (json_file == nullptr) {
      std::fprintf(stderr, "--json=%s: %s\n", json_path, std::strerror(errno));
      return 2;
    }
  }

  Cublas cublas;
  cudaDeviceProp properties;
  Check(cudaGetDeviceProperties(&properties, 0), "properties");
  l2_flush.bytes = 2 * static_cast<size_t>(properties.l2CacheSize);
  Check(cudaMalloc(&l2_flush.scratch, l2_flush.bytes), "malloc L2 flush");
  Check(cudaMemset(l2_flush.scratch, 0, l2_flush.bytes), "memset L2 flush");
  Check(cudaMalloc(&l2_flush.sink, sizeof(uint32_t)), "malloc L2 flush");
  std::printf(
      "transpose_bench on %s (%d SMs, %.0f MB L2), median of %d runs, each "
      "from an L2 holding none of its data; GB/s = (read + written) / time; %% "
      "= of cudaMemcpy D2D "
      "of the same bytes\n\n",
      properties.name, properties.multiProcessorCount,
      properties.l2CacheSize / 1e6, reps);
  // The order results are measured in: memcpy, each kernel, cuBLAS, AUTO.
  std::vector<std::string> columns = {"memcpy"};
  for (internal::Kernel kernel : internal::kAllKernels) {
    columns.push_back(internal::KernelNameOf(kernel));
  }
  columns.push_back("cublas_geam");
  columns.push_back("AUTO");
  // AUTO's kernel under each tuning, where it takes one.
  for (const internal::Tuning& tuning : internal::kAllTunings) {
    columns.push_back(internal::TuningNameOf(tuning));
  }
  std::printf("| case | bytes |");
  for (const std::string& c : columns) std::printf(" %s |", c.c_str());
  std::printf(" AUTO picks |\n|---|---|");
  for (size_t i = 0; i < columns.size(); ++i) std::printf("---|");
  std::printf("---|\n");

  std::string json = "[\n";
  int failures = 0;
  unsigned long long* mismatches;
  Check(cudaMalloc(&mismatches, sizeof(unsigned long long)), "malloc");
  for (const Case& c : cases) {
    const uint64_t bytes = c.batch * c.rows * c.cols * c.size;
    size_t free_bytes = 0, total_bytes = 0;
    Check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    if (free_bytes < 2 * bytes + (uint64_t{1} << 30)) {
      std::printf("| %s | %.0f MiB | skipped: %.1f GiB free on the device |\n",
                  c.label().c_str(), bytes / 1048576.0,
                  free_bytes / 1073741824.0);
      char skipped[200];
      std::snprintf(skipped, sizeof(skipped),
                    "  {\"case\": \"%s\", \"element_size\": %d, "
                    "\"skipped\": \"%.1f GiB free on the device\"}",
                    c.name.c_str(), static_cast<int>(c.size),
                    free_bytes / 1073741824.0);
      json += std::string(json.size() > 2 ? ",\n" : "") + skipped;
      continue;
    }
    uint8_t *in, *out;
    Check(cudaMalloc(&in, bytes), "malloc in");
    Check(cudaMalloc(&out, bytes), "malloc out");
    Fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(in), bytes / 4, 12345);
    Check(cudaGetLastError(), "Fill");
    const TransposeArgs args{c.size, c.batch, c.rows, c.cols, in, out};

    std::vector<Result> results;
    const float memcpy_ms = Time([&] {
      Check(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice),
            "cudaMemcpyAsync");
    });
    results.push_back({"memcpy", 2.0 * bytes / memcpy_ms / 1e6, true, ""});

    // `launch` returns "" once it has launched, kNotApplicable where the
    // kernel does not take the case, or what went wrong.
    auto measure = [&](const std::string& column,
                       const std::function<std::string()>& launch) {
      Result result{column};
      Check(cudaMemset(out, 0xA5, bytes), "poison");
      if (const std::string error = launch(); !error.empty()) {
        cudaGetLastError();
        result.note = error;
        if (error != kNotApplicable) {
          result.correct = false;
          ++failures;
        }
        results.push_back(result);
        return;
      }
      const float ms = Time([&] {
        if (const std::string error = launch(); !error.empty()) {
          std::fprintf(stderr, "%s: %s\n", column.c_str(), error.c_str());
          std::exit(1);
        }
      });
      result.gbps = 2.0 * bytes / ms / 1e6;
      Check(cudaMemset(out, 0xA5, bytes), "poison");
      if (const std::string error = launch(); !error.empty()) {
        std::fprintf(stderr, "%s: %s\n", column.c_str(), error.c_str());
        std::exit(1);
      }
      Check(cudaMemset(mismatches, 0, sizeof(unsigned long long)), "memset");
      CountMismatches<<<256, 256>>>(in, out, c.batch, c.rows, c.cols,
                                    static_cast<int>(c.size), 1 << 20,
                                    mismatches);
      Check(cudaGetLastError(), "CountMismatches");
      unsigned long long wrong = 0;
      Check(
          cudaMemcpy(&wrong, mismatches, sizeof(wrong), cudaMemcpyDeviceToHost),
          "CountMismatches");
      result.correct = wrong == 0;
      if (!result.correct) ++failures;
      results.push_back(result);
    };
    const auto launched = [](cudaError_t error) -> std::string {
      if (error == cudaSuccess) return "";
      // What Launch answers for a case the kernel does not take.
      if (error == cudaErrorInvalidValue) return kNotApplicable;
      return cudaGetErrorName(error);
    };
    for (internal::Kernel kernel : internal::kAllKernels) {
      measure(internal::KernelNameOf(kernel), [&, kernel] {
        if (internal::SharedMemoryBytes(kernel, c.size) >
            properties.sharedMemPerBlockOptin) {
          return std::string(kNotApplicable);
        }
        return launched(
            static_cast<cudaError_t>(internal::Launch(kernel, args, nullptr)));
      });
    }
    measure("cublas_geam", [&]() -> std::string {
      if (!cublas.ok() || c.batch != 1 || (c.size != 4 && c.size != 8))
        return kNotApplicable;
      const int m = static_cast<int>(c.rows), n = static_cast<int>(c.cols);
      cublasStatus_t status;
      if (c.size == 4) {
        const float one = 1, zero = 0;
        status = cublas.sgeam(cublas.handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n,
                              &one, reinterpret_cast<const float*>(in), n,
                              &zero, reinterpret_cast<const float*>(out), m,
                              reinterpret_cast<float*>(out), m);
      } else {
        const double one = 1, zero = 0;
        status = cublas.dgeam(cublas.handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n,
                              &one, reinterpret_cast<const double*>(in), n,
                              &zero, reinterpret_cast<const double*>(out), m,
                              reinterpret_cast<double*>(out), m);
      }
      return status == CUBLAS_STATUS_SUCCESS
                 ? ""
                 : "cuBLAS status " + std::to_string(status);
    });
    // AUTO takes every case.
    measure("AUTO", [&] {
      const absl::Status status =
          LaunchTranspose(Algorithm::kAuto, args, nullptr);
      return status.ok() ? std::string() : status.ToString();
    });
    const internal::Kernel auto_kernel = internal::AutoKernel(args);
    const std::string kernel_name = internal::KernelNameOf(auto_kernel);
    for (const internal::Tuning& tuning : internal::kAllTunings) {
      measure(internal::TuningNameOf(tuning), [&, tuning] {
        if (!internal::SupportsTuning(auto_kernel))
          return std::string(kNotApplicable);
        return launched(static_cast<cudaError_t>(
            internal::Launch(auto_kernel, args, nullptr, tuning)));
      });
    }
    const internal::Tuning auto_tuning =
        internal::AutoTuning(auto_kernel, args);
    const std::string picked =
        auto_tuning == internal::Tuning{}
            ? kernel_name
            : kernel_name + " (" + internal::TuningNameOf(auto_tuning) + ")";

    const double memcpy_gbps = results.front().gbps;
    std::printf("| %s | %.0f MiB |", c.label().c_str(), bytes / 1048576.0);
    std::string fields;
    for (const Result& r : results) {
      if (r.gbps == 0) {
        std::printf(" %s%s |", r.note.empty() ? "–" : r.note.c_str(),
                    r.correct ? "" : " FAILED");
      } else if (r.column == "memcpy") {
        std::printf(" %.0f |", r.gbps);
      } else {
        std::printf(" %.0f (%.1f%%)%s |", r.gbps, 100 * r.gbps / memcpy_gbps,
                    r.correct ? "" : " WRONG");
      }
      char field[160];
      if (r.gbps == 0) {
        // Not run: no figure, only why (CUDA's, cuBLAS's or absl's error
        // text, its quotes and backslashes dropped to keep the JSON valid).
        std::string why;
        for (char ch : r.note) {
          if (ch != '"' && ch != '\\' && ch >= ' ') why += ch;
        }
        std::snprintf(field, sizeof(field),
                      "%s\"%s\": {\"not_run\": ", fields.empty() ? "" : ", ",
                      r.column.c_str());
        fields += std::string(field) + "\"" + why +
                  "\", \"correct\": " + (r.correct ? "true" : "false") + "}";
      } else {
        std::snprintf(field, sizeof(field),
                      "%s\"%s\": {\"gbps\": %.1f, \"of_memcpy\": %.4f, "
                      "\"correct\": %s}",
                      fields.empty() ? "" : ", ", r.column.c_str(), r.gbps,
                      r.gbps / memcpy_gbps, r.correct ? "true" : "false");
        fields += field;
      }
    }
    std::printf(" %s |\n", picked.c_str());
    std::fflush(stdout);
    char head[200];
    std::snprintf(head, sizeof(head),
                  "  {\"case\": \"%s\", \"element_size\": %d, \"batch\": %llu, "
                  "\"rows\": %llu, "
                  "\"cols\": %llu, \"auto_kernel\": \"%s\", ",
                  c.name.c_str(), static_cast<int>(c.size),
                  static_cast<unsigned long long>(c.batch),
                  static_cast<unsigned long long>(c.rows),
                  static_cast<unsigned long long>(c.cols), picked.c_str());
    json += std::string(json.size() > 2 ? ",\n" : "") + head + fields + "}";
    Check(cudaFree(in), "free in");
    Check(cudaFree(out), "free out");
  }
  Check(cudaFree(mismatches), "free");
  Check(cudaFree(l2_flush.scratch), "free");
  Check(cudaFree(l2_flush.sink), "free");
  json += "\n]\n";
  if (json_file != nullptr) {
    json_file = std::freopen(json_path, "w", json_file);
    if (json_file == nullptr || std::fputs(json.c_str(), json_file) < 0 ||
        std::fclose(json_file) != 0) {
      std::fprintf(stderr, "--json=%s: %s\n", json_path, std::strerror(errno));
      return 1;
    }
  }
  if (failures > 0) {
    std::fprintf(stderr, "%d result%s wrong or failed (marked in the table)\n",
                 failures, failures == 1 ? "" : "s");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace transpose::kernels

int main(int argc, char** argv) {
  const char* json = nullptr;
  bool quick = false;
  const char* only = nullptr;
  std::vector<transpose::kernels::Case> shapes;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    char* end = nullptr;
    if (std::strncmp(arg, "--case=", 7) == 0) {
      only = arg + 7;
    } else if (std::strncmp(arg, "--json=", 7) == 0 && arg[7] != '\0') {
      json = arg + 7;
    } else if (std::strncmp(arg, "--reps=", 7) == 0) {
      const long value = std::strtol(arg + 7, &end, 10);
      if (end == arg + 7 || *end != '\0' || value < 1 || value > 100000) {
        std::fprintf(stderr, "%s: expected 1 to 100000 runs\n", arg);
        return 2;
      }
      transpose::kernels::reps = static_cast<int>(value);
    } else if (std::strcmp(arg, "--quick") == 0) {
      quick = true;
    } else if (std::strncmp(arg, "--shape=", 8) == 0) {
      absl::StatusOr<transpose::kernels::Case> shape =
          transpose::kernels::ParseShape(arg + 8);
      if (!shape.ok()) {
        std::fprintf(stderr, "%s\n",
                     std::string(shape.status().message()).c_str());
        return 2;
      }
      shapes.push_back(*std::move(shape));
    } else {
      std::fprintf(stderr,
                   "unknown argument '%s'\nusage: transpose_bench "
                   "[--json=FILE] [--reps=25] [--quick] [--case=TEXT] "
                   "[--shape=SIZE:[BATCHx]ROWSxCOLS ...]\n",
                   arg);
      return 2;
    }
  }
  if (!shapes.empty() && quick) {
    std::fprintf(stderr,
                 "--quick picks among the built-in cases; --shape "
                 "replaces them\n");
    return 2;
  }
  return transpose::kernels::Run(
      json, shapes.empty() ? transpose::kernels::BuiltInCases(quick) : shapes,
      only);
}
