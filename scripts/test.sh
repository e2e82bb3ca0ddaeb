#!/usr/bin/env bash
# Builds everything with warnings as errors (the cuda backend too where nvcc exists) in
# build/test and runs the CPU test suites (label cpu; the gpu-labelled suites need a device).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"

cmake -S "$root" -B "$root/build/test" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTWELL_WITH_CUDA=AUTO \
  -DTWELL_WARNINGS_AS_ERRORS=ON -DTWELL_BUILD_TESTS=ON -DTWELL_BUILD_TOOLS=ON -DTWELL_BUILD_BENCH=ON
cmake --build "$root/build/test" -j "$(nproc)"
ctest --test-dir "$root/build/test" -L cpu --output-on-failure
