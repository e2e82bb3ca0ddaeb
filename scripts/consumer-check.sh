#!/usr/bin/env bash
# Installs twell into a temporary prefix and builds + runs tests/consumer against it with
# find_package(twell CONFIG REQUIRED): the CPU-only configuration always, and the CUDA one too
# when nvcc is present; the "source" configuration instead builds tests/consumer with twell's
# source tree as a FetchContent subproject (CPU-only). Exit status 0 when every configuration
# built and ran.
#
# Environment: CONSUMER_CONFIGS (any of "cpu", "cuda", "source"; default cpu, plus cuda with nvcc),
# CONSUMER_JOBS (build parallelism, default 2), CONSUMER_CUDA_BUILD (an existing build folder
# configured with the cuda backend, e.g. build/test, installed as it is instead of building the
# library again), KEEP_CONSUMER_DIR=1 keeps the temporary directory for inspection.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${CONSUMER_JOBS:-2}"
tmp="$(mktemp -d -t twell-consumer-XXXXXX)"
if [ "${KEEP_CONSUMER_DIR:-0}" != 1 ]; then trap 'rm -rf "$tmp"' EXIT; else echo "keeping $tmp"; fi
# A failed step's output is in its log, which the EXIT trap deletes: show the newest log first.
trap 'log="$(ls -t "$tmp"/*.log 2>/dev/null | head -1)"; [ -n "$log" ] && { echo "consumer check failed; tail of $log:" >&2; tail -n 40 "$log" >&2; }' ERR

if [ -n "${CONSUMER_CONFIGS:-}" ]; then
  read -r -a configs <<<"$CONSUMER_CONFIGS"
else
  configs=(cpu)
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then configs+=(cuda); fi
fi

for cfg in "${configs[@]}"; do
  echo "== consumer check: $cfg"
  if [ "$cfg" = source ]; then
    cmake -S "$root/tests/consumer" -B "$tmp/consumer-$cfg" -DCMAKE_BUILD_TYPE=Release -DTWELL_SOURCE_DIR="$root" \
      -DTWELL_WITH_CUDA=OFF >"$tmp/consumer-configure-$cfg.log"
    cmake --build "$tmp/consumer-$cfg" -j "$jobs" >"$tmp/consumer-build-$cfg.log"
    # A subproject builds the library and nothing else of twell's.
    if [ -n "$(find "$tmp/consumer-$cfg/_deps" -type f \( -name 'cpu_test_*' -o -name twell -o -name 'libtwell_bench*' \))" ]; then
      echo "consumer check: the subproject built twell's tests or benchmarks" >&2
      exit 1
    fi
    "$tmp/consumer-$cfg/twell_consumer"
    continue
  fi
  cuda=OFF
  extra=()
  if [ "$cfg" = cuda ]; then
    cuda=ON
    command -v nvcc >/dev/null 2>&1 || extra+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  fi
  if [ "$cfg" = cuda ] && [ -n "${CONSUMER_CUDA_BUILD:-}" ]; then
    grep -q '^TWELL_HAS_CUDA:INTERNAL=ON' "$CONSUMER_CUDA_BUILD/CMakeCache.txt" 2>/dev/null ||
      grep -q 'define TWELL_HAS_CUDA 1' "$CONSUMER_CUDA_BUILD/include/twell/config.hpp" ||
      { echo "consumer check: $CONSUMER_CUDA_BUILD is not a cuda build" >&2; exit 1; }
    cmake --install "$CONSUMER_CUDA_BUILD" --prefix "$tmp/prefix-$cfg" >"$tmp/install-$cfg.log"
  else
    cmake -S "$root" -B "$tmp/build-$cfg" -DCMAKE_BUILD_TYPE=Release -DTWELL_WITH_CUDA="$cuda" \
      -DTWELL_BUILD_TESTS=OFF -DTWELL_BUILD_BENCH=OFF -DTWELL_BUILD_TOOLS=OFF "${extra[@]}" \
      -DCMAKE_INSTALL_PREFIX="$tmp/prefix-$cfg" >"$tmp/configure-$cfg.log"
    cmake --build "$tmp/build-$cfg" -j "$jobs" >"$tmp/build-$cfg.log"
    cmake --install "$tmp/build-$cfg" >"$tmp/install-$cfg.log"
  fi
  cmake -S "$root/tests/consumer" -B "$tmp/consumer-$cfg" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$tmp/prefix-$cfg" >"$tmp/consumer-configure-$cfg.log"
  cmake --build "$tmp/consumer-$cfg" -j "$jobs" >"$tmp/consumer-build-$cfg.log"
  "$tmp/consumer-$cfg/twell_consumer"
done
echo "consumer check passed: ${configs[*]}"
