// The ceilings of `twell bench` (Harness::measure_ceilings): device copy bandwidth, the cuBLAS
// GEMM rate, and the on-chip rates, shared-memory loads, L2 loads and fp32 FMAs, each of those
// from a kernel that does nothing else, at full occupancy on every SM. Every load or FMA feeds a
// result the host predicts, so a run that was skipped or computed wrongly fails the measurement.
// That check cannot see a load the compiler merged with another of the same address (the value is
// the same); what prevents that is in the kernels (load_shared's comment). The floors of
// docs/benchmarks/README.md divide the sparse kernels' least work by these rates (set_floor).
#include <twell/bench/harness.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>

#include "cuda_check.hpp"

namespace twell::bench {

namespace {

constexpr int kThreads = 1024;
constexpr int kCtasPerSm = 2;        // 2048 threads: every thread slot of an sm_80+ SM (32 registers each)
constexpr int kSharedPieces = 2048;  // 16-byte pieces: 32 KB a CTA, so two CTAs fill an SM's threads
constexpr int kLoadsPerRound = 8;    // loads each thread has in flight
constexpr int kL2PiecesPerThread = 4;
constexpr int kFmaChains = 8;  // independent FMA chains per thread, to cover the FMA latency
static_assert((kLoadsPerRound * kThreads) % kSharedPieces == 0, "a round reads the pieces a whole number of times");
static_assert(kSharedPieces % (kLoadsPerRound * 32) == 0, "a round's loads start a whole number of warps apart");

__device__ __forceinline__ unsigned sum_words(uint4 v) { return v.x + v.y + v.z + v.w; }

// ptxas hoists or merges loads of an address it has seen (asm volatile binds only the compiler
// front end; a first version measured 129 TB/s of "shared loads" that way). So no two loads of a
// thread in one round or pass share an address, the addresses move with the round or pass, and
// shared loads are also PTX-volatile.
__device__ __forceinline__ uint4 load_shared(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(p))));
  return v;
}
__device__ __forceinline__ uint4 load_l2(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// A CTA fills kSharedPieces pieces with their word indices; then each thread, per round, loads
// kLoadsPerRound pieces kSharedPieces / kLoadsPerRound apart, a warp's lanes 32 consecutive ones
// (512 bytes: four wavefronts, no bank conflict), the whole set shifted by a warp's width each
// round, and adds up their words (a thread's sum stays below 2^32 for rounds < 2^14). The
// threads' sums meet in *sum.
__global__ void __launch_bounds__(kThreads, kCtasPerSm) shared_load_kernel(int rounds, unsigned long long* sum) {
  static_assert((kSharedPieces & (kSharedPieces - 1)) == 0, "the index wraps by a mask");
  __shared__ uint4 pieces[kSharedPieces];
  for (int i = threadIdx.x; i < kSharedPieces; i += kThreads) {
    const unsigned w = 4u * static_cast<unsigned>(i);
    pieces[i] = make_uint4(w, w + 1, w + 2, w + 3);
  }
  __syncthreads();
  unsigned s = 0;
  for (int r = 0; r < rounds; ++r) {
    const int first = r * 32 + static_cast<int>(threadIdx.x);
#pragma unroll
    for (int u = 0; u < kLoadsPerRound; ++u)
      s += sum_words(load_shared(&pieces[(first + u * (kSharedPieces / kLoadsPerRound)) & (kSharedPieces - 1)]));
  }
  atomicAdd(sum, static_cast<unsigned long long>(s));
}

// Per pass, each thread loads kL2PiecesPerThread pieces a grid apart, L1 bypassed, and adds up
// their words into *sum; the grid covers the buffer once a pass, rotated by a CTA's width each
// pass. The buffer fits in L2, so only a run's first pass reads DRAM (the harness
// flushes L2 before each run).
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    l2_load_kernel(const uint4* data, int passes, unsigned long long* sum) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * kThreads;
  const std::size_t pieces = stride * kL2PiecesPerThread;
  const std::size_t mine = blockIdx.x * static_cast<std::size_t>(kThreads) + threadIdx.x;
  std::size_t rotation = 0;
  unsigned long long s = 0;
  for (int pass = 0; pass < passes; ++pass) {
#pragma unroll
    for (int j = 0; j < kL2PiecesPerThread; ++j) {
      std::size_t i = mine + j * stride + rotation;
      if (i >= pieces) i -= pieces;
      s += sum_words(load_l2(data + i));
    }
    rotation += kThreads;
    if (rotation >= pieces) rotation -= pieces;
  }
  atomicAdd(sum, s);
}

__global__ void iota_kernel(unsigned* words, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    words[i] = static_cast<unsigned>(i);
}

