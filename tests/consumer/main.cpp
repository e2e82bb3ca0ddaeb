// Uses the installed library through the umbrella header only: builds a sparse activation
// matrix, converts it to CSR and TwELL, validates both, round-trips TwELL through a .twell
// buffer, and checks that the TwELL and CSR products with a dense matrix agree.
#include <cmath>
#include <cstdio>
#include <random>

#include <twell/twell.hpp>

int main() {
  using namespace twell;
  constexpr std::int64_t kRows = 37, kCols = 300, kOut = 16;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  DenseMatrix<float> act(kRows, kCols);
  for (float& v : act.values().host_span()) v = u(rng) < 0.03f ? u(rng) + 0.5f : 0.0f;
  DenseMatrix<float> w(kCols, kOut);
  for (float& v : w.values().host_span()) v = u(rng) - 0.5f;

  const CsrMatrix<float> csr = to_csr(act);
  ConvertOptions options;
  options.overflow = OverflowPolicy::error;
  const TwellMatrix<float> tw = to_twell(act, TwellLayout{128, 4}, options);
  validate(csr);
  validate(tw);

  const AnyMatrix back = read_twell(encode_twell(AnyMatrix(tw.to(MemorySpace::host))));
  const auto& tw2 = std::get<TwellMatrix<float>>(back);

  DenseMatrix<float> c1(kRows, kOut), c2(kRows, kOut);
  spmm<float>(Op::none, csr.view(), w.view(), c1.view());
  spmm<float>(Op::none, tw2.view(), w.view(), c2.view());
  double worst = 0;
  for (std::size_t k = 0; k < c1.values().size(); ++k) {
    worst = std::fmax(worst, std::fabs(c1.values().data()[k] - c2.values().data()[k]));
  }
  std::printf("twell %s consumer: %lld nonzeros, CSR vs TwELL spmm max difference %g, cuda %s\n", TWELL_VERSION,
              static_cast<long long>(csr.nnz()), worst, cuda_available() ? "available" : "not available");
  return worst <= 1e-5 ? 0 : 1;
}
