# twell_tool_paths: where `twell stats --png` looks for plot_stats.py (tools/stats.cpp,
# find_plot_script): the installed data directory relative to the executable's, and the source
# tree for an executable in this build tree. An interface target, so that every target compiling
# tools/stats.cpp (the twell program, fuzz_args) gets the same definitions.
include_guard(GLOBAL)
include(GNUInstallDirs)
file(RELATIVE_PATH _twell_share_from_bin "${CMAKE_INSTALL_FULL_BINDIR}" "${CMAKE_INSTALL_FULL_DATADIR}/twell")
add_library(twell_tool_paths INTERFACE)
target_compile_definitions(
  twell_tool_paths INTERFACE TWELL_SHARE_FROM_BIN="${_twell_share_from_bin}" TWELL_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                             TWELL_BUILD_DIR="${PROJECT_BINARY_DIR}")