// kFmaChains independent chains x <- x a + b per thread, `steps` long, chain c starting at c.
// A thread whose sum of the chains differs from the host's (fma rounds exactly once on both)
// counts itself in *mismatches. With a = 0.9999 the chains are still e^(-steps / 10^4) of their
// start away from their limit, so a skipped step changes the sum while steps is well below 10^5.
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    fma_kernel(int steps, float a, float b, float expected, unsigned long long* mismatches) {
  float x[kFmaChains];
#pragma unroll
  for (int c = 0; c < kFmaChains; ++c) x[c] = static_cast<float>(c);
#pragma unroll 16
  for (int i = 0; i < steps; ++i) {
#pragma unroll
    for (int c = 0; c < kFmaChains; ++c) x[c] = fmaf(x[c], a, b);
  }
  float s = 0;
#pragma unroll
  for (int c = 0; c < kFmaChains; ++c) s += x[c];
  if (s != expected) atomicAdd(mismatches, 1ull);
}

// Sum of the words 0 .. n - 1.
std::uint64_t sum_of_indices(std::uint64_t n) { return n * (n - 1) / 2; }

// CTAs of kThreads threads that fit on the device at once.
template <class Kernel>
int full_grid(Kernel kernel, int device) {
  int per_sm = 0, sms = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0), "twell bench (occupancy)");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "twell bench (SM count)");
  return std::max(per_sm, 1) * sms;
}

// The counter a probe's kernel adds into (mod 2^64), zeroed on the stream; value() after the runs.
class Counter {
 public:
  explicit Counter(cudaStream_t s) : d_(1, MemorySpace::device, Uninitialized{}) {
    check(cudaMemsetAsync(d_.data(), 0, sizeof(unsigned long long), s), "twell bench (ceiling counter)");
  }
  unsigned long long* data() { return d_.data(); }
  std::uint64_t value() const { return d_.copy_to(MemorySpace::host).host_span()[0]; }

 private:
  Buffer<unsigned long long> d_;
};

void expect(std::uint64_t got, std::uint64_t want, const char* what) {
  require(got == want, ErrorCode::cuda, "twell bench (ceilings)", what, ": got ", got, ", the host predicts ", want,
          ": the probe skipped work or computed wrongly");
}

// How one ceiling was measured, for the report's `ceilings`.
Json record(const Timing& t, const char* rate_key, double rate, const char* counts) {
  Json j = Json::object();
  j["median_ms"] = t.median_ms;
  j[rate_key] = rate;
  j["counts"] = counts;
  return j;
}

}  // namespace

