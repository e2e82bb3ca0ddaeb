#!/usr/bin/env bash
# A/B (and diagnostic) timing on a GPU machine in one call: builds the `twell` program of several
# variants of the source side by side, runs the same bench suites with each in turn on the same
# GPU, and compares their medians case by case (bench/compare.py).
#
#   scripts/bench-variants.sh OUTDIR [--suites LIST] [--contract] [--quick] [--reps N] [--cases RE]
#                             [--tokens S,L]
#                             [--rounds R] VARIANT [VARIANT...]
#
#   VARIANT   NAME             this source tree as it is
#             NAME=FLAGS       this source tree with FLAGS added to CMAKE_CUDA_FLAGS, e.g. a
#                              diagnostic switch: banks=-DTWELL_DIAG_BANKS (docs/benchmarks/history.md,
#                              "Where the slice product's time goes")
#             NAME:DIR         the source tree in DIR, e.g. the base of an A/B made before the call
#                              by `git archive HEAD | tar -x -C build-base` and carried with it
#             NAME@DIR         no build: the twell program already built in the build folder DIR
#                              (DIR/tools/twell), e.g. this tree's by gpu-check.sh earlier in the
#                              same call (new@build/gpu-check-build), so that the other variants
#                              build on all the cores
#   --suites LIST   bench suites (default spmm)
#   --contract, --quick, --reps N   passed to `twell bench` (--reps 20 unless --quick or --reps)
#   --cases RE      passed to `twell bench`: only the cases whose name "SUITE OP VARIANT SHAPE M
#                   DISTRIBUTION DENSITY" matches RE, e.g. 'spmm spmm (twell_slice_reuse|cusparse_csr) ',
#                   leaving out the baselines and points an A/B does not need; every variant's tree
#                   must know the option (twell bench has it since the twenty-sixth session)
#   --tokens S,L    passed to `twell bench`: the suites' two token counts (every variant's tree
#                   must know the option: since the fifty-second session)
#   --rounds R      run the variants R times (default 1), each round in the opposite order to the
#                   one before, so that drift shows
#
# Writes OUTDIR/NAME.json for each variant (NAME.rK.json for round K > 1) and OUTDIR/variants.md
# (the comparison, the first variant the base of the ratios, round by round), and prints the table. Each variant
# builds in its own folder under TWELL_BENCH_VARIANTS_BUILD (default /tmp/twell-variants), all at
# once, the cores shared out (Release, sm_90a, no tests). On a lent H100 (16 cores, 600 s a
# command) one variant built in 82 s and `--suite spmm --contract` takes ~50 s a variant, so
# about three variants fit a call, the base in each; the machines return at most 8 files:
# variants x rounds + 1 <= 8. Exits non-zero if a variant does not build or its bench fails; if
# the first (the base) does not build, nothing is benched.
set -u -o pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() {  # [EXIT CODE]: the header above, on stdout for --help, else on stderr
  local code="${1:-2}" fd=2
  [ "$code" = 0 ] && fd=1
  sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&"$fd"
  exit "$code"
}

out="${1:-}"
case "$out" in -h | --help) usage 0 ;; esac
if [ -z "$out" ] || [ "${out#-}" != "$out" ]; then usage; fi
shift
suites="spmm"
bench_args=()
reps=""
quick=0
rounds=1
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --suites) suites="${2:?--suites needs a list}"; shift ;;
    --contract) bench_args+=("$1") ;;
    --quick) bench_args+=("$1"); quick=1 ;;
    --reps) reps="${2:?--reps needs a number}"; shift ;;
    --cases) bench_args+=(--cases "${2:?--cases needs a pattern}"); shift ;;
    --tokens) bench_args+=(--tokens "${2:?--tokens needs SMALL,LARGE}"); shift ;;
    --rounds) rounds="${2:?--rounds needs a number}"; shift ;;
    -h | --help) usage 0 ;;
    -*) echo "bench-variants: unknown option $1" >&2; usage ;;
    *) variants+=("$1") ;;
  esac
  shift
