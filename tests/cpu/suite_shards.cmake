# Checks that the ctest entries of a sharded gpu suite (tests/CMakeLists.txt, _twell_shards_*) run
# each of its test cases exactly once: the cases each shard's doctest filter lists, and those the
# suite's own entry lists (every filter excluded), are together the suite's whole listing, none
# twice, and each pattern of a filter names a case (none left behind by a renamed case). Listing a
# gpu suite needs no GPU (tests/support/test_main.cpp).
#   cmake -DSUITE=path/to/gpu_test_x -DFILTERS="filter|filter" -P suite_shards.cmake
foreach(_var SUITE FILTERS)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "suite_shards.cmake: -D${_var}=... is required")
  endif()
endforeach()

# The case names that `SUITE --list-test-cases ARGS...` prints, into `out`.
function(list_cases out)
  execute_process(COMMAND ${SUITE} --list-test-cases ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _text
                  ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${SUITE} --list-test-cases ${ARGN} failed (status ${_rc}):\n${_text}${_err}")
  endif()
  string(REPLACE "\n" ";" _lines "${_text}")
  set(_names "")
  foreach(_line IN LISTS _lines)
    if(NOT _line STREQUAL "" AND NOT _line MATCHES "^(\\[doctest\\]|===)")
      list(APPEND _names "${_line}")
    endif()
  endforeach()
  set(${out} "${_names}" PARENT_SCOPE)
endfunction()

list_cases(_all)
list(LENGTH _all _all_count)
if(_all_count EQUAL 0)
  message(FATAL_ERROR "${SUITE} lists no test case")
endif()

string(REPLACE "|" ";" _filters "${FILTERS}")
set(_covered "")
foreach(_filter IN LISTS _filters)
  # Each comma-separated pattern on its own: one left behind by a renamed case would otherwise let
  # that case fall quietly into the suite's own entry.
  string(REPLACE "," ";" _patterns "${_filter}")
  foreach(_pattern IN LISTS _patterns)
    list_cases(_named "-tc=${_pattern}")
    if(NOT _named)
      message(FATAL_ERROR "the shard pattern '${_pattern}' names no case of ${SUITE}")
    endif()
  endforeach()
  list_cases(_part "-tc=${_filter}")
  list(APPEND _covered ${_part})
endforeach()
list(JOIN _filters "," _excluded)
list_cases(_rest "-tce=${_excluded}")
list(APPEND _covered ${_rest})

# The entries' listings side by side are the suite's listing: a case in two shards shows twice.
list(LENGTH _covered _covered_count)
list(SORT _all)
list(SORT _covered)
if(NOT _all STREQUAL _covered)
  message(FATAL_ERROR "${SUITE}: its entries list ${_covered_count} cases in all, the suite ${_all_count}: "
                      "a case falls in two shards (or in none)")
endif()
list(LENGTH _rest _rest_count)
message(STATUS "${SUITE}: ${_all_count} cases, each in one entry; ${_rest_count} in the suite's own entry")
