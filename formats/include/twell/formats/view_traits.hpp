// Shared pieces of the format views: const-propagation from the value type to index arrays.
#pragma once

#include <type_traits>

namespace twell {

// A view of `const T` values also sees its index arrays as const.
template <class T, class Index>
using IndexPtr = std::conditional_t<std::is_const_v<T>, const Index, Index>*;

}  // namespace twell