done
[ ${#variants[@]} -gt 0 ] || { echo "bench-variants: name at least one variant" >&2; usage; }
builds="${TWELL_BENCH_VARIANTS_BUILD:-/tmp/twell-variants}"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"

# name, source tree, extra CUDA flags and twell program of each variant (a program given: no build)
names=() sources=() flags=() programs=()
for v in "${variants[@]}"; do
  case "$v" in
    *=*) names+=("${v%%=*}") sources+=("$root") flags+=("${v#*=}") programs+=("") ;;
    *:*)
      [ -f "${v#*:}/CMakeLists.txt" ] || { echo "bench-variants: ${v#*:} is not a source tree" >&2; exit 2; }
      names+=("${v%%:*}") sources+=("$(cd "${v#*:}" && pwd)") flags+=("") programs+=("") ;;
    *@*)
      [ -x "${v#*@}/tools/twell" ] || { echo "bench-variants: ${v#*@}/tools/twell is not a built twell program" >&2; exit 2; }
      names+=("${v%%@*}") sources+=("$(cd "${v#*@}" && pwd)") flags+=("") programs+=("$(cd "${v#*@}" && pwd)/tools/twell") ;;
    *) names+=("$v") sources+=("$root") flags+=("") programs+=("") ;;
  esac
done
for n in "${names[@]}"; do
  case "$n" in
    '' | *[!A-Za-z0-9_-]*) echo "bench-variants: variant name '$n' must be letters, digits, - or _" >&2; exit 2 ;;
  esac
done
if [ "$(printf '%s\n' "${names[@]}" | sort | uniq -d)" ]; then
  echo "bench-variants: variant names must differ" >&2
  exit 2
fi
# --quick keeps twell's own count unless --reps is given.
[ -z "$reps" ] && [ "$quick" = 0 ] && reps=20
[ -n "$reps" ] && bench_args+=(--reps "$reps")
mkdir -p "$out" "$builds"
out="$(cd "$out" && pwd)"
to_build=0
for p in "${programs[@]}"; do [ -z "$p" ] && to_build=$((to_build + 1)); done
jobs=$(($(nproc) / (to_build > 0 ? to_build : 1) + 1))

build_one() {  # INDEX
  local i="$1" dir="$builds/${names[$1]}"
  [ -n "${programs[$i]}" ] && return 0
  # A folder left by an earlier call for another source tree would make cmake refuse it.
  if [ -f "$dir/CMakeCache.txt" ] &&
    ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=${sources[$i]}" "$dir/CMakeCache.txt"; then
    rm -rf "$dir"
  fi
  mkdir -p "$dir"
  cmake -S "${sources[$i]}" -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTWELL_WITH_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc_bin" -DCMAKE_CUDA_ARCHITECTURES=90a-real -DTWELL_BUILD_TESTS=OFF \
    "-DCMAKE_CUDA_FLAGS=${flags[$i]}" >"$dir.log" 2>&1 &&
    cmake --build "$dir" --target twell_cli -j "$jobs" >>"$dir.log" 2>&1
}

t0=$(date +%s)
pids=()
for i in "${!names[@]}"; do
  build_one "$i" &
  pids+=($!)
  [ -z "${programs[$i]}" ] && programs[$i]="$builds/${names[$i]}/tools/twell"
done
built=()
failed=0
for i in "${!names[@]}"; do
  if wait "${pids[$i]}"; then
    built+=("$i")
  else
    failed=1
    echo "bench-variants: ${names[$i]} did not build; the end of $builds/${names[$i]}.log:" >&2
    tail -20 "$builds/${names[$i]}.log" >&2
  fi
done
echo "bench-variants: ${#built[@]} of ${#names[@]} variants ready ($to_build built) in $(($(date +%s) - t0)) s"
if [ ${#built[@]} -eq 0 ] || [ "${built[0]}" != 0 ]; then
  echo "bench-variants: the base variant ${names[0]} did not build; nothing benched" >&2
  exit 1
fi

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
files=()
order=("${built[@]}")
for ((r = 1; r <= rounds; ++r)); do
  for i in "${order[@]}"; do
    file="$out/${names[$i]}.json"
    [ "$r" -gt 1 ] && file="$out/${names[$i]}.r$r.json"
    # meta.source_commit: the variant's name and folder (a variant's tree need not be a commit).
    if TWELL_SOURCE_COMMIT="variant ${names[$i]} (${sources[$i]})" "${programs[$i]}" bench --suite "$suites" "${bench_args[@]}" --out "$file" \
      >"$builds/${names[$i]}.bench.log" 2>&1; then
      files+=("$file")
    else
      failed=1
      echo "bench-variants: the bench of ${names[$i]} (round $r) failed; the end of its output:" >&2
      tail -5 "$builds/${names[$i]}.bench.log" >&2
    fi
  done
  reversed=()
  for ((j = ${#order[@]} - 1; j >= 0; --j)); do reversed+=("${order[$j]}"); done
  order=("${reversed[@]}")
done
if [ ${#files[@]} -gt 0 ]; then
  python3 "$root/bench/compare.py" "${files[@]}" --out "$out/variants.md" || failed=1
fi
exit "$failed"
