#!/usr/bin/env bash
# Fuzzes the file readers, validate() and the twell program's command line (fuzz_args) with
# libFuzzer: configures a separate clang build with -fsanitize=fuzzer-no-link,address,undefined on
# the whole library, writes a seed corpus, and runs each target for FUZZ_SECONDS (default 60).
# Exit status 1 when any target finds a crash, a sanitizer report, a leak or a broken round trip
# (or, for fuzz_args, a parse that breaks its promises); the reproducer is left in FUZZ_DIR/crashes.
#
#   scripts/fuzz.sh                       # all five targets, 60 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh twell   # one target, longer
#
# Environment: FUZZ_SECONDS, FUZZ_BUILD (build directory, default build/fuzz), FUZZ_DIR (corpora
# and crashes, default $FUZZ_BUILD/work), FUZZ_JOBS (build parallelism, default 2), CXX (clang++).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${FUZZ_SECONDS:-60}"
build="${FUZZ_BUILD:-$root/build/fuzz}"
work="${FUZZ_DIR:-$build/work}"
jobs="${FUZZ_JOBS:-2}"
cxx="${CXX:-clang++}"
case "$cxx" in *clang++*) ;; *) cxx=clang++ ;; esac
command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found; libFuzzer needs clang" >&2; exit 2; }

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(mtx npy twell validate args)

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DTWELL_WITH_CUDA=OFF -DTWELL_BUILD_FUZZERS=ON -DTWELL_BUILD_TESTS=ON -DTWELL_BUILD_TOOLS=OFF \
  -DTWELL_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz_make_seeds $(printf 'fuzz_%s ' "${targets[@]}")

mkdir -p "$work/crashes"
"$build/tests/fuzz/fuzz_make_seeds" "$work/seeds" >/dev/null
status=0
for t in "${targets[@]}"; do
  corpus="$work/corpus_$t"
  mkdir -p "$corpus"
  log="$work/fuzz_$t.log"
  echo "== fuzz_$t: ${seconds}s"
  if UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      "$build/tests/fuzz/fuzz_$t" "$corpus" "$work/seeds/$t" -max_total_time="$seconds" -max_len=65536 \
      -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 -artifact_prefix="$work/crashes/${t}_" >"$log" 2>&1; then
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" | sed 's/^/   /'
    echo "   corpus: $(ls "$corpus" | wc -l) inputs"
  else
    status=1
    echo "   FAILED: see $log and $work/crashes/" >&2
    grep -E "ERROR|runtime error|fuzz invariant|SUMMARY" "$log" | head -5 >&2 || true
  fi
done
exit $status
