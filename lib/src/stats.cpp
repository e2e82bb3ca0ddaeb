#include <twell/stats.hpp>

namespace twell {

#define TWELL_DEFINE_STATS_FROM(T, View)                                  \
  MatrixStats stats(View<const T> m, const StatsOptions& options) {       \
    const CsrMatrix<T> csr = to_csr(m);                                   \
    return stats(csr.view(), options);                                    \
  }

#define TWELL_DEFINE_STATS(T)            \
  TWELL_DEFINE_STATS_FROM(T, DenseView)  \
  TWELL_DEFINE_STATS_FROM(T, EllView)    \
  TWELL_DEFINE_STATS_FROM(T, TwellView)  \
  TWELL_DEFINE_STATS_FROM(T, HybridView)

TWELL_FOR_EACH_VALUE_TYPE(TWELL_DEFINE_STATS)
#undef TWELL_DEFINE_STATS
#undef TWELL_DEFINE_STATS_FROM

}  // namespace twell
