// A trace of what the GPU and the CUDA APIs did during each case's timed runs (`twell bench
// --timeline FILE`), through CUPTI's activity API: every kernel, copy and memset with its device
// start and end, and every runtime and driver API call with its host start and end, on one clock.
// The lent GPU machines have no timeline tool (Nsight Systems cannot make a report there); this
// one says where a multi-kernel op spends the time between its kernels: the host launching late,
// a synchronisation, or plain launch latency (scripts/timeline_summary.py reads the CSV).
//
// Process-wide, because CUPTI's activity buffers are: open() once, then each case's range
// (case_begin / case_end, from the bench's NVTX range) and, inside it, each Harness::time call's
// timed runs (runs_begin / runs_end) are recorded; nothing outside a case is. Tracing adds a
// little host time to each API call, so traced runs are not results (the CSV is a diagnostic).
#pragma once

#include <cstddef>
#include <string>

namespace twell::bench::timeline {

// Whether this build can trace (CUPTI found at configure time).
bool available();
// Starts a trace into `path` (a CSV, overwritten). `flush_bytes`: the size of the harness's L2
// flush memset, which the trace marks as "flush" so the summary can split the runs. Throws
// twell::Error (unsupported) where !available(), (io) where the file cannot be written.
void open(const std::string& path, std::size_t flush_bytes);
// Writes what is left and stops tracing; no-op when not open.
void close();

// The case whose timed runs follow (its bench name); runs outside a case are not traced.
void case_begin(const std::string& name);
void case_end();

// Around one Harness::time call's timed runs; no-ops unless open and inside a case.
void runs_begin();
void runs_end();

}  // namespace twell::bench::timeline
