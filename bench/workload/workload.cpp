#include <twell/workload.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include <twell/error.hpp>
#include <twell/instantiate.hpp>

namespace twell::workload {

namespace {

// Shape of the skew, fitted so that the token-skewed preset at 0.5 % of 5632 units lands near
// the statistics measured on real ReLU + L1 activations (docs/benchmarks/README.md): median
// about 11 nonzeros per token, p99 about 220, maximum about 800 over 16384 tokens.
constexpr double kUnitSigma = 1.5;     // log-normal spread of live units' firing rates
constexpr double kTokenSigma = 1.3;   // log-normal spread of tokens' activity factors
constexpr double kTokenCap = 36.0;     // the most active tokens fire about this many times the mean
constexpr float kValueFloor = 1.0f / 64;  // smallest magnitude, far from zero in every value type
constexpr double kDeadBias = -40.0;    // gate bias of a dead unit: no token ever reaches zero

// Draws from raw 64-bit words with our own transforms, so a seed gives the same matrices with
// every standard library (std:: distributions are implementation-defined).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1p-53; }  // [0, 1)
  double uniform_open() { return (static_cast<double>(engine_() >> 11) + 0.5) * 0x1p-53; }  // (0, 1)
  double normal() {
    const double r = std::sqrt(-2.0 * std::log(uniform_open()));
    return r * std::cos(2.0 * 3.14159265358979323846 * uniform());
  }
  double exponential() { return -std::log(uniform_open()); }
  std::uint64_t below(std::uint64_t n) { return engine_() % n; }

