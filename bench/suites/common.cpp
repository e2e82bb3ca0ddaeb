#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <exception>

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <twell/bench/timeline.hpp>
#include <twell/error.hpp>
#include <twell/formats/copy.hpp>

namespace twell::bench::detail {

const std::vector<double>& sweep_densities(bool quick) {
  static const std::vector<double> full{0.003, 0.005, 0.01, 0.02, 0.05, 0.10, 0.20};
  static const std::vector<double> small{0.005, 0.05};
  return quick ? small : full;
}

const std::vector<workload::Distribution>& distributions(bool quick) {
  using workload::Distribution;
  static const std::vector<Distribution> all{Distribution::uniform, Distribution::neuron_skewed,
                                             Distribution::token_skewed};
  static const std::vector<Distribution> two{Distribution::uniform, Distribution::token_skewed};
  return quick ? two : all;
}

std::int64_t tokens_large(const Config& config) {
  return config.tokens_large > 0 ? config.tokens_large : config.quick ? 2048 : 16384;
}
std::int64_t tokens_small(const Config& config) {
  return config.tokens_small > 0 ? config.tokens_small : config.quick ? 512 : 4096;
}
std::vector<std::int64_t> decode_batches() { return {1, 64, 256, 512}; }

bool in_scope(const Config& config, const std::string& shape, std::int64_t m, double density,
              workload::Distribution dist) {
  if (!config.contract) return true;
  return shape == workload::paper_shape().name && (m == tokens_large(config) || m == tokens_small(config)) &&
         density == 0.005 && dist != workload::Distribution::neuron_skewed;
}

TwellLayout layout_for_density(double density) {
  TwellLayout layout;
  const double needed = 4.0 * density * layout.tile + 8.0;
  layout.compression = layout.tile / 2;
  while (layout.compression > 1 && layout.capacity() < needed) layout.compression /= 2;
  return layout;
}

namespace {
using ActKey = std::tuple<std::int64_t, std::int64_t, double, int, std::uint64_t>;
std::map<ActKey, DeviceActivations>& activation_cache() {
  static std::map<ActKey, DeviceActivations> cache;
  return cache;
}
}  // namespace

const DeviceActivations& activations(std::int64_t m, std::int64_t n, double density, workload::Distribution dist,
                                     std::uint64_t seed) {
  const ActKey key{m, n, density, static_cast<int>(dist), seed};
  auto& cache = activation_cache();
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  workload::ActivationOptions o;
  o.tokens = m;
  o.units = n;
  o.density = density;
  o.distribution = dist;
  o.seed = seed;
  const DenseMatrix<T> host = workload::activations<T>(o);
  DeviceActivations out;
  out.profile = workload::profile<T>(host.view());
  out.realized_density = out.profile.mean / static_cast<double>(n);
  out.dense = host.to(MemorySpace::device);
  return cache.emplace(key, std::move(out)).first->second;
}

namespace {
using FfnKey = std::tuple<std::string, std::int64_t, double, int, std::uint64_t>;
std::map<FfnKey, DeviceFfn>& ffn_cache() {
  static std::map<FfnKey, DeviceFfn> cache;
  return cache;
}
}  // namespace

const DeviceFfn& ffn_inputs(const workload::FfnShape& shape, std::int64_t m, double density,
                            workload::Distribution dist, std::uint64_t seed) {
  const FfnKey key{shape.name, m, density, static_cast<int>(dist), seed};
  auto& cache = ffn_cache();
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  workload::ActivationOptions o;
  o.tokens = m;
  o.units = shape.intermediate;
  o.density = density;
  o.distribution = dist;
  o.seed = seed;
  const auto host = workload::ffn_inputs<T>(o, shape.hidden);
  DeviceFfn d{host.x.to(MemorySpace::device), host.wg.to(MemorySpace::device), host.wu.to(MemorySpace::device),
              host.wd.to(MemorySpace::device)};
  return cache.emplace(key, std::move(d)).first->second;
}

void clear_ffn_cache() { ffn_cache().clear(); }

void clear_caches() {
  ffn_cache().clear();
  activation_cache().clear();
}

double bytes_of(HybridView<const T> h) {
  const double words = static_cast<double>(h.rows()) * static_cast<double>(h.twell.packed_width());
  const double plane = h.twell.value_plane != nullptr ? words * sizeof(T) : 0.0;
  return 4.0 * words + plane + bytes_of_dense(h.overflow_rows(), h.cols()) +
         4.0 * static_cast<double>(h.rows() + h.overflow_rows());
}

double bytes_of(const HybridMatrix<T>& h) { return bytes_of(h.view()); }

double bytes_of_dense(std::int64_t rows, std::int64_t cols) {
  return static_cast<double>(rows) * static_cast<double>(cols) * sizeof(T);
}

Case sweep_case(const std::string& suite, const std::string& op, const workload::FfnShape& shape, std::int64_t m,
                std::int64_t k, std::int64_t n, workload::Distribution dist, double density,
                const DeviceActivations& act) {
  Case c;
  c.suite = suite;
  c.op = op;
  c.shape = shape.name;
  c.m = m;
  c.k = k;
  c.n = n;
  c.distribution = workload::to_string(dist);
  c.density_target = density;
  c.density_realized = act.realized_density;
  return c;
}

Case with_variant(Case base, const std::string& variant) {
  base.variant = variant;
  return base;
}

namespace {
// One NVTX range per case, named by case_name, so a profiler can keep to one case (docs/benchmarks/README.md,
// "Profiling one case"); without a profiler attached the push and pop cost nothing. The same name
// tags the case's rows of a --timeline trace.
class CaseRange {
 public:
  explicit CaseRange(const Case& c) {
    const std::string name = case_name(c);
    nvtxRangePushA(name.c_str());
    timeline::case_begin(name);
  }
  ~CaseRange() {
    timeline::case_end();
    nvtxRangePop();
  }
  CaseRange(const CaseRange&) = delete;
  CaseRange& operator=(const CaseRange&) = delete;
};
}  // namespace

void run_case(Report& report, Case c, const std::vector<std::string>& needed_by,
              const std::function<void(Case&)>& body) {
  const bool runs =
      report.selection.selects(c) || std::any_of(needed_by.begin(), needed_by.end(), [&](const std::string& variant) {
        return report.selection.selects(with_variant(c, variant));
      });
  if (!runs) {
    c.status = kNotSelected;
    report.cases.push_back(std::move(c));
    return;
  }
  const CaseRange range(c);
  try {
    body(c);
  } catch (const Error& e) {
    c.status = (e.code() == ErrorCode::unsupported ? "not built: " : "failed: ") + std::string(e.what());
    // A failed case may leave a launch error behind; clear it so the next case starts clean.
    cudaGetLastError();
  } catch (const std::exception& e) {
    c.status = "failed: " + std::string(e.what());
    cudaGetLastError();
  }
  report.cases.push_back(std::move(c));
}

void run_case(Report& report, Case c, const std::function<void(Case&)>& body) {
  run_case(report, std::move(c), {}, body);
}

void list_case(Report& report, Case c, const std::string& status) {
  c.status = report.selection.selects(c) ? status : std::string(kNotSelected);
  report.cases.push_back(std::move(c));
}

void not_built(Report& report, Case c, const std::string& why) { list_case(report, std::move(c), "not built: " + why); }

bool none_selected(Report& report, const Case& base, std::initializer_list<std::pair<const char*, const char*>> cases) {
  const auto as = [&](const std::pair<const char*, const char*>& op_variant) {
    Case c = with_variant(base, op_variant.second);
    c.op = op_variant.first;
    return c;
  };
  if (std::any_of(cases.begin(), cases.end(), [&](const auto& ov) { return report.selection.selects(as(ov)); }))
    return false;
  for (const auto& ov : cases) list_case(report, as(ov), kNotSelected);
  return true;
}

void link_baselines(Report& report, const std::string& suite, const std::vector<std::string>& twell_variants,
                    const std::vector<std::string>& baselines) {
  auto same_point = [](const Case& a, const Case& b) {
    return a.suite == b.suite && a.op == b.op && a.shape == b.shape && a.m == b.m && a.k == b.k && a.n == b.n &&
           a.density_target == b.density_target && a.distribution == b.distribution;
  };
  for (Case& c : report.cases) {
    if (c.suite != suite || c.status != "ok") continue;
    if (std::find(twell_variants.begin(), twell_variants.end(), c.variant) == twell_variants.end()) continue;
    Json vs = Json::object();
    for (const std::string& name : baselines) {
      for (const Case& b : report.cases) {
        if (b.variant != name || b.status != "ok" || !same_point(b, c)) continue;
        const double s = b.timing.median_ms / c.timing.median_ms;
        vs[name] = s;
        if (c.baseline.empty()) {
          c.baseline = name;
          c.speedup = s;
        }
        break;
      }
    }
    c.extra["speedup_vs"] = vs;
  }
}

FloorPhase sparse_products_phase(std::string name, double fmas, double dram_bytes) {
  return {.name = std::move(name),
          .dram_bytes = dram_bytes,
          .on_chip_bytes = fmas * sizeof(T),
          .cuda_core_flops = 2 * fmas};
}

std::string not_checked(const Case& reference) {
  return "not checked: the " + reference.variant + " case did not run (" + reference.status + ")";
}

double relative_error(DenseView<const T> a, DenseView<const T> b) {
  require(a.rows == b.rows && a.cols == b.cols, ErrorCode::shape_mismatch, "twell bench relative_error", "a is ",
          a.rows, " x ", a.cols, ", b is ", b.rows, " x ", b.cols);
  const DenseMatrix<T> ha = copy_to(a, MemorySpace::host), hb = copy_to(b, MemorySpace::host);
  const auto va = ha.values().host_span(), vb = hb.values().host_span();
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double x = to_float(va[i]), y = to_float(vb[i]);
    diff += (x - y) * (x - y);
    ref += y * y;
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
}

void sync(Harness& h, const char* where) {
  const cudaError_t st = cudaStreamSynchronize(static_cast<cudaStream_t>(h.stream().handle));
  if (st != cudaSuccess) fail(ErrorCode::cuda, where, cudaGetErrorName(st), " (", cudaGetErrorString(st), ")");
}

}  // namespace twell::bench::detail
