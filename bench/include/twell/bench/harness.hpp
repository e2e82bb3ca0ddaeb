// The device side of the benchmarks (cuda builds only): timing with CUDA events and an L2
// flush between runs, device facts, NVML energy, measured ceilings, and the suites.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <twell/bench/json.hpp>
#include <twell/bench/results.hpp>
#include <twell/formats/dense.hpp>
#include <twell/memory.hpp>

namespace twell::bench {

// Total energy the GPU has used since the driver loaded, read through NVML when the driver's
// library can be opened at run time (so no build depends on nvml.h); unavailable otherwise.
class EnergyMeter {
 public:
  explicit EnergyMeter(int device);
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  bool available() const { return available_; }
  const std::string& why_unavailable() const { return why_; }
  std::optional<double> joules() const;
  // Driver version and current SM / memory clocks (MHz), as read; empty when unavailable.
  Json facts() const;

 private:
  struct Api;
  std::unique_ptr<Api> api_;
  void* device_ = nullptr;
  bool available_ = false;
  std::string why_;
};

class Harness {
 public:
  explicit Harness(const Config& config);
  ~Harness();
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  const Config& config() const { return config_; }
  // Bytes of the L2 flush written before each timed run.
  std::size_t flush_bytes() const { return flush_bytes_; }
  Stream stream() const { return stream_; }

  // Warm-up runs, then config.reps timed runs of op, each preceded (outside its events) by a
  // write of a buffer twice the size of L2, so no run reads its inputs from the cache.
  // op must queue its work on stream(); host work inside op counts when the GPU waits for it.
  // reps > 0 overrides config.reps (a quick pre-selection among algorithms, never a result).
  Timing time(const std::function<void()>& op, int reps = 0);
  // Joules per run of op, over back-to-back runs lasting at least min_seconds (no flush);
  // empty when NVML energy is unavailable.
  std::optional<double> joules_per_run(const std::function<void()>& op, double min_seconds);

  Json device_info() const;
  // The Ceilings, measured once per run (bench/cuda/ceilings.cu): device-to-device copy bandwidth
  // (bytes read plus written), cuBLAS bf16 GEMM rate at 8192^3 on random data, and three probe
  // kernels (shared-memory loads, L2 loads, fp32 FMAs), each checked against the result the host
  // predicts. Returns how each was measured; ceilings() holds the rates.
  Json measure_ceilings();
  const Ceilings& ceilings() const { return ceilings_; }

  // Queues random values uniform in [-scale, scale] into device memory (for dense operands
  // whose values do not matter to the pattern; never zeros, DESIGN.md / METHOD.md).
  template <class T>
  void fill_random(T* data, std::size_t n, float scale, std::uint64_t seed);

  // Row-major bf16 C = A B through cublasGemmEx (fp32 accumulation) on stream(): the plain
  // dense product a user would call, used as the dense baseline and for the GEMM ceiling.
  // With a_transposed, C = A^T B for the row-major A as stored (training's weight-gradient shape).
  void gemm(DenseView<const bf16> a, DenseView<const bf16> b, DenseView<bf16> c, bool a_transposed = false);

 private:
  Config config_;
  Stream stream_{};
  int device_ = 0;
  std::size_t l2_bytes_ = 0;
  void* flush_ = nullptr;
  std::size_t flush_bytes_ = 0;
  int flush_value_ = 0;
  std::unique_ptr<EnergyMeter> energy_;
  void* cublas_ = nullptr;
  Ceilings ceilings_;
};

// Each suite appends its cases to the report; a failure inside one case becomes that case's
// status and the suite goes on.
void run_convert(Harness& h, Report& report);
void run_spmm(Harness& h, Report& report);
void run_sddmm(Harness& h, Report& report);
void run_gemm_to_sparse(Harness& h, Report& report);
void run_ffn(Harness& h, Report& report);
void run_training(Harness& h, Report& report);

// Device info, ceilings, then the selected suites, each timed; errors outside a case become
// the suite's status.
Report run_suites(const Config& config);

}  // namespace twell::bench
