// doctest main shared by all suites. GPU suites (named gpu_*) are skipped with exit code 77 when
// no device is visible, unless asked to list their cases, suites or reporters, which needs no
// device: the sanitizer's reports number the cases, and a listing names them anywhere.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <twell/memory.hpp>

#include "random.hpp"

namespace {

// Whether the arguments ask doctest to list something: a listing option in any of the spellings
// doctest 2.4 lists for (any number of leading dashes, an optional "dt-" prefix, long or short
// name; with "=value" it runs the tests instead, so such an argument does not count).
bool only_lists(int argc, char** argv) {
  static constexpr std::string_view kListings[] = {"list-test-cases", "ltc", "list-test-suites", "lts",
                                                   "list-reporters", "lr"};
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (!a.starts_with('-')) continue;
    while (a.starts_with('-')) a.remove_prefix(1);
    if (a.starts_with("dt-")) a.remove_prefix(3);
    for (const std::string_view name : kListings)
      if (a == name) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const char* slash = std::strrchr(argv[0], '/');
  const char* name = slash ? slash + 1 : argv[0];
  if (std::strncmp(name, "gpu_", 4) == 0 && !only_lists(argc, argv) && !twell::cuda_available()) {
    std::printf("%s: no CUDA device visible; skipping the gpu suite\n", name);
    return 77;
  }
  // On stderr, and not in a listing, which scripts parse.
  if (const char* seed = std::getenv("TWELL_TEST_SEED"); seed != nullptr && *seed != '\0' && !only_lists(argc, argv))
    std::fprintf(stderr, "%s: TWELL_TEST_SEED=%s, seed base %llu\n", name, seed,
                 static_cast<unsigned long long>(twell::testing::seed_base()));
  doctest::Context context(argc, argv);
  // scripts/gpu-check.sh asks for each case's time this way, through ctest, which passes no
  // arguments of its own.
  if (const char* durations = std::getenv("TWELL_TEST_DURATIONS"); durations != nullptr && *durations != '\0')
    context.setOption("duration", true);
  return context.run();
}
