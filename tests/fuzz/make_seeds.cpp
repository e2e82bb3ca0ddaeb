// Writes the seed corpus of the fuzz targets: small valid files of every reader's format (every
// value type, empty and ragged shapes, a hybrid with overflow rows) into <dir>/{mtx,npy,twell,validate},
// and command lines of the twell program into <dir>/args.
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <twell/converters/backends.hpp>
#include <twell/io.hpp>

namespace {

using namespace twell;

template <Value T>
DenseMatrix<T> sparse(std::int64_t rows, std::int64_t cols, double density, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  DenseMatrix<T> d(rows, cols);
  T* p = d.values().data();
  for (std::int64_t k = 0; k < rows * cols; ++k) {
    if (u(rng) < density) p[k] = from_float<T>(static_cast<float>(u(rng) * 4.0 - 2.0) + 0.01f);
  }
  return d;
}

void io_append(std::vector<std::byte>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  for (std::size_t k = 0; k < n; ++k) out.push_back(b[k]);
}

void put(const std::filesystem::path& path, const std::vector<std::byte>& bytes) { write_file(path, bytes); }

template <Value T>
void seeds(const std::filesystem::path& dir, int& n) {
  const std::int64_t shapes[][2] = {{0, 0}, {1, 1}, {3, 17}, {8, 40}};
  ConvertOptions drop;
  drop.overflow = OverflowPolicy::drop;
  for (const auto& s : shapes) {
    const auto d = sparse<T>(s[0], s[1], 0.3, static_cast<std::uint64_t>(++n));
    const auto csr = reference::dense_to_csr<T>(d.view());
    const std::string id = std::to_string(n);
    put(dir / "mtx" / (id + ".mtx"), encode_mtx<T>(csr.view()));
    put(dir / "npy" / (id + ".npy"), encode_npy<T>(d.view()));
    put(dir / "twell" / (id + "_dense.twell"), encode_twell<T>(d.view()));
    put(dir / "twell" / (id + "_csr.twell"), encode_twell<T>(csr.view()));
    put(dir / "twell" / (id + "_ell.twell"), encode_twell<T>(reference::dense_to_ell<T>(d.view()).view()));
    put(dir / "twell" / (id + "_twell.twell"),
        encode_twell<T>(reference::dense_to_twell<T>(d.view(), TwellLayout{16, 2}, drop).view()));
    put(dir / "twell" / (id + "_hybrid.twell"),
        encode_twell<T>(reference::dense_to_hybrid<T>(d.view(), TwellLayout{8, 4}).view()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  for (const char* sub : {"mtx", "npy", "twell", "validate", "args"}) std::filesystem::create_directories(dir / sub);
  int n = 0;
  seeds<bf16>(dir, n);
  seeds<fp16>(dir, n);
  seeds<float>(dir, n);
  // fuzz_validate reads raw bytes: format, dtype, rows, cols, aux, tile, C, then the arrays.
  // A valid 2 x 3 fp32 CSR: row_ptr {0, 1, 2}, col_idx {0, 2}, values {1, 2}.
  std::vector<std::byte> csr;
  const auto raw = [&](const auto& v) { io_append(csr, &v, sizeof v); };
  for (const unsigned char b : {0, 2, 2, 3, 2, 0, 0}) raw(b);
  for (const std::int64_t p : {0, 1, 2}) raw(p);
  for (const std::int32_t c : {0, 2}) raw(c);
  for (const float v : {1.0f, 2.0f}) raw(v);
  put(dir / "validate" / "csr_2x3", csr);
  // Matrix Market variants the encoder never writes: symmetric and skew-symmetric (mirrored),
  // pattern, integer, comments, CRLF, Inf / NaN and a decimal below fp64.
  const std::string_view mtx_variants[] = {
      "%%MatrixMarket matrix coordinate real symmetric\n% a comment\n3 3 3\n1 1 1.5\n2 1 -2\n3 3 4e-3\n",
      "%%MatrixMarket matrix coordinate pattern general\n2 3 2\n1 2\n2 3\n",
      "%%MatrixMarket matrix coordinate integer skew-symmetric\r\n3 3 2\r\n2 1 5\r\n3 2 -7\r\n",
      "%%MatrixMarket matrix coordinate real general\n2 2 3\n1 1 inf\n1 2 nan\n2 2 1e-400\n"};
  int v = 0;
  for (const std::string_view text : mtx_variants) {
    const auto* b = reinterpret_cast<const std::byte*>(text.data());
    put(dir / "mtx" / ("variant" + std::to_string(++v) + ".mtx"), std::vector<std::byte>(b, b + text.size()));
  }
  // A version 2.0 .npy (a 4-byte header length): 2 x 2 fp32.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  header += std::string(63 - (12 + header.size()) % 64, ' ') + "\n";
  std::vector<std::byte> npy2;
  io_append(npy2, "\x93NUMPY\x02\x00", 8);
  const auto header_len = static_cast<std::uint32_t>(header.size());
  io_append(npy2, &header_len, 4);
  io_append(npy2, header.data(), header.size());
  for (const float x : {1.0f, 0.0f, -2.5f, 4.0f}) io_append(npy2, &x, sizeof x);
  put(dir / "npy" / "version2.npy", npy2);
  // fuzz_args reads argv after "twell", words split at NUL: the command lines of
  // tools/cli_test.cmake, one line per subcommand with every option, and a few usage errors.
  const std::vector<std::vector<std::string_view>> lines = {
      {"demo", "--help"},
      {"demo", "--shape", "small", "--tokens", "128", "--repeats", "1", "--density", "0.01"},
      {"demo", "--shape", "small", "--tokens", "128", "--repeats", "1", "--dtype", "fp32", "--tile", "128",
       "--compression", "4", "--distribution", "uniform", "--seed", "7"},
      {"demo", "--shape=llama7b", "--tokens=64", "--ffn-repeats=2", "--tile=64", "--compression=2", "--seed", "0"},
      {"demo", "--tokens", "12x"},
      {"demo", "--density", "2"},
      {"demo", "--seed", "1", "--seed=2"},
      {"generate", "out.mtx", "--shape", "small", "--tokens", "64"},
      {"generate", "out.twell", "--shape", "small", "--tokens", "256", "--to", "hybrid"},
      {"generate", "out.npy", "--distribution", "neuron_skewed", "--dead-fraction", "0.5", "--dtype", "fp16",
       "--density=0.002", "--seed", "3"},
      {"stats", "in.twell"},
      {"stats", "in.twell", "--tiles", "64,512", "--compressions", "4,64"},
      {"stats", "in.twell", "--tiles", "40", "--compressions", "8,16"},
      {"stats", "in.mtx", "--dtype", "bf16", "--tile", "128", "--json", "s.json", "--png", "s.png"},
      {"stats", "in.twell", "--tiles", "64,,128"},
      {"convert", "big.mtx", "big.npy"},
      {"convert", "big.npy", "narrowed.npy", "--dtype", "fp16"},
      {"convert", "in.mtx", "out.twell", "--to", "twell", "--dtype", "bf16", "--tile", "128", "--compression", "4",
       "--overflow", "hybrid", "--threshold", "0.5", "--quiet"},
      {"convert", "in.npy", "out.twell", "--to=ell", "--ell-width=-1", "--threshold=1e-3", "--overflow=drop"},
      {"validate", "in.mtx", "--dtype", "fp16"},
      {"validate", "in.twell"},
      {"bench", "--cases", "spmm spmm (twell|cusparse_csr) paper 16384 uniform 0.005 "},
      {"bench", "--suite", "spmm,ffn", "--out", "r.json", "--quick", "--contract", "--reps", "10", "--warmup", "2",
       "--seed", "9"},
      {"bench", "--cases", "spmm (twell"},
      {"bench", "--cases", "spmm \\2222222222222222222222"},  // std::regex's overflow, found by fuzz_args
  };
  int a = 0;
  for (const auto& words : lines) {
    std::vector<std::byte> line;
    for (std::size_t k = 0; k < words.size(); ++k) {
      if (k != 0) line.push_back(std::byte{0});
      io_append(line, words[k].data(), words[k].size());
    }
    put(dir / "args" / ("line" + std::to_string(++a)), line);
  }
  std::printf("wrote %d seed shapes into %s\n", n, dir.c_str());
  return 0;
}
