#!/usr/bin/env bash
# One command for a GPU machine: configure and build for sm_90a, run the gpu tests, run the
# benchmarks and draw their plots, writing logs, JSON and plots under OUTDIR.
#
#   scripts/gpu-check.sh [OUTDIR] [--sanitize] [--suites a,b] [--quick] [--contract] [--arch80 | --skip-build-80 | --only-80]
#                        [--skip-tests] [--skip-bench] [--reps N] [--cases RE] [--tokens S,L] [--tests RE]
#                        [--test-cases F]
#                        [--profile CASE [--profile-metrics LIST]]
#
#   OUTDIR          where results go (default build/gpu-check); at most 7 files, none in subfolders:
#                   gpu-check.log (everything), gpu-tests.log, bench.json, bench-summary.md,
#                   speedup.png, gpu-tests-80.log (--arch80), sanitizer.log (--sanitize), or
#                   profile.csv and profile.md (--profile) instead of the benchmark's files;
#                   the test logs end with their 15 slowest test cases
#   --sanitize      run each gpu test case under compute-sanitizer (memcheck and racecheck)
#                   instead of the tests and benchmarks
#   --suites LIST   benchmark suites (default all: convert,spmm,sddmm,gemm_to_sparse,ffn,training)
#   --quick         small benchmark sizes (a smoke test, not a result)
#   --contract      benchmark only the contract's points (paper shape, M = 4096 and 16384, 0.5 %,
#                   uniform and token-skewed): a short run while iterating on a kernel
#   --arch80        also build for compute_80 alone (the portable mma.sync path, as PTX that the
#                   driver compiles for the GPU at hand: sm_80 machine code does not run on a
#                   Hopper) and run the gpu tests with it
#   --skip-build-80 no sm_80 build (the default)
#   --only-80       the compute_80 build and its gpu tests alone: no sm_90a build, tests or
#                   benchmarks (a portable-path check in ~80 s less device time than --arch80)
#   --skip-tests, --skip-bench   leave out a phase
#   --reps N        timed runs per benchmark case (default 50)
#   --cases RE      only the benchmark cases whose name "SUITE OP VARIANT SHAPE M DISTRIBUTION
#                   DENSITY" matches RE (`twell bench --cases`)
#   --tokens S,L    the benchmark suites' two token counts in place of 4096 and 16384 (`twell bench
#                   --tokens`), e.g. 6144,12288
#   --tests RE      only the gpu test entries whose name matches RE (ctest -R), e.g.
#                   'baselines|converters' to check what a change touched before a full run; the
#                   longest suites run as several entries, gpu_test_ffn and gpu_test_ffn_training
#                   for one (tests/CMakeLists.txt, _twell_shards_*), so 'ffn' takes all of them;
#                   with --test-cases, RE matches the executables' names instead
#   --test-cases F  only the test cases whose names match F, doctest's -tc filter (comma-separated,
#                   * wildcards), e.g. '*GatedUpDownPlan*': each selected executable runs directly,
#                   one after the other, instead of through ctest; a summary line in ctest's words
#   --sanitize-limit S   seconds allowed to the sanitizer phase (default 420): one run per (tool,
#                   test case), TWELL_GPU_CHECK_SANITIZE_JOBS (default 12) at a time
#   --sanitize-tools LIST   compute-sanitizer tools (default racecheck,memcheck); all runs of both
#                   over all suites add up to about 2.5 h: on a lent GPU split them over calls
#                   by group of suites (docs/testing.md)
#   --sanitize-suites RE    only the gpu test executables whose path matches RE (default all)
#   --sanitize-cases RE     only the test cases whose name matches RE (default all)
#   --sanitize-from K       only each suite's K-th case and later ones, K counted in the suite's
#                   whole listing (`gpu_test_X --list-test-cases`, the k-th name is case k; also
#                   with --sanitize-cases): resumes a sweep of one tool that an earlier call's
#                   deadline cut off (runs go tool by tool, each case-major, so with two tools
#                   the second may not have started on the cases below K)
#   --sanitize-parts N   each (tool, case) as N runs, run i with TWELL_TEST_PART=i/N: it takes every
#                   N-th item of the case's outermost sweep (tests/support/sweep.hpp), so a case
#                   too long for one run under racecheck finishes in N side by side (a case
#                   without a sweep runs whole N times: name the long ones with --sanitize-cases;
#                   a part past the items of the case's sweep runs nothing: an "empty part")
#   --profile CASE  instead of the benchmarks: Nsight Compute times every kernel of one bench case,
#                   named by its NVTX range "SUITE OP VARIANT SHAPE M DISTRIBUTION DENSITY", e.g.
#                   "training gated_ffn_training_step twell_plan paper 16384 uniform 0.005"
#                   (docs/benchmarks/README.md, "Profiling one case"), in `twell bench --suite SUITE
#                   --warmup 1 --reps 1 --no-energy --cases '^CASE$'` (CASE's special characters escaped; plus
#                   --contract / --quick / --tokens when given): only that case runs, with the cases it needs
#                   (bench/suites/common.hpp, run_case): profile.csv (ncu's CSV) and profile.md
#                   (each launch's kernel, grid and time, and their sum); the gpu tests do not
#                   run (a second call, or one after, reuses the build)
#   --profile-metrics LIST   with --profile: more Nsight Compute metrics, comma-separated, one
#                   column each in profile.md, e.g. dram__bytes_read.sum,lts__t_bytes.sum,
#                   sm__throughput.avg.pct_of_peak_sustained_elapsed (ncu --query-metrics lists
#                   them; each adds replays of every kernel, so the caches differ between them)
#
# Environment: TWELL_SOURCE_COMMIT names the commit in the benchmarks' JSON where the tree has no
# .git (git's HEAD otherwise); TWELL_GPU_CHECK_TEST_JOBS (default 4) gpu test suites run at once;
# TWELL_GPU_CHECK_BUILD (and TWELL_GPU_CHECK_BUILD_80) put the build folders
# elsewhere, e.g. /tmp/gcb: a folder outside a re-sent source tree survives between two calls on
# the same machine, so "--skip-bench" then "--skip-tests --suites ..." builds only once (one full
# check takes about 60 s to build, 380 s of tests and 400 s of benchmarks on an H200).
#
# Every phase runs even when an earlier one failed (a missing suite or a failing test does not
# stop the benchmarks); the exit status is non-zero if any phase failed. The last lines printed
# are a compact summary.
set -u -o pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out=""
sanitize=0
suites="all"
quick=0
contract=0
arch80=0
only80=0
run_tests=1
run_bench=1
reps=""
tokens=""
sanitize_limit=420
sanitize_jobs="${TWELL_GPU_CHECK_SANITIZE_JOBS:-12}"
sanitize_tools="racecheck,memcheck"
sanitize_suites="."
sanitize_cases="."
sanitize_from=1
sanitize_parts=1
tests_re=""
test_cases=""
cases_re=""
profile_case=""
profile_metrics=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=1 ;;
    --suites) suites="${2:?--suites needs a list}"; shift ;;
    --suites=*) suites="${1#--suites=}" ;;
    --quick) quick=1 ;;
    --contract) contract=1 ;;
    --arch80) arch80=1 ;;
    --skip-build-80) arch80=0; only80=0 ;;
    --only-80) arch80=1; only80=1 ;;
    --skip-tests) run_tests=0 ;;
    --skip-bench) run_bench=0 ;;
    --reps) reps="${2:?--reps needs a number}"; shift ;;
    --cases) cases_re="${2:?--cases needs a pattern}"; shift ;;
    --tokens) tokens="${2:?--tokens needs SMALL,LARGE}"; shift ;;
    --tests) tests_re="${2:?--tests needs a pattern}"; shift ;;
    --test-cases) test_cases="${2:?--test-cases needs a doctest filter}"; shift ;;
    --sanitize-limit) sanitize_limit="${2:?--sanitize-limit needs seconds}"; shift ;;
    --sanitize-tools) sanitize_tools="${2:?--sanitize-tools needs a list}"; shift ;;
    --sanitize-suites) sanitize_suites="${2:?--sanitize-suites needs a pattern}"; shift ;;
    --sanitize-cases) sanitize_cases="${2:?--sanitize-cases needs a pattern}"; shift ;;
    --sanitize-from) sanitize_from="${2:?--sanitize-from needs a case number}"; shift ;;
    --sanitize-parts) sanitize_parts="${2:?--sanitize-parts needs a count}"; shift ;;
    --profile) profile_case="${2:?--profile needs a case name}"; shift ;;
    --profile-metrics) profile_metrics="${2:?--profile-metrics needs a list}"; shift ;;
    -h|--help) sed -n '2,/^[^#]/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) if [ -z "$out" ]; then out="$1"; else echo "gpu-check: two output folders: $out and $1" >&2; exit 2; fi ;;
  esac
  shift
