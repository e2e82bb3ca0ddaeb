#include <twell/bench/features.hpp>
#include <twell/bench/timeline.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <twell/error.hpp>

#if TWELL_BENCH_TIMELINE
#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>
#endif

namespace twell::bench::timeline {

#if TWELL_BENCH_TIMELINE
namespace {

constexpr const char* kWhere = "twell bench --timeline";

void check(CUptiResult status, const char* call) {
  if (status == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(status, &text);
  fail(ErrorCode::cuda, kWhere, call, ": ", text != nullptr ? text : "unknown CUPTI error");
}

// One traced activity, as the CSV holds it.
struct Row {
  std::string kind, name;
  std::uint64_t start = 0, end = 0;
  std::uint32_t stream = 0, correlation = 0;
  std::uint64_t bytes = 0;
};

// What CUPTI hands back, possibly on its own thread: a process-wide sink that outlives every
// trace, so that a buffer delivered late never reaches freed state.
struct Sink {
  std::mutex mutex;
  std::vector<Row> rows;
};
Sink sink;

std::vector<Row> take_rows() {
  std::vector<Row> rows;
  const std::lock_guard<std::mutex> lock(sink.mutex);
  rows.swap(sink.rows);
  return rows;
}

struct State {
  std::ofstream out;
  std::size_t flush_bytes = 0;
  std::string case_name;  // empty outside a case
  int call = 0;           // Harness::time calls so far in this case
  bool tracing = false;
};
State* state = nullptr;

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME,
                                         CUPTI_ACTIVITY_KIND_DRIVER};

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> plain(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && plain ? std::string(plain.get()) : std::string(name);
}

std::string api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const char* name = nullptr;
  return cuptiGetCallbackName(domain, cbid, &name) == CUPTI_SUCCESS && name != nullptr ? name : "?";
}

Row row_of(const CUpti_Activity* record) {
  Row r;
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      r = {"kernel", demangled(k->name), k->start, k->end, k->streamId, k->correlationId, 0};
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      r = {"memcpy", "copy kind " + std::to_string(c->copyKind), c->start, c->end, c->streamId, c->correlationId,
           c->bytes};
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* s = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      r = {"memset", "memset", s->start, s->end, s->streamId, s->correlationId, s->bytes};
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const bool runtime = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
      r = {runtime ? "runtime" : "driver",
           api_name(runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a->cbid),
           a->start,
           a->end,
           0,
           a->correlationId,
           0};
      break;
    }
    default:
      r.kind = "other";
  }
  return r;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  constexpr std::size_t kBytes = std::size_t{8} << 20;
  // CUPTI wants 8-byte aligned buffers; operator new gives at least that.
  *buffer = static_cast<std::uint8_t*>(::operator new(kBytes));
  *size = kBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  std::vector<Row> rows;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    Row r = row_of(record);
    if (r.kind != "other") rows.push_back(std::move(r));
  }
  ::operator delete(buffer);
  const std::lock_guard<std::mutex> lock(sink.mutex);
  for (Row& r : rows) sink.rows.push_back(std::move(r));
}

// Stops recording and hands back what was recorded; never throws. `drain`: first wait for the
// device, whose work still in flight would otherwise leave records for a later call.
std::vector<Row> stop_tracing(bool drain) {
  state->tracing = false;
  for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  if (drain) cudaDeviceSynchronize();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  return take_rows();
}

// The CSV's quoting: kernel names hold commas and template brackets.
std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char ch : s) {
    if (ch == '"') q += '"';
    q += ch;
  }
  return q + '"';
}

}  // namespace

bool available() { return true; }

void open(const std::string& path, std::size_t flush_bytes) {
  require(state == nullptr, ErrorCode::invalid_argument, kWhere, "a trace is already open");
  auto s = std::make_unique<State>();
  s->out.open(path);
  require(static_cast<bool>(s->out), ErrorCode::io, kWhere, "cannot write '", path, "'");
  s->out << "case,call,kind,name,start_ns,end_ns,stream,correlation,bytes\n";
  s->flush_bytes = flush_bytes;
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  state = s.release();
}

void close() {
  if (state == nullptr) return;
  if (state->tracing) stop_tracing(true);  // a call left unfinished: its rows are dropped
  delete state;
  state = nullptr;
}

void case_begin(const std::string& name) {
  if (state == nullptr) return;
  state->case_name = name;
  state->call = 0;
}

void case_end() {
  if (state == nullptr) return;
  state->case_name.clear();
  // The case threw inside its timed runs: stop, and drop the unfinished call's rows.
  if (state->tracing) stop_tracing(true);
}

void runs_begin() {
  if (state == nullptr || state->case_name.empty() || state->tracing) return;
  take_rows();            // a buffer CUPTI delivered after the last call stopped
  state->tracing = true;  // first: a kind enabled before a failure is disabled by case_end
  for (CUpti_ActivityKind kind : kKinds) check(cuptiActivityEnable(kind), "cuptiActivityEnable");
}

void runs_end() {
  if (state == nullptr || !state->tracing) return;
  // Harness::time synchronised its stream: every record of the call is complete.
  const std::vector<Row> rows = stop_tracing(false);
  const std::string prefix = quoted(state->case_name) + "," + std::to_string(state->call++) + ",";
  for (const Row& r : rows) {
    // The harness's flush is the only memset of its size (twice L2, at least 64 MiB) in a run.
    const bool flush = r.kind == "memset" && r.bytes == state->flush_bytes;
    state->out << prefix << (flush ? "flush" : r.kind) << "," << quoted(flush ? "L2 flush" : r.name) << "," << r.start
               << "," << r.end << "," << r.stream << "," << r.correlation << "," << r.bytes << "\n";
  }
  state->out.flush();
  require(static_cast<bool>(state->out), ErrorCode::io, kWhere, "writing the trace failed");
}

#else  // no CUPTI in this build

bool available() { return false; }
void open(const std::string&, std::size_t) {
  fail(ErrorCode::unsupported, "twell bench --timeline",
       "this build has no CUPTI (CMake found no CUDA::cupti target when it configured the bench)");
}
void close() {}
void case_begin(const std::string&) {}
void case_end() {}
void runs_begin() {}
void runs_end() {}

#endif

}  // namespace twell::bench::timeline