 private:
  std::mt19937_64 engine_;
};

// Independent streams for the pattern and for each matrix of one seed.
std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Inverse of normal_cdf by bisection: slow but plainly right, and called once per unit.
double normal_quantile(double p) {
  double lo = -40.0, hi = 40.0;
  for (int it = 0; it < 200 && hi - lo > 1e-12; ++it) {
    const double mid = 0.5 * (lo + hi);
    (normal_cdf(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Firing probability of (token i, unit j) is min(1, scale * unit_rate[j] * token_factor[i]).
struct Plan {
  std::vector<double> unit_rate;     // 0 for dead units; mean 1 over live units (skewed modes)
  std::vector<double> token_factor;  // mean 1
  double scale = 0;
};

// Expected nonzeros of each token under a plan, from the live rates sorted in decreasing
// order: units with scale * rate * factor >= 1 always fire, the rest contribute linearly.
class ExpectedCount {
 public:
  explicit ExpectedCount(const std::vector<double>& unit_rate) : sorted_(unit_rate) {
    std::sort(sorted_.begin(), sorted_.end(), std::greater<>());
    prefix_.resize(sorted_.size() + 1, 0.0);
    for (std::size_t j = 0; j < sorted_.size(); ++j) prefix_[j + 1] = prefix_[j] + sorted_[j];
  }
  double operator()(double scaled_factor) const {
    if (scaled_factor <= 0) return 0;
    const double threshold = 1.0 / scaled_factor;
    const auto saturated = static_cast<std::size_t>(
        std::partition_point(sorted_.begin(), sorted_.end(), [&](double r) { return r >= threshold; }) -
        sorted_.begin());
    return static_cast<double>(saturated) + scaled_factor * (prefix_.back() - prefix_[saturated]);
  }

 private:
  std::vector<double> sorted_;
  std::vector<double> prefix_;
};

Plan make_plan(const ActivationOptions& o) {
  const auto n = static_cast<std::size_t>(o.units);
  const auto m = static_cast<std::size_t>(o.tokens);
  Plan plan;
  plan.unit_rate.assign(n, 1.0);
  plan.token_factor.assign(m, 1.0);
  plan.scale = o.density;
  if (o.distribution == Distribution::uniform) return plan;

  Rng rng(stream_seed(o.seed, 0));
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (std::size_t j = n; j > 1; --j) std::swap(order[j - 1], order[rng.below(j)]);
  const auto dead = static_cast<std::size_t>(std::llround(o.dead_fraction * static_cast<double>(n)));
  double live_sum = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const double rate = k < dead ? 0.0 : std::exp(kUnitSigma * rng.normal());
    plan.unit_rate[order[k]] = rate;
    live_sum += rate;
  }
  const double live_mean = live_sum / static_cast<double>(n - dead);
  for (double& r : plan.unit_rate) r /= live_mean;

  if (o.distribution == Distribution::token_skewed && m > 0) {
    double sum = 0;
    for (double& f : plan.token_factor) {
      f = std::exp(kTokenSigma * rng.normal());
      sum += f;
    }
    // Normalise to mean 1, cap the tail, and renormalise the body so the mean stays 1.
    for (double& f : plan.token_factor) f *= static_cast<double>(m) / sum;
    double capped = 0, body = 0;
    for (double f : plan.token_factor) (f >= kTokenCap ? capped : body) += std::min(f, kTokenCap);
    const double body_scale = (static_cast<double>(m) - capped) / body;
    for (double& f : plan.token_factor) f = f >= kTokenCap ? kTokenCap : f * body_scale;
  }

  // Saturation (probabilities capped at 1) eats part of the heavy tokens' mass: find the scale
  // whose expected total is exactly the target, by bisection on a monotone function.
  const ExpectedCount expected(plan.unit_rate);
  const double target = o.density * static_cast<double>(n) * static_cast<double>(m);
  auto total = [&](double s) {
    double t = 0;
    for (double f : plan.token_factor) t += expected(s * f);
    return t;
  };
  double lo = 0, hi = o.density;
  while (total(hi) < target && hi < 1e12) hi *= 2;
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    (total(mid) < target ? lo : hi) = mid;
  }
  plan.scale = 0.5 * (lo + hi);
  return plan;
}

template <Value T>
T positive_value(Rng& rng) {
  const T v = from_float<T>(kValueFloor + static_cast<float>(rng.exponential()));
  return is_stored(v) ? v : from_float<T>(1.0f);
}

template <Value T>
DenseMatrix<T> gaussian_matrix(std::int64_t rows, std::int64_t cols, double stddev, std::uint64_t seed) {
  Rng rng(seed);
  DenseMatrix<T> out(rows, cols);
  for (T& v : out.values().host_span()) v = from_float<T>(static_cast<float>(stddev * rng.normal()));
  return out;
}

}  // namespace

void check_options(const ActivationOptions& o, const char* where) {
  require(o.tokens >= 0, ErrorCode::invalid_argument, where, "options.tokens = ", o.tokens, " is negative");
  require(o.units >= 1, ErrorCode::invalid_argument, where, "options.units = ", o.units, " must be at least 1");
  require(o.density >= 0.0 && o.density <= 1.0, ErrorCode::invalid_argument, where, "options.density = ", o.density,
          " is outside [0, 1]");
  if (o.distribution == Distribution::uniform) return;
  require(o.dead_fraction >= 0.0 && o.dead_fraction < 1.0, ErrorCode::invalid_argument, where,
          "options.dead_fraction = ", o.dead_fraction, " is outside [0, 1)");
  const auto dead = static_cast<std::int64_t>(std::llround(o.dead_fraction * static_cast<double>(o.units)));
  const double live_share = static_cast<double>(o.units - dead) / static_cast<double>(o.units);
  // Every live unit firing on every token is the most a skewed workload can reach; asking for
  // nearly that much leaves no room for skew.
  require(o.density <= 0.9 * live_share, ErrorCode::invalid_argument, where, "options.density = ", o.density,
          " needs more than 90 % of the live units (", live_share, " of ", o.units,
          " with options.dead_fraction = ", o.dead_fraction, ") firing on every token");
}

std::string to_string(Distribution d) {
  switch (d) {
    case Distribution::uniform: return "uniform";
    case Distribution::neuron_skewed: return "neuron_skewed";
    case Distribution::token_skewed: return "token_skewed";
  }
  return "?";
}

Distribution parse_distribution(const std::string& name) {
  std::string key = name;
  std::replace(key.begin(), key.end(), '-', '_');
  for (Distribution d : {Distribution::uniform, Distribution::neuron_skewed, Distribution::token_skewed})
    if (key == to_string(d)) return d;
  fail(ErrorCode::invalid_argument, "twell::workload::parse_distribution", "name = '", name,
       "' is not one of uniform, neuron_skewed, token_skewed");
}

FfnShape paper_shape() { return {"paper", 2048, 5632}; }
FfnShape llama7b_shape() { return {"llama7b", 4096, 11008}; }
FfnShape small_shape() { return {"small", 1024, 2816}; }
std::vector<FfnShape> presets() { return {paper_shape(), llama7b_shape(), small_shape()}; }

FfnShape preset(const std::string& name) {
  for (const FfnShape& s : presets())
    if (s.name == name) return s;
  fail(ErrorCode::invalid_argument, "twell::workload::preset", "name = '", name,
       "' is not one of paper, llama7b, small");
}

template <Value T>
DenseMatrix<T> activations(const ActivationOptions& options) {
  check_options(options, "twell::workload::activations");
  const Plan plan = make_plan(options);
  Rng rng(stream_seed(options.seed, 1));
  DenseMatrix<T> out(options.tokens, options.units);
  auto v = out.view();
  for (std::int64_t i = 0; i < options.tokens; ++i) {
    const double token_scale = plan.scale * plan.token_factor[static_cast<std::size_t>(i)];
    for (std::int64_t j = 0; j < options.units; ++j) {
      const double p = token_scale * plan.unit_rate[static_cast<std::size_t>(j)];
      if (p > 0 && rng.uniform() < p) v.at(i, j) = positive_value<T>(rng);
    }
  }
  return out;
}

// The gate pre-activation of (token i, unit j) is b_j + t_i + z_ij: x_i = (1, t_i, noise),
// column j of Wg = (b_j, 1, unit-norm Gaussian), and z_ij = noise_i . w_j is N(0, 1) over
// tokens. b_j = quantile(unit j's rate at the scale of a mean token); t_i solves
// sum_j P(b_j + t_i + z > 0) = the token's expected count under the plan, so each token keeps
// its expected nonzeros exactly and units keep their rank order.
template <Value T>
FfnInputs<T> ffn_inputs(const ActivationOptions& options, std::int64_t hidden) {
  constexpr const char* kWhere = "twell::workload::ffn_inputs";
  check_options(options, kWhere);
  require(hidden >= 3, ErrorCode::invalid_argument, kWhere, "hidden = ", hidden,
          " must be at least 3 (a bias feature, a token feature and noise)");
  const Plan plan = make_plan(options);
  const auto n = static_cast<std::size_t>(options.units);
  const std::int64_t k = hidden;

  constexpr double kPMin = 1e-12, kPMax = 1.0 - 1e-9;
  std::vector<double> bias(n);
  for (std::size_t j = 0; j < n; ++j) {
    const double p = plan.scale * plan.unit_rate[j];
    bias[j] = plan.unit_rate[j] == 0 ? kDeadBias : normal_quantile(std::clamp(p, kPMin, kPMax));
  }

  // Expected count of a token as a function of its shift t, tabulated on a grid (monotone).
  constexpr double kTMin = -12, kTMax = 12, kStep = 1.0 / 64;
  const auto grid_points = static_cast<std::size_t>((kTMax - kTMin) / kStep) + 1;
  std::vector<double> count_at(grid_points, 0.0);
  for (std::size_t g = 0; g < grid_points; ++g) {
    const double t = kTMin + kStep * static_cast<double>(g);
    double c = 0;
    for (std::size_t j = 0; j < n; ++j)
      if (plan.unit_rate[j] > 0 || options.distribution == Distribution::uniform) c += normal_cdf(bias[j] + t);
    count_at[g] = c;
  }
  const ExpectedCount expected(plan.unit_rate);
  auto shift_for = [&](double target) {
    const auto above = static_cast<std::size_t>(std::lower_bound(count_at.begin(), count_at.end(), target) -
                                                count_at.begin());
    if (above == 0) return kTMin;
    if (above == grid_points) return kTMax;
    const double c0 = count_at[above - 1], c1 = count_at[above];
    const double w = c1 > c0 ? (target - c0) / (c1 - c0) : 0.0;
    return kTMin + kStep * (static_cast<double>(above - 1) + w);
  };

  FfnInputs<T> in;
  in.x = gaussian_matrix<T>(options.tokens, k, 1.0, stream_seed(options.seed, 2));
  auto xv = in.x.view();
  for (std::int64_t i = 0; i < options.tokens; ++i) {
    xv.at(i, 0) = from_float<T>(1.0f);
    xv.at(i, 1) = from_float<T>(
        static_cast<float>(shift_for(expected(plan.scale * plan.token_factor[static_cast<std::size_t>(i)]))));
  }

  in.wg = DenseMatrix<T>(k, options.units);
  auto wv = in.wg.view();
  Rng rng(stream_seed(options.seed, 3));
  std::vector<double> column(static_cast<std::size_t>(k - 2));
  for (std::int64_t j = 0; j < options.units; ++j) {
    double norm2 = 0;
    for (double& c : column) {
      c = rng.normal();
      norm2 += c * c;
    }
    const double inv = 1.0 / std::sqrt(norm2);
    wv.at(0, j) = from_float<T>(static_cast<float>(bias[static_cast<std::size_t>(j)]));
    wv.at(1, j) = from_float<T>(1.0f);
    for (std::int64_t r = 2; r < k; ++r)
      wv.at(r, j) = from_float<T>(static_cast<float>(column[static_cast<std::size_t>(r - 2)] * inv));
  }
  in.wu = gaussian_matrix<T>(k, options.units, 1.0 / std::sqrt(static_cast<double>(k)), stream_seed(options.seed, 4));
  in.wd = gaussian_matrix<T>(options.units, k, 1.0 / std::sqrt(static_cast<double>(options.units)),
                             stream_seed(options.seed, 5));
  return in;
}

template <Value T>
RowProfile profile(DenseView<const T> m) {
  require(m.space == MemorySpace::host, ErrorCode::space_mismatch, "twell::workload::profile",
          "the matrix lives in device memory; copy it to the host first");
  RowProfile out;
  if (m.rows == 0 || m.cols == 0) {
    out.dead_unit_share = m.cols == 0 ? 0.0 : 1.0;
    return out;
  }
  std::vector<std::int64_t> per_row(static_cast<std::size_t>(m.rows), 0);
  std::vector<char> fired(static_cast<std::size_t>(m.cols), 0);
  double total = 0;
  for (std::int64_t i = 0; i < m.rows; ++i) {
    std::int64_t c = 0;
    for (std::int64_t j = 0; j < m.cols; ++j) {
      if (is_stored(m.at(i, j))) {
        ++c;
        fired[static_cast<std::size_t>(j)] = 1;
      }
    }
    per_row[static_cast<std::size_t>(i)] = c;
    total += static_cast<double>(c);
  }
  out.mean = total / static_cast<double>(m.rows);
  std::sort(per_row.begin(), per_row.end());
  // Nearest-rank percentile: the smallest count with at least q of the rows at or below it.
  auto percentile = [&](double q) {
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(per_row.size())));
    return per_row[std::max<std::size_t>(rank, 1) - 1];
  };
  out.p50 = percentile(0.50);
  out.p99 = percentile(0.99);
  out.max = per_row.back();
  const auto dead = std::count(fired.begin(), fired.end(), 0);
  out.dead_unit_share = static_cast<double>(dead) / static_cast<double>(m.cols);
  return out;
}

#define TWELL_WORKLOAD_INSTANTIATE(T)                                                   \
  template DenseMatrix<T> activations<T>(const ActivationOptions&);                     \
  template FfnInputs<T> ffn_inputs<T>(const ActivationOptions&, std::int64_t);          \
  template RowProfile profile<T>(DenseView<const T>);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_WORKLOAD_INSTANTIATE)
#undef TWELL_WORKLOAD_INSTANTIATE

}  // namespace twell::workload
