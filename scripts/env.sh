# Sourced by the other scripts: makes a CUDA toolkit in its usual place visible to CMake even
# when it is not on PATH, so TWELL_WITH_CUDA=AUTO finds it.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [[ -z "${CUDACXX:-}" ]] && command -v nvcc >/dev/null 2>&1; then
  CUDACXX="$(command -v nvcc)"
  export CUDACXX
fi

