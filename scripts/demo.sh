#!/usr/bin/env bash
# Builds the twell program (Release, in build/demo) and runs `twell demo`; extra arguments go to
# the demo, e.g. scripts/demo.sh --distribution uniform --density 0.02
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"

# The cuda backend takes minutes to compile: build it for the demo only where a GPU can run it
# (TWELL_WITH_CUDA=ON|OFF in the environment overrides).
with_cuda="${TWELL_WITH_CUDA:-OFF}"
if [[ -z "${TWELL_WITH_CUDA:-}" ]] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  with_cuda=AUTO
fi

cmake -S "$root" -B "$root/build/demo" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTWELL_WITH_CUDA="$with_cuda" \
  -DTWELL_BUILD_TESTS=OFF -DTWELL_BUILD_BENCH=OFF -DTWELL_BUILD_TOOLS=ON
cmake --build "$root/build/demo" --target twell_cli -j "$(nproc)"
"$root/build/demo/tools/twell" demo "$@"
