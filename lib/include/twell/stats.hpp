// Public statistics: twell::stats for every view and owning matrix (formats other than CSR are
// converted to CSR first, on their own backend), and twell::format_stats to print them.
#pragma once

#include <twell/convert.hpp>
#include <twell/formats/stats.hpp>

namespace twell {

#define TWELL_DECLARE_STATS(T)                                                      \
  MatrixStats stats(DenseView<const T> m, const StatsOptions& options = {});        \
  MatrixStats stats(EllView<const T> m, const StatsOptions& options = {});          \
  MatrixStats stats(TwellView<const T> m, const StatsOptions& options = {});        \
  MatrixStats stats(HybridView<const T> m, const StatsOptions& options = {});

TWELL_FOR_EACH_VALUE_TYPE(TWELL_DECLARE_STATS)
#undef TWELL_DECLARE_STATS

template <OwningMatrix M>
MatrixStats stats(const M& m, const StatsOptions& options = {}) {
  return stats(m.view(), options);
}

}  // namespace twell
