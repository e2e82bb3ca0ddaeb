#include <limits>

#include <twell/stats.hpp>
#include <twell/validate.hpp>

namespace twell {
namespace {

template <class T>
std::int64_t cols_of(const HybridView<const T>& m) {
  return m.twell.cols;
}
template <class View>
std::int64_t cols_of(const View& m) {
  return m.cols;
}

// stats() counts through CSR, whose column indices are 32-bit; a valid wider matrix gets that
// said by stats itself, not by the inner conversion's error.
template <class View>
void check_countable(const View& m) {
  if (cols_of(m) <= std::numeric_limits<std::int32_t>::max()) return;
  validate(m, ValidateOptions{.allow_explicit_zeros = true});  // a malformed matrix says so first
  fail(ErrorCode::unsupported, "twell::stats", "cols = ", cols_of(m),
       " exceeds 2147483647: statistics are counted on CSR, whose column indices are 32-bit");
}

}  // namespace

#define TWELL_DEFINE_STATS_FROM(T, View)                            \
  MatrixStats stats(View<const T> m, const StatsOptions& options) { \
    check_countable(m);                                             \
    const CsrMatrix<T> csr = to_csr(m);                             \
    return stats(csr.view(), options);                              \
  }

#define TWELL_DEFINE_STATS(T)           \
  TWELL_DEFINE_STATS_FROM(T, DenseView) \
  TWELL_DEFINE_STATS_FROM(T, EllView)   \
  TWELL_DEFINE_STATS_FROM(T, TwellView) \
  TWELL_DEFINE_STATS_FROM(T, HybridView)

TWELL_FOR_EACH_VALUE_TYPE(TWELL_DEFINE_STATS)
#undef TWELL_DEFINE_STATS
#undef TWELL_DEFINE_STATS_FROM

}  // namespace twell
