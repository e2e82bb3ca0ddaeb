// The sweep selection of tests/support/sweep.hpp: TWELL_TEST_PART's parsing, the items of a part,
// and that only a process's first sweep is split (the entry cpu_test_sweep_part runs the last case
// with TWELL_TEST_PART=1/3; without it that case checks the whole sweeps).
#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "sweep.hpp"

using twell::testing::SweepPart;

TEST_CASE("TWELL_TEST_PART's text: i/n with 0 <= i < n") {
  const SweepPart a = twell::testing::parse_sweep_part("0/1");
  CHECK(a.index == 0);
  CHECK(a.count == 1);
  const SweepPart b = twell::testing::parse_sweep_part("2/3");
  CHECK(b.index == 2);
  CHECK(b.count == 3);
  for (const char* bad : {"3/3", "1/0", "1", "", "/2", "1/", "a/2", "-1/2", "1/2/3", " 1/2", "9999999/99999999"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(twell::testing::parse_sweep_part(bad), std::invalid_argument);
  }
}

TEST_CASE("the parts of a sweep are disjoint and together hold every item") {
  const std::vector<int> items{10, 11, 12, 13, 14, 15, 16};
  for (std::size_t count = 1; count <= 9; ++count) {
    CAPTURE(count);
    std::vector<int> seen;
    for (std::size_t index = 0; index < count; ++index) {
      const std::vector<int> part = twell::testing::items_of_part(items, SweepPart{index, count});
      CHECK(part.size() == (items.size() + count - 1 - index) / count);  // the positions index, index + count, ...
      seen.insert(seen.end(), part.begin(), part.end());
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == items);
  }
  CHECK(twell::testing::items_of_part(items, SweepPart{1, 3}) == std::vector<int>{11, 14});
}

TEST_CASE("TWELL_TEST_PART splits the first sweep of a process and no other") {
  constexpr int kItems[] = {1, 2, 3};
  const SweepPart part = twell::testing::sweep_part();
  const std::vector<int> first = twell::testing::sweep(kItems);
  const std::vector<int> second = twell::testing::sweep(kItems);
  CHECK(second == std::vector<int>{1, 2, 3});
  if (part.count == 1) {
    CHECK(first == std::vector<int>{1, 2, 3});
  } else {  // cpu_test_sweep_part: 1/3
    CHECK(part.index == 1);
    CHECK(part.count == 3);
    CHECK(first == std::vector<int>{2});
  }
}