Json Harness::measure_ceilings() {
  const cudaStream_t s = native(stream_);
  const bool quick = config_.quick;
  Json j = Json::object();
  // Each ceiling on its own: one that fails is recorded as failed with its rate left 0 (so the
  // floors that need it say so), and the others are still measured.
  auto measure = [&j](const char* name, const std::function<Json()>& probe) {
    try {
      j[name] = probe();
    } catch (const std::exception& e) {
      j[name] = std::string("failed: ") + e.what();
    }
  };
  measure("device_copy", [&] {
    const std::size_t bytes = quick ? (std::size_t{256} << 20) : (std::size_t{1} << 30);
    Buffer<float> src(bytes / sizeof(float), MemorySpace::device, Uninitialized{});
    Buffer<float> dst(bytes / sizeof(float), MemorySpace::device, Uninitialized{});
    fill_random(src.data(), src.size(), 1.0f, 7);
    const Timing t = time([&] {
      check(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s), "twell bench (copy)");
    });
    ceilings_.copy_gbps = 2.0 * static_cast<double>(bytes) / (t.median_ms * 1e6);
    Json r = record(t, "gb_per_s", ceilings_.copy_gbps, "bytes read plus bytes written");
    r["bytes_each_way"] = static_cast<std::int64_t>(bytes);
    return r;
  });
  measure("bf16_gemm", [&] {
    const int n = quick ? 4096 : 8192;
    const std::size_t elems = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
    Buffer<bf16> a(elems, MemorySpace::device, Uninitialized{}), b(elems, MemorySpace::device, Uninitialized{}),
        c(elems, MemorySpace::device, Uninitialized{});
    fill_random(a.data(), elems, 1.0f, 11);
    fill_random(b.data(), elems, 1.0f, 12);
    const DenseView<const bf16> av{a.data(), n, n, n, MemorySpace::device}, bv{b.data(), n, n, n, MemorySpace::device};
    const DenseView<bf16> cv{c.data(), n, n, n, MemorySpace::device};
    const Timing t = time([&] { gemm(av, bv, cv); });
    ceilings_.gemm_tflops = 2.0 * n * static_cast<double>(n) * n / (t.median_ms * 1e9);
    Json r = record(t, "tflop_per_s", ceilings_.gemm_tflops, "cublasGemmEx, bf16 in and out, fp32 accumulation");
    r["m_n_k"] = n;
    return r;
  });
  measure("shared_load", [&] {
    const int grid = full_grid(shared_load_kernel, device_);
    const int rounds = quick ? 256 : 1024;
    Counter sum(s);
    std::uint64_t runs = 0;
    const Timing t = time([&] {
      shared_load_kernel<<<grid, kThreads, 0, s>>>(rounds, sum.data());
      check(cudaGetLastError(), "twell bench (shared-load probe launch)");
      ++runs;
    });
    const std::uint64_t sweeps = runs * static_cast<std::uint64_t>(grid) * static_cast<std::uint64_t>(rounds) *
                                 (kLoadsPerRound * kThreads / kSharedPieces);
    expect(sum.value(), sweeps * sum_of_indices(4ull * kSharedPieces), "shared-load checksum");
    const double bytes = 16.0 * grid * kThreads * static_cast<double>(rounds) * kLoadsPerRound;
    ceilings_.shared_load_gbps = bytes / (t.median_ms * 1e6);
    Json r = record(t, "gb_per_s", ceilings_.shared_load_gbps,
                    "16-byte ld.shared of 512 consecutive bytes a warp (no bank conflict), CTAs of 1024 threads on "
                    "every SM at full occupancy");
    r["bytes_per_run"] = bytes;
    return r;
  });
  measure("l2_load", [&] {
    int grid = full_grid(l2_load_kernel, device_);
    // At most half of L2, so the buffer stays there between passes.
    const std::size_t cta_bytes = std::size_t{16} * kThreads * kL2PiecesPerThread;
    grid = static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(grid, l2_bytes_ / 2 / cta_bytes)));
    const std::size_t pieces = static_cast<std::size_t>(grid) * kThreads * kL2PiecesPerThread;
    Buffer<unsigned> data(4 * pieces, MemorySpace::device, Uninitialized{});
    iota_kernel<<<1024, 256, 0, s>>>(data.data(), data.size());
    check(cudaGetLastError(), "twell bench (L2 probe fill)");
    const int passes = static_cast<int>(
        std::max<std::size_t>(1, (quick ? (std::size_t{2} << 30) : (std::size_t{8} << 30)) / (16 * pieces)));
    Counter sum(s);
    std::uint64_t runs = 0;
    const Timing t = time([&] {
      l2_load_kernel<<<grid, kThreads, 0, s>>>(reinterpret_cast<const uint4*>(data.data()), passes, sum.data());
      check(cudaGetLastError(), "twell bench (L2-load probe launch)");
      ++runs;
    });
    expect(sum.value(), runs * static_cast<std::uint64_t>(passes) * sum_of_indices(data.size()), "L2-load checksum");
    const double bytes = 16.0 * static_cast<double>(pieces) * passes;
    ceilings_.l2_load_gbps = bytes / (t.median_ms * 1e6);
    Json r = record(t, "gb_per_s", ceilings_.l2_load_gbps,
                    "16-byte ld.global.cg over a buffer of at most half of L2, passes after the first served by L2 "
                    "(the first, after the harness's L2 flush, by DRAM)");
    r["buffer_bytes"] = static_cast<std::int64_t>(16 * pieces);
    r["passes"] = passes;
    return r;
  });
  measure("fp32_fma", [&] {
    const int grid = full_grid(fma_kernel, device_);
    const int steps = quick ? 4096 : 16384;
    const float a = 0.9999f, b = 1e-4f;
    float chains[kFmaChains];
    for (int c = 0; c < kFmaChains; ++c) chains[c] = static_cast<float>(c);
    for (int i = 0; i < steps; ++i)
      for (float& x : chains) x = std::fma(x, a, b);
    float expected = 0;
    for (const float x : chains) expected += x;
    Counter mismatches(s);
    const Timing t = time([&] {
      fma_kernel<<<grid, kThreads, 0, s>>>(steps, a, b, expected, mismatches.data());
      check(cudaGetLastError(), "twell bench (FMA probe launch)");
    });
    expect(mismatches.value(), 0, "threads whose FMA chains differ from the host's");
    const double flops = 2.0 * grid * kThreads * static_cast<double>(kFmaChains) * steps;
    ceilings_.fma_tflops = flops / (t.median_ms * 1e9);
    Json r = record(t, "tflop_per_s", ceilings_.fma_tflops,
                    "fp32 fmaf on CUDA cores, 8 independent chains a thread, 2 FLOPs each");
    r["flops_per_run"] = flops;
    return r;
  });
  return j;
}

}  // namespace twell::bench
