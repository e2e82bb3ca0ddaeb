# Exit statuses and messages of the twell program: run by ctest as
#   cmake -DTWELL=<path to twell> -P cli_test.cmake
# Each case runs the program and checks its exit status and a fragment of its output.

# Runs twell with ARGN; sets rc, out, err and cmdline in the caller's scope.
function(run_twell)
  execute_process(COMMAND ${TWELL} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REPLACE ";" " " cmdline "${ARGN}")
  set(rc "${rc}" PARENT_SCOPE)
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
  set(cmdline "${cmdline}" PARENT_SCOPE)
endfunction()

function(expect status fragment)
  run_twell(${ARGN})
  if(NOT rc STREQUAL "${status}")
    message(FATAL_ERROR "twell ${cmdline}: exit status ${rc}, expected ${status}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  string(FIND "${out}${err}" "${fragment}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "twell ${cmdline}: output lacks '${fragment}'\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  message(STATUS "ok: twell ${cmdline} -> ${rc}")
endfunction()

# Like expect, but the fragment must appear exactly `count` times in the output (0: never).
function(expect_count status fragment count)
  run_twell(${ARGN})
  set(rest "${out}${err}")
  set(found 0)
  string(LENGTH "${fragment}" length)
  string(FIND "${rest}" "${fragment}" at)
  while(NOT at EQUAL -1)
    math(EXPR found "${found} + 1")
    math(EXPR at "${at} + ${length}")
    string(SUBSTRING "${rest}" ${at} -1 rest)
    string(FIND "${rest}" "${fragment}" at)
  endwhile()
  if(NOT rc STREQUAL "${status}" OR NOT found EQUAL count)
    message(FATAL_ERROR "twell ${cmdline}: exit status ${rc} (expected ${status}), '${fragment}' ${found} times "
                        "(expected ${count})\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  message(STATUS "ok: twell ${cmdline} -> ${rc}, '${fragment}' ${found} times")
endfunction()

expect(0 "demo" --help)
expect(2 "usage: twell <command>")
expect(2 "unknown command 'frobnicate'" frobnicate)
expect(0 "--distribution" demo --help)
expect(2 "unknown option '--bogus'" demo --bogus 1)
expect(2 "--tokens expects an integer, got '12x'" demo --tokens 12x)
expect(2 "--density = 2 is outside" demo --density 2)
expect(2 "needs a value" demo --seed)
expect(2 "given twice" demo --seed 1 --seed=2)
expect(2 "expected 0 positional arguments" demo extra)
expect(2 "'gpt' is not one of paper, llama7b, small" demo --shape gpt)
expect(2 "is not one of uniform" demo --distribution zipf)
# Option values the library refuses are usage errors too, found before any work is done.
expect(2 "does not divide layout.tile = 256" demo --shape small --tokens 64 --tile 256 --compression 512)
# The whole demo on a small workload: every format, validation, spmm and the FFN.
expect(0 "relative difference" demo --shape small --tokens 128 --repeats 1 --density 0.01)
expect(0 "Hybrid(128, 4)" demo --shape small --tokens 128 --repeats 1 --dtype fp32 --tile 128 --compression 4
       --distribution uniform --seed 7)
expect(2 "needs more than 90 % of the live units" demo --shape small --tokens 64 --density 0.9)
expect(2 "needs more than 90 % of the live units" generate "${CMAKE_CURRENT_BINARY_DIR}/cli_test_unwritten.npy" --shape small --tokens 64 --density 0.9)
# The output's extension sets the format as in convert: .mtx holds CSR, .npy dense.
expect(0 "bf16 csr to" generate "${CMAKE_CURRENT_BINARY_DIR}/cli_test_generated.mtx" --shape small --tokens 64)
expect(2 "a .npy file holds dense matrices; use a .twell output for --to csr" generate "${CMAKE_CURRENT_BINARY_DIR}/cli_test_unwritten.npy" --shape small --tokens 64 --to csr)
# generate -> stats: a workload written to a file and read back by another subcommand.
set(generated "${CMAKE_CURRENT_BINARY_DIR}/cli_test_generated.twell")
expect(0 "wrote 256 x 2816 bf16 hybrid" generate "${generated}" --shape small --tokens 256 --to hybrid)
expect(0 "matrix 256 x 2816 bf16" stats "${generated}")
# Candidate layouts from the command line: tile 64 with C 4 (S = 16) is listed, C 64 skipped there.
expect(0 "    64   4    16" stats "${generated}" --tiles 64,512 --compressions 4,64)
expect(2 "--tiles expects an integer, got ''" stats "${generated}" --tiles 64,,128)
expect(2 "candidate C = 3 is not a power of two" stats "${generated}" --compressions 3)
expect(2 "layout.tile = 12 must be a multiple of 8" stats "${generated}" --tiles 12)
# --tile 8 takes C 4 for its TwELL bytes line (C 8 would leave one slot); no candidate is said.
expect(0 "TwELL (8, 4)" stats "${generated}" --tile 8)
expect(0 "(the default layout: no candidate layout)" stats "${generated}" --tiles 8 --compressions 8)
# A twell::Error from the library: one line naming what is wrong, exit status 1.
expect(1 "error (io)" stats "${CMAKE_CURRENT_BINARY_DIR}/cli_test_missing.npy")
# (40, 16) cannot exist (16 does not divide 40): only (40, 8) is listed and recommended.
expect(0 "recommended layout: tile 40, C 8" stats "${generated}" --tiles 40 --compressions 8,16)
expect(2 "is not one of" generate "${generated}" --to coo)
# bench --cases: a pattern that is not a regular expression is a usage error, before any GPU work.
expect(2 "'spmm (twell' is not an ECMAScript regular expression" bench --cases "spmm (twell")
# bench --tokens: two counts, the first smaller, each in [1, 131072]; refused before any GPU work.
expect(2 "must be two token counts SMALL,LARGE with SMALL < LARGE" bench --tokens 4096)
expect(2 "must be two token counts SMALL,LARGE with SMALL < LARGE" bench --tokens 8192,4096)
expect(2 "must be two token counts SMALL,LARGE with SMALL < LARGE" bench --tokens 1,2,3)
expect(2 "--tokens = 200000 is outside [1, 131072]" bench --tokens 4096,200000)
expect(2 "must be two token counts SMALL,LARGE with SMALL < LARGE" bench --tokens 4096,4096)
# A valid pair passes the parse: the bad --cases after it is what stops the run.
expect(2 "'spmm (twell' is not an ECMAScript regular expression" bench --tokens 6144,131072 --cases "spmm (twell")
# std::regex compiles recursively (40000 nested groups overflowed the stack: a segfault) and reads
# counts without an overflow check (fuzz_args found `\2222...`): both are refused before it runs.
expect(2 "holds a number of more than 9 digits" bench --cases "spmm \\2222222222222222222222")
string(REPEAT "(" 40000 nested)
execute_process(COMMAND ${TWELL} bench --cases "${nested}" RESULT_VARIABLE rc ERROR_VARIABLE err)
string(FIND "${err}" "the pattern has 40000 characters; at most 1000 are accepted" at)
if(NOT rc STREQUAL "2" OR at EQUAL -1)
  message(FATAL_ERROR "twell bench --cases <40000 '('>: exit status ${rc}, expected 2\nstderr:\n${err}")
endif()
message(STATUS "ok: twell bench --cases <40000 '('> -> ${rc}")
file(REMOVE "${generated}")

# convert --dtype: a value beyond the narrower type is an error naming the element (from .mtx
# text, its line), exit 1, and nothing is written; a nonzero that rounds to zero is dropped and
# counted, whichever file it comes from.
set(big_mtx "${CMAKE_CURRENT_BINARY_DIR}/cli_test_big.mtx")
set(big_npy "${CMAKE_CURRENT_BINARY_DIR}/cli_test_big.npy")
set(narrowed "${CMAKE_CURRENT_BINARY_DIR}/cli_test_narrowed.npy")
file(WRITE "${big_mtx}" "%%MatrixMarket matrix coordinate real general\n2 3 3\n1 2 1e6\n2 1 1e-30\n2 3 0.5\n")
expect(0 "3 values stored" convert "${big_mtx}" "${big_npy}")
expect(1 "row 0, column 1: value 1e+06 is outside the finite range of fp16" convert "${big_npy}" "${narrowed}" --dtype fp16)
expect(1 "line 3 (byte 56): value 1e6 is outside the finite range of fp16" convert "${big_mtx}" "${narrowed}" --dtype fp16)
if(EXISTS "${narrowed}")
  message(FATAL_ERROR "twell convert wrote ${narrowed} although a value did not fit fp16")
endif()
set(tiny_mtx "${CMAKE_CURRENT_BINARY_DIR}/cli_test_tiny.mtx")
file(WRITE "${tiny_mtx}" "%%MatrixMarket matrix coordinate real general\n2 3 2\n2 1 1e-30\n2 3 0.5\n")
expect(0 "1 values stored, 1 values became zero in fp16" convert "${tiny_mtx}" "${narrowed}" --dtype fp16)
# A layout option is checked even where the output format does not use it.
expect(2 "layout.tile = 12 must be a multiple of 8" convert "${tiny_mtx}" "${narrowed}" --tile 12)
expect(2 "--ell-width sets the width of an ELL output, but this command writes dense" convert "${tiny_mtx}" "${narrowed}" --ell-width 5)
file(REMOVE "${big_mtx}" "${big_npy}" "${narrowed}" "${tiny_mtx}")

# stats --png with stdout a pipe: the report is printed once, not again by each python probe's
# fork (whether or not a python with matplotlib is found, the report comes first and once).
set(small_mtx "${CMAKE_CURRENT_BINARY_DIR}/cli_test_small.mtx")
set(small_png "${CMAKE_CURRENT_BINARY_DIR}/cli_test_small.png")
file(WRITE "${small_mtx}" "%%MatrixMarket matrix coordinate real general\n3 4 3\n1 1 1.5\n2 3 -2\n3 4 7\n")
expect_count(0 "recommended layout" 1 stats "${small_mtx}" --png "${small_png}")
file(REMOVE "${small_png}")

# Standard output that cannot be written (a full disk) is a failure, exit 1, whatever printed it.
if(EXISTS /dev/full)
  foreach(args IN ITEMS "--help" "stats;${small_mtx}" "validate;${small_mtx}")
    execute_process(COMMAND ${TWELL} ${args} OUTPUT_FILE /dev/full RESULT_VARIABLE rc ERROR_VARIABLE err)
    string(REPLACE ";" " " cmdline "${args}")
    string(FIND "${err}" "error writing standard output: No space left on device" at)
    if(NOT rc STREQUAL "1" OR at EQUAL -1)
      message(FATAL_ERROR "twell ${cmdline} > /dev/full: exit status ${rc}, expected 1\nstderr:\n${err}")
    endif()
    message(STATUS "ok: twell ${cmdline} > /dev/full -> ${rc}")
  endforeach()
endif()

# bench --out writes through twell::write_file like every other output: a file it cannot replace
# is an error, and "wrote" is said only after a write that succeeded. Only where no GPU is visible
# (bench then measures nothing, exit 1, at once); with one it would run the suites.
execute_process(COMMAND ${TWELL} --version OUTPUT_VARIABLE version)
string(FIND "${version}" "device visible" gpu_visible)
if(gpu_visible EQUAL -1)
  if(EXISTS /dev/full)
    expect(1 "cannot write '/dev/full': not a regular file" bench --quick --out /dev/full)
    expect_count(1 "twell bench: wrote" 0 bench --quick --out /dev/full)
  endif()
  set(bench_json "${CMAKE_CURRENT_BINARY_DIR}/cli_test_bench.json")
  expect(1 "twell bench: wrote ${bench_json}" bench --quick --out "${bench_json}")
  file(REMOVE "${bench_json}")
endif()

# stats --json / --png never overwrite the input, nor each other, however the path is spelt;
# nothing is written.
get_filename_component(bindir_name "${CMAKE_CURRENT_BINARY_DIR}" NAME)
set(small_json "${CMAKE_CURRENT_BINARY_DIR}/cli_test_small.json")
expect(2 "--json '${small_mtx}' names the input file" stats "${small_mtx}" --json "${small_mtx}")
expect(2 "names the input file" stats "${small_mtx}"
       --png "${CMAKE_CURRENT_BINARY_DIR}/../${bindir_name}/./cli_test_small.mtx")
expect(2 "--json and --png name the same file" stats "${small_mtx}" --json "${small_json}" --png "${small_json}")
expect(0 "recommended layout" stats "${small_mtx}")
file(REMOVE "${small_json}")

# On a terminal the progress line is erased before the results are printed, not left in front of
# their first line. `script` gives twell a terminal; TWELL_PROGRESS=always draws from the start.
find_program(SCRIPT_PROGRAM script)
if(SCRIPT_PROGRAM)
  string(ASCII 27 escape)
  set(small_npy "${CMAKE_CURRENT_BINARY_DIR}/cli_test_small.npy")
  foreach(args IN ITEMS "convert '${small_mtx}' '${small_npy}'" "stats '${small_mtx}'" "validate '${small_mtx}'")
    execute_process(COMMAND ${SCRIPT_PROGRAM} -qec "TWELL_PROGRESS=always '${TWELL}' ${args}" /dev/null
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    string(FIND "${out}" "\r${escape}[K${small_mtx}" at)
    if(NOT rc STREQUAL "0" OR at EQUAL -1)
      message(FATAL_ERROR "twell ${args} on a terminal: exit status ${rc}, the output does not start on a "
                          "cleared line:\n${out}")
    endif()
    message(STATUS "ok: twell ${args} on a terminal -> ${rc}")
  endforeach()
  file(REMOVE "${small_npy}")
endif()

# validate: a file past a reader's memory limit cannot be checked; it is not called invalid.
set(tall_mtx "${CMAKE_CURRENT_BINARY_DIR}/cli_test_tall.mtx")
file(WRITE "${tall_mtx}" "%%MatrixMarket matrix coordinate real general\n200000000 1000 1\n1 1 1\n")
expect(1 "cli_test_tall.mtx: cannot check (out_of_memory):" validate "${tall_mtx}")
expect(1 "cli_test_small.mtx: invalid (io)" validate "${CMAKE_CURRENT_BINARY_DIR}/missing/cli_test_small.mtx")
file(REMOVE "${tall_mtx}")

# convert: explicit zeros of a .mtx are dropped (twell stores none) and the summary says so.
set(zeros_mtx "${CMAKE_CURRENT_BINARY_DIR}/cli_test_zeros.mtx")
set(zeros_npy "${CMAKE_CURRENT_BINARY_DIR}/cli_test_zeros.npy")
file(WRITE "${zeros_mtx}" "%%MatrixMarket matrix coordinate real general\n2 3 4\n1 1 1\n1 2 0\n2 3 -2\n2 1 -0\n")
expect(0 "2 values stored, 2 explicit zeros dropped" convert "${zeros_mtx}" "${zeros_npy}")
file(REMOVE "${zeros_mtx}" "${zeros_npy}")

# An option that would have no effect is refused (exit 2, naming it and why), like --ell-width for
# an output that is not ELL: nothing is written.
set(unused_out "${CMAKE_CURRENT_BINARY_DIR}/cli_test_unused.twell")
expect(2 "--dead-fraction has no effect with --distribution uniform" generate "${unused_out}" --shape small
       --tokens 64 --distribution uniform --dead-fraction 0.9)
set(unused_mtx "${CMAKE_CURRENT_BINARY_DIR}/cli_test_unused.mtx")
set(unused_npy "${CMAKE_CURRENT_BINARY_DIR}/cli_test_unused.npy")
file(WRITE "${unused_mtx}" "%%MatrixMarket matrix coordinate real general\n2 3 3\n1 1 1\n2 1 5\n2 3 -2\n")
expect(2 "--overflow hybrid has no effect: a csr output has no overflow" convert "${unused_mtx}" "${unused_mtx}"
       --overflow hybrid)
expect(2 "--overflow drop has no effect: a dense output has no overflow" convert "${unused_mtx}" "${unused_npy}"
       --overflow drop)
expect(2 "--overflow drop has no effect: a Hybrid keeps every value" convert "${unused_mtx}" "${unused_out}"
       --to hybrid --overflow drop)
expect(2 "--overflow hybrid has no effect: ELL has no overflow block" convert "${unused_mtx}" "${unused_out}"
       --to ell --overflow hybrid)
expect(2 "--overflow hybrid has no effect: ELL has no overflow block" convert "${unused_mtx}" "${unused_out}"
       --to ell --overflow hybrid --ell-width 1)
expect(2 "--overflow drop has no effect: without --ell-width" convert "${unused_mtx}" "${unused_out}"
       --to ell --overflow drop)
expect(0 "1 dropped by --overflow drop" convert "${unused_mtx}" "${unused_out}" --to ell --overflow drop --ell-width 1)
expect(0 "hybrid(tile 256, C 8)" convert "${unused_mtx}" "${unused_out}" --to twell --overflow hybrid)
expect(0 "hybrid(tile 256, C 8)" convert "${unused_mtx}" "${unused_out}" --to hybrid --overflow hybrid)
# --dtype picks the type a .mtx is parsed into; a .npy or .twell file carries its own.
expect(0 "(csr fp32 2 x 3)" convert "${unused_mtx}" "${unused_out}" --to csr)
expect(0 "(dense fp32 2 x 3)" convert "${unused_mtx}" "${unused_npy}")
foreach(command IN ITEMS validate stats)
  expect(0 "bf16" ${command} "${unused_mtx}" --dtype bf16)
  expect(2 "--dtype has no effect: a .twell file holds its own value type" ${command} "${unused_out}" --dtype bf16)
  expect(2 "--dtype has no effect: a .npy file holds its own value type" ${command} "${unused_npy}" --dtype fp32)
endforeach()
file(REMOVE "${unused_out}" "${unused_mtx}" "${unused_npy}")

# stats --json: a file name of any bytes gives valid JSON, control characters as \u00XX and each
# byte that is not UTF-8 (a Latin-1 e-acute here) as \ufffd; --png then reads it.
set(odd_dir "${CMAKE_CURRENT_BINARY_DIR}/cli_test_odd")
file(REMOVE_RECURSE "${odd_dir}")
file(MAKE_DIRECTORY "${odd_dir}")
file(WRITE "${odd_dir}/plain.mtx" "%%MatrixMarket matrix coordinate real general\n2 3 2\n1 1 1\n2 3 -2\n")
execute_process(COMMAND sh -c "cd \"$1\" && f=$(printf 'caf\\351\\n\\001.mtx') && cp plain.mtx \"$f\" &&
                               \"$2\" stats \"$f\" --json odd.json --png odd.png" sh "${odd_dir}" "${TWELL}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ "${odd_dir}/odd.json" json)
string(FIND "${json}" "{\"file\": \"caf\\ufffd\\n\\u0001.mtx\"," at)
string(FIND "${out}${err}" "no PNG written" no_png)
string(FIND "${out}" "histograms plotted to odd.png" plotted)
if(NOT rc STREQUAL "0" OR at EQUAL -1 OR (no_png EQUAL -1 AND plotted EQUAL -1))
  message(FATAL_ERROR "twell stats 'caf\\351\\n\\001.mtx' --json --png: exit status ${rc}, expected 0, the file name "
                      "escaped and a PNG plotted\nstdout:\n${out}\nstderr:\n${err}\njson:\n${json}")
endif()
message(STATUS "ok: twell stats 'caf\\351\\n\\001.mtx' --json --png -> ${rc}")
file(REMOVE_RECURSE "${odd_dir}")

# convert: a dense matrix wider than 2^31-1 columns (which CSR's 32-bit column indices cannot hold)
# converts to dense as a copy, not through CSR. No data: 0 rows.
set(wide_npy "${CMAKE_CURRENT_BINARY_DIR}/cli_test_wide.npy")
set(wide_copy "${CMAKE_CURRENT_BINARY_DIR}/cli_test_wide_copy.npy")
set(wide_header "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3000000000), }")
string(LENGTH "${wide_header}" header_length)
math(EXPR padding "127 - 10 - ${header_length}")  # magic, version and length: 10 bytes; 128 in all
string(REPEAT " " ${padding} spaces)
execute_process(COMMAND sh -c "printf '\\223NUMPY\\001\\000\\166\\000%s\\n' \"$2\" > \"$1\"" sh "${wide_npy}"
                           "${wide_header}${spaces}")
expect(1 "error (unsupported): twell::stats: cols = 3000000000" stats "${wide_npy}")
expect(0 "(dense fp32 0 x 3000000000): 0 values stored" convert "${wide_npy}" "${wide_copy}")
expect(0 "(dense fp32 0 x 3000000000): 0 values stored" convert "${wide_npy}" "${wide_copy}.twell" --to dense)
file(REMOVE "${wide_npy}" "${wide_copy}" "${wide_copy}.twell")