done
if ! [[ "$sanitize_from" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu-check: --sanitize-from needs a case number (1 or more), not '$sanitize_from'" >&2
  exit 2
fi
if ! [[ "$sanitize_parts" =~ ^[1-9][0-9]?$ ]]; then
  echo "gpu-check: --sanitize-parts needs a count from 1 to 99, not '$sanitize_parts'" >&2
  exit 2
fi
if [ -n "$profile_metrics" ] && [ -z "$profile_case" ]; then
  echo "gpu-check: --profile-metrics needs --profile CASE" >&2
  exit 2
fi
if [ -n "$profile_case" ]; then run_tests=0; fi  # a profile call is for the profile: tests in another
[ -n "$out" ] || out="$root/build/gpu-check"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/gpu-check.log"
: >"$log"

# The build folders can be moved (e.g. to reuse an existing build) through the environment.
build="${TWELL_GPU_CHECK_BUILD:-$root/build/gpu-check-build}"
build80="${TWELL_GPU_CHECK_BUILD_80:-$root/build/gpu-check-build-80}"
jobs="${TWELL_GPU_CHECK_JOBS:-16}"
test_jobs="${TWELL_GPU_CHECK_TEST_JOBS:-4}"
summary=()
failed=0
# The commit the benchmarks' JSON names (meta.source_commit): from git where the tree is a clone,
# else as the caller exported it (a copied working tree has no .git), with "+changes" when the
# tracked files differ from it.
if [ -z "${TWELL_SOURCE_COMMIT:-}" ] && git -C "$root" rev-parse HEAD >/dev/null 2>&1; then
  TWELL_SOURCE_COMMIT="$(git -C "$root" rev-parse --short=12 HEAD)"
  git -C "$root" diff --quiet HEAD -- 2>/dev/null || TWELL_SOURCE_COMMIT+="+changes"
fi
export TWELL_SOURCE_COMMIT="${TWELL_SOURCE_COMMIT:-unknown}"

say() { echo "$*" | tee -a "$log"; }
now() { date +%s; }
# phase NAME STATUS SECONDS DETAIL: one summary line per phase.
phase() {
  local line
  line=$(printf '%-14s %-7s %5ss  %s' "$1" "$2" "$3" "$4")
  summary+=("$line")
  say "== $line"
  [ "$2" = "ok" ] || [ "$2" = "skipped" ] || failed=1
}

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"

configure_and_build() {  # DIR ARCHS
  local dir="$1" archs="$2"
  cmake -S "$root" -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTWELL_WITH_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc_bin" -DCMAKE_CUDA_ARCHITECTURES="$archs" \
    >>"$log" 2>&1 || return 1
  cmake --build "$dir" -j "$jobs" >>"$log" 2>&1
}

# The gpu test suites, all or those --tests names, side by side: most of their time is the CPU
# reference on the host's cores. Each case's time (doctest's --duration, asked for through
# TWELL_TEST_DURATIONS: tests/support/test_main.cpp) goes into the log's closing list of the
# slowest cases, so that device time spent on tests can be traced to them.
run_gpu_tests() {  # BUILD_DIR LOG
  local rc=0 durations
  if [ -n "$test_cases" ]; then
    TWELL_TEST_DURATIONS=1 run_gpu_test_cases "$@" || rc=$?
    durations="$2"
  else
    local select=()
    [ -n "$tests_re" ] && select=(-R "$tests_re" --no-tests=error)  # a pattern matching nothing fails
    (cd "$1" && TWELL_TEST_DURATIONS=1 ctest -L gpu "${select[@]}" -j "$test_jobs" --output-on-failure --timeout 300) \
      >"$2" 2>&1 || rc=$?
    durations="$1/Testing/Temporary/LastTest.log"
  fi
  local slowest
  slowest="$(slowest_cases "$durations" 15)"
  [ -n "$slowest" ] && printf '\nslowest gpu test cases (doctest --duration, seconds):\n%s\n' "$slowest" >>"$2"
  return $rc
}

# The N slowest test cases among doctest's "SECONDS s: NAME" lines in FILE, each with its suite:
# ctest's LastTest.log names a suite by "K/N Testing: NAME" before its output,
# run_gpu_test_cases's log by "== NAME -tc=...".
slowest_cases() {  # FILE N
  [ -f "$1" ] || return 0
  awk '/^[0-9]+\/[0-9]+ Testing: /{suite=$3} /^== gpu_test_/{suite=$2}
       /^[0-9]+\.[0-9]+ s: /{t=$1; sub(/^[0-9.]+ s: /, ""); printf "%8.1f  %s: %s\n", t, suite, $0}' "$1" |
    sort -rn | head -n "$2"
}

# --test-cases: the selected gpu test executables (all, or those --tests matches), each run with
# doctest's -tc filter; ends with a ctest-like summary line over the executables that ran a case.
# None running a case is a failure, as ctest's --no-tests=error.
run_gpu_test_cases() {  # BUILD_DIR LOG
  local exe name ran=0 failed_runs=0 cases failed_names=()
  : >"$2"
  for exe in "$1"/tests/gpu_test_*; do
    [ -x "$exe" ] || continue
    name=$(basename "$exe")
    if [ -n "$tests_re" ] && ! [[ "$name" =~ $tests_re ]]; then continue; fi
    cases=$("$exe" --list-test-cases -tc="$test_cases" 2>/dev/null | grep -c -v -e '^===' -e '^\[doctest\]' -e '^$')
    [ "$cases" -gt 0 ] || continue
    echo "== $name -tc='$test_cases' ($cases test cases)" >>"$2"
    local status=0
    "$exe" -tc="$test_cases" >>"$2" 2>&1 || status=$?
    [ "$status" = 77 ] && continue  # no GPU visible: skipped, as ctest's SKIP_RETURN_CODE
    ran=$((ran + 1))
    if [ "$status" != 0 ]; then
      failed_runs=$((failed_runs + 1))
      failed_names+=("$ran - $name (Failed)")
    fi
  done
  if [ "$ran" = 0 ]; then
    echo "No tests were found: no gpu test case matches '$test_cases' (or no GPU is visible)" >>"$2"
    return 1
  fi
  echo "$(( (ran - failed_runs) * 100 / ran ))% tests passed, $failed_runs tests failed out of $ran" >>"$2"
  [ "$failed_runs" = 0 ] && return 0
  printf 'The following tests FAILED:\n' >>"$2"
  printf '\t%s\n' "${failed_names[@]}" >>"$2"
  return 1
}

# ctest's own summary line, e.g. "100% tests passed, 0 tests failed out of 12".
tests_line() { grep -E 'tests passed|No tests were found' "$1" | tail -1; }

say "gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ), repository $root (commit $TWELL_SOURCE_COMMIT), output $out"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,persistence_mode \
    --format=csv 2>&1 | tee -a "$log"
else
  say "nvidia-smi: not found"
fi
say "cmake: $(cmake --version | head -1); nvcc: $("$nvcc_bin" --version 2>/dev/null | tail -1)"

t0=$(now)
if [ "$only80" = 1 ]; then
  phase build skipped 0 "sm_90a (--only-80)"
  built=0
elif configure_and_build "$build" "90a-real"; then
  phase build ok $(( $(now) - t0 )) "sm_90a, $build"
  built=1
else
  phase build FAILED $(( $(now) - t0 )) "see gpu-check.log"
  tail -30 "$log"
  built=0
fi

if [ "$built" = 1 ] && [ "$sanitize" = 1 ]; then
  t0=$(now)
  slog="$out/sanitizer.log"
  : >"$slog"
  if ! command -v compute-sanitizer >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    PATH="/usr/local/cuda/bin:$PATH"
  fi
  # One compute-sanitizer run per (tool, test case), many side by side: a whole suite under a
  # tool takes longer than a device call may last, most of it the CPU reference and the
  # sanitizer's host-side work, so cases share the one GPU. doctest's --first/--last select the
  # k-th case; TWELL_TEST_SWEEP=reduced trims the widest sweeps (tests/support/sweep.hpp).
  # racecheck reports hazards inside cuSPARSE's and cuBLAS's kernels that are not ours to fix
  # (restricting it with --kernel-name instead made racecheck crash in cuBLAS launches), so a
  # run whose hazards all lie there and whose test passed counts as clean for twell, apart.
  # Runs still going at the deadline are stopped and reported as such; none counts as clean.
  parts="$(mktemp -d)"
  deadline=$(( $(now) + sanitize_limit ))
  # Tool-major (racecheck, the slower, first), then case-major: the first cases of each suite
  # (their widest sweeps) start early, so the long runs do not all begin near the deadline.
  # The cases that fill twell's pool with nearly all of the device's memory (the whole_device
  # shards of tests/CMakeLists.txt, which ctest runs alone) fail their neighbours' allocations and
  # their own checks of the pool's size when others run beside them: they run after the others,
  # one at a time (`alone`).
  alone_phrase="while twell's pool keeps"
  runs=()
  alone=()
  exes=$(find "$build/tests" -maxdepth 1 -type f -executable -name 'gpu_test_*' | grep -E "$sanitize_suites" | sort)
  # The k-th case of doctest's listing is the one --first=k --last=k runs (both in file order).
  most=0
  declare -A cases alone_cases
  for exe in $exes; do
    listing=$("$exe" --list-test-cases 2>/dev/null | sed -n '3,$p' | grep -v -e '^===' -e '^\[doctest\]' |
              grep -n -E -e "$sanitize_cases" | awk -F: -v from="$sanitize_from" '$1 >= from')
    cases[$exe]=$(printf '%s\n' "$listing" | grep -v -F -e "$alone_phrase" | cut -d: -f1 | tr '\n' ' ')
    alone_cases[$exe]=$(printf '%s\n' "$listing" | grep -F -e "$alone_phrase" | cut -d: -f1 | tr '\n' ' ')
    set -- ${cases[$exe]}
    [ $# -gt "$most" ] && most=$#
  done
  for tool in ${sanitize_tools//,/ }; do
    for i in $(seq 1 "$most"); do
      for exe in $exes; do
        set -- ${cases[$exe]}
        if [ "$i" -le $# ]; then
          for p in $(seq 0 $((sanitize_parts - 1))); do runs+=("$tool $exe ${!i} $p/$sanitize_parts"); done
        fi
      done
    done
    for exe in $exes; do
      for k in ${alone_cases[$exe]}; do
        for p in $(seq 0 $((sanitize_parts - 1))); do alone+=("$tool $exe $k $p/$sanitize_parts"); done
      done
    done
  done
  # The name of a run in the log and in the summary: "TOOL SUITE case K" (", part I/N" with parts).
  run_name() {
    local name="$1 $(basename "$2") case $3"
    [ "${4#*/}" = 1 ] || name+=", part $4"
    echo "$name"
  }
  run_file() { echo "$1-$(basename "$2")-$(printf %03d "$3")-${4%/*}"; }
  export -f run_name run_file
  sanitize_one() {  # TOOL EXE CASE I/N PARTS DEADLINE: writes PARTS/TOOL-NAME-CASE-I.log and .rc
    local part="$5/$(run_file "$1" "$2" "$3" "$4")" left=$(( $6 - $(date +%s) ))
    echo "=== $(run_name "$1" "$2" "$3" "$4")" >"$part.log"
    if [ "$left" -lt 10 ]; then echo "=== not run: deadline" >>"$part.log"; echo deadline >"$part.rc"; return; fi
    local start=$(date +%s)
    TWELL_TEST_SWEEP=reduced TWELL_TEST_PART="$4" timeout "$left" compute-sanitizer --tool "$1" --error-exitcode 99 \
      "$2" --first="$3" --last="$3" >>"$part.log" 2>&1
    local rc=$?
    # Hazards that racecheck reports only inside cuSPARSE/cuBLAS kernels, in a run whose test
    # passed: clean as far as twell's kernels go, counted apart.
    if [ "$1" = racecheck ] && [ $rc -eq 99 ] && grep -q 'Status: SUCCESS!' "$part.log" &&
       ! grep -q 'Internal Sanitizer Error' "$part.log" && ! grep 'Race reported' "$part.log" | grep -q 'twell::'; then
      rc=vendor
    fi
    # memcheck reports every failing CUDA call, including the out-of-memory answers that the
    # device-pool tests provoke on purpose (and that twell turns into out_of_memory or a
    # trim-and-retry): a passing run whose only errors are those counts as clean, apart.
    if [ "$1" = memcheck ] && [ $rc -eq 99 ] && grep -q 'Status: SUCCESS!' "$part.log"; then
      local errors oom
      errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$part.log" | tail -1)
      oom=$(grep -c 'Program hit cudaErrorMemoryAllocation' "$part.log")
      [ -n "$errors" ] && [ "$errors" = "$oom" ] && rc=oom
    fi
    # A part of a sweep with fewer items than parts runs nothing (doctest counts no assertion):
    # clean, but counted apart so that the summary does not pass it off as a checked share.
    if [ "${4#*/}" != 1 ] && [ "$rc" = 0 ] && grep -q -E '^\[doctest\] assertions: +0 \|' "$part.log"; then
      rc=empty
    fi
    echo "=== $(run_name "$1" "$2" "$3" "$4"): exit $rc after $(( $(date +%s) - start ))s" >>"$part.log"
    [ "$rc" = 124 ] && echo "=== stopped at the deadline" >>"$part.log"
    echo "$rc" >"$part.rc"
  }
  export -f sanitize_one
  [ ${#runs[@]} -eq 0 ] || printf '%s\n' "${runs[@]}" |
    xargs -P "$sanitize_jobs" -I{} bash -c 'sanitize_one $1 $2 $3 $4 "$5" "$6"' _ {} "$parts" "$deadline"
  [ ${#alone[@]} -eq 0 ] || printf '%s\n' "${alone[@]}" |
    xargs -P 1 -I{} bash -c 'sanitize_one $1 $2 $3 $4 "$5" "$6"' _ {} "$parts" "$deadline"
  runs+=("${alone[@]}")
  bad=0; unfinished=0; vendor=0; oom=0; empty=0; n=${#runs[@]}
  for run in "${runs[@]}"; do
    set -- $run
    part="$parts/$(run_file "$1" "$2" "$3" "$4")"
    cat "$part.log" >>"$slog"
    rc=$(cat "$part.rc" 2>/dev/null || echo missing)
    case "$rc" in
      0|77) ;;  # 77: the suite skipped itself (no GPU)
      vendor) vendor=$((vendor + 1)) ;;
      oom) oom=$((oom + 1)) ;;
      empty) empty=$((empty + 1)) ;;
      124|deadline) unfinished=$((unfinished + 1)); say "sanitizer: $(run_name "$1" "$2" "$3" "$4") unfinished ($rc)" ;;
      *) bad=$((bad + 1)); say "sanitizer: $(run_name "$1" "$2" "$3" "$4") exit $rc" ;;
    esac
  done
  rm -rf "$parts"
  what="test case x tool"
  empties=""
  if [ "$sanitize_parts" != 1 ]; then
    what="test case x tool x part, $sanitize_parts parts"
    empties=", $empty empty parts (the case's outermost sweep has fewer items than parts)"
  fi
  detail="$((n - bad - unfinished)) of $n runs ($what) clean ($vendor of them with racecheck hazards in cuSPARSE/cuBLAS kernels only, $oom with memcheck reporting only provoked out-of-memory answers$empties), $bad with errors, $unfinished unfinished, $sanitize_jobs at a time (${#alone[@]} alone, after the others); sanitizer.log"
  if [ "$n" = 0 ]; then
    phase sanitizer FAILED $(( $(now) - t0 )) "no test case selected (--sanitize-suites, --sanitize-cases, --sanitize-from)"
  elif [ "$bad" = 0 ] && [ "$unfinished" = 0 ]; then
    phase sanitizer ok $(( $(now) - t0 )) "$detail"
  elif [ "$bad" = 0 ]; then
    phase sanitizer PARTIAL $(( $(now) - t0 )) "$detail"
  else
    phase sanitizer FAILED $(( $(now) - t0 )) "$detail"
  fi
  run_tests=0
  run_bench=0
fi

if [ "$built" = 1 ] && [ "$run_tests" = 1 ]; then
  t0=$(now)
  run_gpu_tests "$build" "$out/gpu-tests.log"
  rc=$?
  line="$(tests_line "$out/gpu-tests.log")"
  [ $rc -eq 0 ] && st=ok || st=FAILED
  phase gpu-tests $st $(( $(now) - t0 )) "${line:-no ctest summary}; gpu-tests.log"
  [ $rc -eq 0 ] || grep -E '^\s*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)' "$out/gpu-tests.log" | head -10 | tee -a "$log"
else
  phase gpu-tests skipped 0 ""
fi

if [ "$arch80" = 1 ]; then
  t0=$(now)
  if configure_and_build "$build80" "80"; then
    run_gpu_tests "$build80" "$out/gpu-tests-80.log"
    rc=$?
    line="$(tests_line "$out/gpu-tests-80.log")"
    [ $rc -eq 0 ] && st=ok || st=FAILED
    phase sm80-tests $st $(( $(now) - t0 )) "${line:-no ctest summary}; gpu-tests-80.log"
  else
    phase sm80-tests FAILED $(( $(now) - t0 )) "sm_80 build failed; see gpu-check.log"
  fi
fi

if [ "$built" = 1 ] && [ "$sanitize" = 0 ] && [ -n "$profile_case" ]; then
  t0=$(now)
  if ! command -v ncu >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/ncu ]; then
    PATH="/usr/local/cuda/bin:$PATH"
  fi
  scratch_json="$(mktemp)"
  # Only the profiled case runs: its name as a literal pattern.
  literal=$(printf '%s' "$profile_case" | sed 's/[][\\.*^$+?(){}|]/\\&/g')
  args=(bench --suite "${profile_case%% *}" --warmup 1 --reps 1 --no-energy --cases "^$literal\$" --out "$scratch_json")
  [ "$quick" = 1 ] && args+=(--quick)
  [ "$contract" = 1 ] && args+=(--contract)
  [ -n "$tokens" ] && args+=(--tokens "$tokens")
  # Clocks left alone (never change the GPU's settings); caches as the previous kernel left them.
  ncu --clock-control none --cache-control none --nvtx --nvtx-include "$profile_case/" \
    --metrics "gpu__time_duration.sum${profile_metrics:+,$profile_metrics}" --csv "$build/tools/twell" "${args[@]}" >"$out/profile.csv" 2>>"$log"
  rc=$?
  rm -f "$scratch_json"
  # The range holds the warm-up run and the timed one.
  detail=$(python3 "$root/scripts/ncu_summary.py" "$out/profile.csv" "$out/profile.md" "$profile_case" 2 2>>"$log")
  [ $rc -eq 0 ] && [ -n "$detail" ] && st=ok || st=FAILED
  phase profile $st $(( $(now) - t0 )) "${detail:-no summary}; profile.csv, profile.md"
  run_bench=0
fi

# An earlier call's results in OUTDIR must not pass for this one's (twell writes bench.json only
# when it finishes, and a failed build runs no bench).
if [ "$run_bench" = 1 ]; then rm -f "$out/bench.json" "$out/bench-summary.md" "$out/speedup.png"; fi
if [ "$built" = 1 ] && [ "$run_bench" = 1 ]; then
  t0=$(now)
  args=(bench --suite "$suites" --out "$out/bench.json")
  [ "$quick" = 1 ] && args+=(--quick)
  [ "$contract" = 1 ] && args+=(--contract)
  [ -n "$reps" ] && args+=(--reps "$reps")
  [ -n "$cases_re" ] && args+=(--cases "$cases_re")
  [ -n "$tokens" ] && args+=(--tokens "$tokens")
  # The full table goes to the log; the console gets the per-suite lines.
  "$build/tools/twell" "${args[@]}" >>"$log" 2>&1
  rc=$?
  grep -E '^twell bench: (suite|ceilings|nothing)' "$log" | tail -8
  if [ -s "$out/bench.json" ]; then
    cases=$(grep -o '"status": "ok"' "$out/bench.json" | wc -l)
    other=$(grep -o '"status": "\(not built\|failed\|skipped\)' "$out/bench.json" | wc -l)
    detail="$cases cases ok, $other not run; bench.json"
  else
    detail="no bench.json"
  fi
  [ $rc -eq 0 ] && st=ok || st=FAILED
  phase bench $st $(( $(now) - t0 )) "$detail"

  t0=$(now)
  if [ -s "$out/bench.json" ]; then
    python3 "$root/bench/plot.py" "$out/bench.json" --out "$out" --single --summary "$out/bench-summary.md" >>"$log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && st=ok || st=FAILED
    phase plots $st $(( $(now) - t0 )) "speedup.png, bench-summary.md"
  else
    phase plots skipped 0 "no bench.json"
  fi
fi

echo
echo "gpu-check summary ($out):"
for line in "${summary[@]}"; do echo "  $line"; done
if [ "$run_bench" = 1 ] && [ -s "$out/bench-summary.md" ]; then
  # The contract rows of this call's summary: the numbers the lead needs first.
  sed -n '/^| measure/,/^$/p' "$out/bench-summary.md"
fi
exit $failed
