// `twell stats FILE [--png hist.png] [--json stats.json]`: distributions of nonzeros per row and
// per (row, tile), overflow of candidate TwELL layouts, bytes per format, recommended layout.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include <twell/any_matrix.hpp>
#include <twell/bench/json.hpp>
#include <twell/io.hpp>
#include <twell/stats.hpp>

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "progress.hpp"

namespace twell::cli {
namespace {

void json_distribution(std::ostream& os, const CountDistribution& d) {
  os << "{\"samples\": " << d.samples << ", \"min\": " << d.min << ", \"max\": " << d.max << ", \"mean\": " << d.mean
     << ", \"p50\": " << d.p50 << ", \"p90\": " << d.p90 << ", \"p99\": " << d.p99 << ", \"histogram\": [";
  for (std::size_t k = 0; k < d.histogram.size(); ++k) os << (k ? ", " : "") << d.histogram[k];
  os << "]}";
}

std::string to_json(const MatrixStats& s, const std::string& file) {
  std::ostringstream os;
  os.precision(17);
  os << "{\"file\": " << bench::json_quoted(file) << ", \"dtype\": \"" << to_string(s.dtype)
     << "\", \"rows\": " << s.rows << ", \"cols\": " << s.cols << ", \"nnz\": " << s.nnz
     << ", \"density\": " << s.density << ",\n \"tile\": " << s.default_layout.tile << ", \"per_row\": ";
  json_distribution(os, s.per_row);
  os << ",\n \"per_row_tile\": ";
  json_distribution(os, s.per_row_tile);
  os << ",\n \"recommended\": {\"tile\": " << s.recommended.tile << ", \"compression\": " << s.recommended.compression
     << "},\n \"bytes\": {\"dense\": " << s.bytes.dense << ", \"csr\": " << s.bytes.csr << ", \"ell\": " << s.bytes.ell
     << ", \"twell\": " << s.bytes.twell << ", \"hybrid\": " << s.bytes.hybrid << "},\n \"candidates\": [";
  for (std::size_t k = 0; k < s.candidates.size(); ++k) {
    const LayoutStats& c = s.candidates[k];
    os << (k ? ",\n  " : "\n  ") << "{\"tile\": " << c.layout.tile << ", \"compression\": " << c.layout.compression
       << ", \"overflowed_tiles\": " << c.overflowed_tiles << ", \"overflow_rows\": " << c.overflow_rows
       << ", \"values_beyond_capacity\": " << c.values_beyond_capacity << ", \"twell_bytes\": " << c.twell_bytes
       << ", \"hybrid_bytes\": " << c.hybrid_bytes << "}";
  }
  os << "]}\n";
  return os.str();
}

// The plotting script: $TWELL_PLOT_STATS, else plot_stats.py in the installed data directory
// (TWELL_SHARE_FROM_BIN, relative to the executable's), else, for an executable that lies in
// the build tree (TWELL_BUILD_DIR), bench/plot_stats.py of its source tree. Only these places:
// a search of every directory above the executable once ran an unrelated plot_stats.py left in
// /tmp/bench, and an installed program does not reach back into the tree it was built from.
std::filesystem::path find_plot_script() {
  if (const char* env = std::getenv("TWELL_PLOT_STATS")) return env;
  std::error_code ec;
  const std::filesystem::path exe_dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) return {};
  std::vector<std::filesystem::path> places{(exe_dir / TWELL_SHARE_FROM_BIN / "plot_stats.py").lexically_normal()};
  const std::filesystem::path from_build = exe_dir.lexically_relative(TWELL_BUILD_DIR);
  if (!from_build.empty() && *from_build.begin() != "..")
    places.emplace_back(std::filesystem::path(TWELL_SOURCE_DIR) / "bench/plot_stats.py");
  for (const std::filesystem::path& p : places)
    if (std::filesystem::exists(p, ec)) return p;
  return {};
}

// The plotter's input: a new file in the system's temporary directory (mkstemps: a fixed name
// beside the PNG could be a file of the user's, overwritten and then removed), removed when this
// goes out of scope, whatever happened in between.
class TemporaryFile {
 public:
  TemporaryFile() {
    std::error_code ec;
    std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
    if (ec) dir = "/tmp";  // $TMPDIR names no directory
    std::string name = (dir / "twell-stats-XXXXXX.json").string();
    const int fd = mkstemps(name.data(), 5);
    if (fd < 0) fail(ErrorCode::io, "twell stats", "cannot create a temporary file ", name, ": ", std::strerror(errno));
    close(fd);
    path_ = name;
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Runs argv without a shell; the exit status, or -1 when it could not start.
int spawn(const std::vector<std::string>& argv, bool quiet) {
  // What is still buffered would be written twice, by the child too, and after the child's output.
  std::cout.flush();
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (quiet) {
      // dup2, not freopen: the child must not flush the parent's stdio buffers itself.
      const int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
      if (null_fd >= 0) {
        dup2(null_fd, STDOUT_FILENO);
        dup2(null_fd, STDERR_FILENO);
      }
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A python3 that imports matplotlib: $TWELL_PYTHON, python3 on PATH, then /usr/bin/python3
// (a pyenv python3 first on PATH often lacks the Debian packages).
std::string find_python() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("TWELL_PYTHON")) candidates.emplace_back(env);
  candidates.emplace_back("python3");
  candidates.emplace_back("/usr/bin/python3");
  for (const std::string& py : candidates) {
    if (spawn({py, "-c", "import matplotlib"}, true) == 0) return py;
  }
  return {};
}

}  // namespace

const Spec kStatsSpec{"stats",
                      "Nonzeros per row and per (row, tile), overflow of candidate TwELL layouts (tile, C),\n"
                      "bytes per format and the recommended layout of the matrix in a .mtx/.npy/.twell file.",
                      "<file>",
                      1,
                      1,
                      {{"dtype", "bf16|fp16|fp32", "value type for a .mtx file only (default fp32)"},
                       {"tile", "T", "tile of the per (row, tile) distribution (default 256)"},
                       {"tiles", "LIST", "candidate layouts' tiles, comma-separated (default 128,256)"},
                       {"compressions", "LIST", "candidate layouts' compressions C (default 2,4,8,16,32)"},
                       {"json", "FILE", "also write the statistics as JSON"},
                       {"png", "FILE", "also plot the histograms (needs python3 with matplotlib)"}}};

std::optional<StatsRequest> parse_stats(std::span<const std::string> argv) {
  const Args args(kStatsSpec, argv);
  if (args.help()) return std::nullopt;
  StatsRequest r;
  r.path = args.positional()[0];
  StatsOptions& options = r.options;
  r.read = read_options(r.path, args.has("dtype") ? std::optional(args.get("dtype", "")) : std::nullopt);
  try {
    options.default_layout.tile = static_cast<std::int32_t>(args.get_int("tile", 256, 8, TwellLayout::kMaxTile));
    // C 8, or less where the tile leaves fewer than two slots with it (--tile 8: C 4).
    options.default_layout.compression = std::min(8, options.default_layout.tile / 2);
    // In the order given, each value once.
    const auto distinct = [](const std::vector<std::int64_t>& v) {
      std::vector<std::int32_t> out;
      for (const std::int64_t x : v)
        if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(static_cast<std::int32_t>(x));
      return out;
    };
    options.tiles = distinct(args.get_int_list("tiles", {128, 256}, 1, TwellLayout::kMaxTile));
    options.compressions = distinct(args.get_int_list("compressions", {2, 4, 8, 16, 32}, 1, TwellLayout::kMaxTile));
    check_stats_options(options, "--tile/--tiles/--compressions");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (args.has("json")) r.json = args.get("json", "");
  if (args.has("png")) r.png = args.get("png", "");
  // An output over the input destroys the matrix, and one over the other loses the statistics:
  // always a mistake here (unlike convert IN IN, which converts in place).
  for (const auto& [option, output] : {std::pair{"--json", r.json}, std::pair{"--png", r.png}}) {
    if (output && same_file(*output, r.path))
      throw UsageError(std::string(option) + " '" + *output + "' names the input file; it would be overwritten");
  }
  if (r.json && r.png && same_file(*r.json, *r.png))
    throw UsageError("--json and --png name the same file '" + *r.png + "'");
  return r;
}

namespace {

int run_stats(std::span<const std::string> argv) {
  const std::optional<StatsRequest> request = parse_or_print_usage(parse_stats, kStatsSpec, argv);
  if (!request) return 0;
  const std::string& path = request->path;
  const ReadOptions& read = request->read;
  const StatsOptions& options = request->options;
  Progress progress(3);
  progress.step("reading");
  const AnyMatrix m = read_matrix(path, read);
  progress.step("computing statistics");
  const MatrixStats st = std::visit([&](const auto& x) { return stats(x.view(), options); }, m);
  progress.clear();
  std::cout << path << "\n" << format_stats(st);
  const std::string json = to_json(st, path);
  if (request->json) {
    const std::string& out = *request->json;
    write_text_file(out, json);
    std::cout << "statistics written to " << out << "\n";
  }
  if (request->png) {
    progress.step("plotting");
    const std::string& png = *request->png;
    const std::filesystem::path script = find_plot_script();
    const std::string python = find_python();
    progress.clear();
    if (script.empty() || python.empty()) {
      std::cerr << "twell stats: no PNG written: "
                << (script.empty() ? "plot_stats.py was not found (set TWELL_PLOT_STATS)"
                                   : "no python3 with matplotlib (set TWELL_PYTHON)")
                << "\n";
      return 0;
    }
    // The plotter reads the JSON from a file: --json's, else a temporary one.
    std::optional<TemporaryFile> temporary;
    std::filesystem::path input;
    if (request->json) {
      input = *request->json;
    } else {
      input = temporary.emplace().path();
      write_text_file(input, json);
    }
    const int rc = spawn({python, script.string(), input.string(), png}, false);
    if (rc != 0) fail(ErrorCode::io, "twell stats", python, " ", script.string(), " exited with status ", rc);
    std::cout << "histograms plotted to " << png << "\n";
  }
  return 0;
}

[[maybe_unused]] const bool kRegistered =
    register_command({"stats", "nonzero distributions, layout overflow and bytes of a matrix file", run_stats});

}  // namespace
}  // namespace twell::cli
