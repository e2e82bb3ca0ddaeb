# Sourced by the other scripts: makes a CUDA toolkit in its usual place visible to CMake even
# when it is not on PATH, so TWELL_WITH_CUDA=AUTO finds it.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [[ -z "${CUDACXX:-}" ]] && command -v nvcc >/dev/null 2>&1; then
  CUDACXX="$(command -v nvcc)"
  export CUDACXX
fi

# CMake 3.25 does not know that nvcc 12 and later accept -std=c++20, so it refuses CUDA_STANDARD 20;
# name the flag for it (newer CMake versions set the same value themselves).
twell_cmake_cuda_args=(-DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)
