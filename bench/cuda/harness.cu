#include <twell/bench/harness.hpp>
#include <twell/bench/timeline.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <twell/error.hpp>
#include <twell/types.hpp>

#include "cuda_check.hpp"

namespace twell::bench {

namespace {

// Counter-based hash so every element is independent of launch geometry.
__device__ inline float hashed_uniform(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 0x1p-24f * 2.0f - 1.0f;  // [-1, 1)
}

// Grid-stride fill: each thread owns elements i, i + stride, ...; no preconditions on n.
template <class T>
__global__ void fill_random_kernel(T* data, std::size_t n, float scale, std::uint64_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    data[i] = ValueTraits<T>::from_float(scale * hashed_uniform(seed, i));
}

// A pair of events per run, so runs are queued back to back and read after one synchronisation.
class EventPairs {
 public:
  explicit EventPairs(int n) : start_(static_cast<std::size_t>(n)), stop_(static_cast<std::size_t>(n)) {
    for (int i = 0; i < n; ++i) {
      check(cudaEventCreate(&start_[static_cast<std::size_t>(i)]), "twell bench (cudaEventCreate)");
      check(cudaEventCreate(&stop_[static_cast<std::size_t>(i)]), "twell bench (cudaEventCreate)");
    }
  }
  ~EventPairs() {
    for (auto e : start_) cudaEventDestroy(e);
    for (auto e : stop_) cudaEventDestroy(e);
  }
  EventPairs(const EventPairs&) = delete;
  EventPairs& operator=(const EventPairs&) = delete;
  cudaEvent_t start(int i) { return start_[static_cast<std::size_t>(i)]; }
  cudaEvent_t stop(int i) { return stop_[static_cast<std::size_t>(i)]; }

 private:
  std::vector<cudaEvent_t> start_, stop_;
};

// nvidia-smi's form of a GPU's UUID ("GPU-" and 32 hex digits in groups of 8-4-4-4-12), so that
// reports from different sessions tell whether they ran on the same card of a lent pool.
std::string uuid_string(const cudaUUID_t& uuid) {
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    s += hex;
  }
  return s;
}

}  // namespace

Harness::Harness(const Config& config) : config_(config) {
  check(cudaGetDevice(&device_), "twell bench (cudaGetDevice)");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "twell bench (cudaStreamCreate)");
  stream_.handle = s;
  int l2 = 0;
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_), "twell bench (L2 size)");
  l2_bytes_ = static_cast<std::size_t>(l2);
  flush_bytes_ = std::max<std::size_t>(2 * l2_bytes_, std::size_t{64} << 20);
  check(cudaMalloc(&flush_, flush_bytes_), "twell bench (cudaMalloc flush buffer)");
  energy_ = std::make_unique<EnergyMeter>(device_);
  cublasHandle_t handle = nullptr;
  check(cublasCreate(&handle), "twell bench (cublasCreate)");
  cublas_ = handle;
  check(cublasSetStream(handle, s), "twell bench (cublasSetStream)");
}

Harness::~Harness() {
  cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  cudaFree(flush_);
  cudaStreamDestroy(native(stream_));
}

template <class T>
void Harness::fill_random(T* data, std::size_t n, float scale, std::uint64_t seed) {
  if (n == 0) return;
  fill_random_kernel<T><<<1024, 256, 0, native(stream_)>>>(data, n, scale, seed);
  check(cudaGetLastError(), "twell bench (fill_random launch)");
}
template void Harness::fill_random<bf16>(bf16*, std::size_t, float, std::uint64_t);
template void Harness::fill_random<fp16>(fp16*, std::size_t, float, std::uint64_t);
template void Harness::fill_random<float>(float*, std::size_t, float, std::uint64_t);

