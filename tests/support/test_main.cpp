// doctest main shared by all suites. GPU suites (named gpu_*) are skipped with exit code 77 when
// no device is visible, unless asked only to list their cases (--list-*, -ltc, -lts, -lr), which
// needs no device: the sanitizer's reports number the cases, and a listing names them anywhere.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include <twell/memory.hpp>

namespace {

bool only_lists(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--list-", 7) == 0 || std::strcmp(a, "-ltc") == 0 || std::strcmp(a, "-lts") == 0 ||
        std::strcmp(a, "-lr") == 0)
      return true;
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
  doctest::Context context(argc, argv);
  return context.run();
}
