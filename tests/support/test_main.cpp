// doctest main shared by all suites. GPU suites (built with TWELL_GPU_SUITE defined via the
// executable name prefix) are skipped with exit code 77 when no device is visible.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include <twell/memory.hpp>

int main(int argc, char** argv) {
  const char* slash = std::strrchr(argv[0], '/');
  const char* name = slash ? slash + 1 : argv[0];
  if (std::strncmp(name, "gpu_", 4) == 0 && !twell::cuda_available()) {
    std::printf("%s: no CUDA device visible; skipping the gpu suite\n", name);
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