void Harness::gemm(DenseView<const bf16> a, DenseView<const bf16> b, DenseView<bf16> c, bool a_transposed) {
  const std::int64_t a_rows = a_transposed ? a.cols : a.rows, a_cols = a_transposed ? a.rows : a.cols;
  require(a_cols == b.rows && c.rows == a_rows && c.cols == b.cols, ErrorCode::shape_mismatch, "twell bench gemm",
          a_transposed ? "A^T " : "A ", a_rows, " x ", a_cols, ", B ", b.rows, " x ", b.cols, ", C ", c.rows, " x ",
          c.cols);
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major C = op(A) B is column-major C^T = B^T op(A)^T: swap the operands; the column-major
  // view of a row-major A is A^T, so op(A) = A^T takes cuBLAS's transpose on it.
  check(cublasGemmEx(static_cast<cublasHandle_t>(cublas_), CUBLAS_OP_N, a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
                     static_cast<int>(c.cols), static_cast<int>(c.rows), static_cast<int>(a_cols), &alpha, b.data,
                     CUDA_R_16BF, static_cast<int>(b.ld), a.data, CUDA_R_16BF, static_cast<int>(a.ld), &beta, c.data,
                     CUDA_R_16BF, static_cast<int>(c.ld), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "twell bench (cublasGemmEx)");
}

Timing Harness::time(const std::function<void()>& op, int reps_override) {
  const cudaStream_t s = native(stream_);
  for (int i = 0; i < std::max(config_.warmup, 1); ++i) op();
  check(cudaStreamSynchronize(s), "twell bench (warm-up)");
  check(cudaGetLastError(), "twell bench (warm-up)");
  const int reps = std::max(reps_override > 0 ? reps_override : config_.reps, 1);
  EventPairs events(reps);
  timeline::runs_begin();
  for (int i = 0; i < reps; ++i) {
    // A different byte each time, so no layer of the memory system can skip the write.
    flush_value_ = (flush_value_ + 1) & 0xff;
    check(cudaMemsetAsync(flush_, flush_value_, flush_bytes_, s), "twell bench (L2 flush)");
    check(cudaEventRecord(events.start(i), s), "twell bench (cudaEventRecord)");
    op();
    check(cudaEventRecord(events.stop(i), s), "twell bench (cudaEventRecord)");
  }
  check(cudaStreamSynchronize(s), "twell bench (timed runs)");
  timeline::runs_end();
  check(cudaGetLastError(), "twell bench (timed runs)");
  std::vector<float> ms(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i)
    check(cudaEventElapsedTime(&ms[static_cast<std::size_t>(i)], events.start(i), events.stop(i)),
          "twell bench (cudaEventElapsedTime)");
  return summarize(std::move(ms));
}

std::optional<double> Harness::joules_per_run(const std::function<void()>& op, double min_seconds) {
  if (!energy_->available()) return std::nullopt;
  const cudaStream_t s = native(stream_);
  op();
  check(cudaStreamSynchronize(s), "twell bench (energy warm-up)");
  const auto before = energy_->joules();
  const auto t0 = std::chrono::steady_clock::now();
  long runs = 0;
  // Batches of runs between host checks of the clock, so the GPU never idles on the host.
  int batch = 1;
  for (;;) {
    for (int i = 0; i < batch; ++i) op();
    runs += batch;
    check(cudaStreamSynchronize(s), "twell bench (energy runs)");
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (elapsed >= min_seconds) break;
    batch = std::min(batch * 2, 1024);
  }
  const auto after = energy_->joules();
  if (!before || !after || runs == 0) return std::nullopt;
  return (*after - *before) / static_cast<double>(runs);
}

Json Harness::device_info() const {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device_), "twell bench (cudaGetDeviceProperties)");
  int driver = 0, runtime = 0, clock_khz = 0, mem_clock_khz = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device_);
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, device_);
  Json j = Json::object();
  j["name"] = std::string(prop.name);
  j["uuid"] = uuid_string(prop.uuid);
  j["compute_capability"] = std::to_string(prop.major) + "." + std::to_string(prop.minor);
  j["sm_count"] = prop.multiProcessorCount;
  j["l2_bytes"] = static_cast<std::int64_t>(l2_bytes_);
  j["memory_bytes"] = static_cast<std::int64_t>(prop.totalGlobalMem);
  j["memory_bus_bits"] = prop.memoryBusWidth;
  j["cuda_driver_api"] = driver;
  j["cuda_runtime"] = runtime;
  j["max_sm_clock_mhz"] = clock_khz / 1000;
  j["max_memory_clock_mhz"] = mem_clock_khz / 1000;
  j["l2_flush_bytes"] = static_cast<std::int64_t>(flush_bytes_);
  Json nvml = energy_->facts();
  j["nvml"] = nvml;
  j["energy"] = energy_->available() ? std::string("nvmlDeviceGetTotalEnergyConsumption")
                                     : "unavailable: " + energy_->why_unavailable();
  return j;
}

}  // namespace twell::bench
