// Reading and writing matrices: Matrix Market (.mtx, CSR), NumPy (.npy, dense) and twell's own
// container (.twell, any format, bit-exact). Byte layouts: docs/io.md.
//
// Every reader treats its input as untrusted: each size and offset is checked against the input
// size before anything is allocated, and bad input is a twell::Error (ErrorCode::io for input
// that is truncated, not of the expected kind or fails its checksum; ErrorCode::malformed for
// input whose content is inconsistent; ErrorCode::unsupported for a valid variant twell does
// not read; ErrorCode::out_of_memory for a size the checks allow but the machine cannot
// allocate) whose message names the problem and the byte offset. Sparse results pass
// twell::validate before they are returned. Writers take host matrices only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <twell/any_matrix.hpp>

namespace twell {

enum class FileType : std::uint8_t { mtx, npy, twell };

std::string_view to_string(FileType t);
// From the extension: .mtx, .npy or .twell; anything else is ErrorCode::invalid_argument.
FileType file_type_of(const std::filesystem::path& path);

struct ReadOptions {
  // Matrix Market only (the text carries no value type): the value type of the CSR returned.
  DType dtype = DType::fp32;
  // Memory a file may make the reader allocate beyond what its own bytes account for: a
  // Matrix Market header can declare a billion rows in a 30-byte file, and its reader keeps 8
  // bytes a row (the result's row_ptr). Past the input's size plus this limit the
  // reader fails (ErrorCode::out_of_memory: a limit of the reader, not a fault of the file) instead
  // of allocating. A matrix whose rows take no bytes (N = 0 in .npy or .twell) is charged 8 bytes
  // a row against the same sum.
  std::uint64_t max_implicit_bytes = std::uint64_t{1} << 30;
};

// What a Matrix Market read found besides the matrix.
struct MtxReport {
  std::string field;                 // "real", "integer" or "pattern"
  std::int64_t entries = 0;          // entries in the file
  std::int64_t explicit_zeros = 0;   // entries whose value is 0 or -0, dropped (twell stores no zeros)
  std::int64_t rounded_to_zero = 0;  // nonzero entries that round to zero in the value type, dropped
};

// Matrix Market "coordinate real|integer|pattern general|symmetric|skew-symmetric" ->
// CsrMatrix<options.dtype> (the stored lower triangle of a symmetric file is mirrored).
// Duplicate entries are an error (ErrorCode::malformed), never summed; explicit zeros are dropped
// and counted in *report. Values are parsed as fp64 and rounded to the value type (twell::narrow):
// a finite value beyond its range is ErrorCode::unsupported naming the line; a nonzero that rounds
// to zero is dropped and counted in report->rounded_to_zero.
AnyMatrix read_mtx(std::span<const std::byte> bytes, const ReadOptions& options = {}, MtxReport* report = nullptr);
AnyMatrix read_mtx(const std::filesystem::path& path, const ReadOptions& options = {}, MtxReport* report = nullptr);
// "coordinate real general", 1-based, row-major order, each value printed as the shortest
// decimal that reads back as the same fp64, which equals the stored value exactly (so scipy
// reads the exact value). NaN payloads are not kept (written as nan).
template <Value T>
std::vector<std::byte> encode_mtx(CsrView<const T> m);
template <Value T>
void write_mtx(const std::filesystem::path& path, CsrView<const T> m);

// NumPy .npy (versions 1.0, 2.0, 3.0 read; 1.0 written), 2-D, C order, little-endian:
// '<f4' -> fp32, '<f2' -> fp16, '<u2' -> bf16 (the raw bfloat16 bits; numpy has no bfloat16, and
// (a.astype(np.uint32) << 16).view(np.float32) recovers the values). Returns a DenseMatrix.
AnyMatrix read_npy(std::span<const std::byte> bytes, const ReadOptions& options = {});
AnyMatrix read_npy(const std::filesystem::path& path, const ReadOptions& options = {});
template <Value T>
std::vector<std::byte> encode_npy(DenseView<const T> m);
template <Value T>
void write_npy(const std::filesystem::path& path, DenseView<const T> m);

// The .twell container: any format and value type, read back bit-identical (CRC-32 checked).
AnyMatrix read_twell(std::span<const std::byte> bytes, const ReadOptions& options = {});
AnyMatrix read_twell(const std::filesystem::path& path, const ReadOptions& options = {});
std::vector<std::byte> encode_twell(const AnyMatrix& m);
void write_twell(const std::filesystem::path& path, const AnyMatrix& m);
template <Value T>
std::vector<std::byte> encode_twell(DenseView<const T> m);
template <Value T>
std::vector<std::byte> encode_twell(CsrView<const T> m);
template <Value T>
std::vector<std::byte> encode_twell(EllView<const T> m);
template <Value T>
std::vector<std::byte> encode_twell(TwellView<const T> m);
template <Value T>
std::vector<std::byte> encode_twell(HybridView<const T> m);

// By extension: .mtx gives CSR, .npy dense, .twell whatever was stored.
AnyMatrix read_matrix(const std::filesystem::path& path, const ReadOptions& options = {});
// By extension; .mtx takes a CSR and .npy a dense matrix (anything else: ErrorCode::invalid_argument,
// convert first), .twell any format.
void write_matrix(const std::filesystem::path& path, const AnyMatrix& m);

// The whole file, or ErrorCode::io naming the path and the reason; and its inverse, which
// writes to a temporary file in the same directory and renames it, so a failed write leaves no
// partial file behind.
std::vector<std::byte> read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes);

// CRC-32 (IEEE 802.3, as zlib.crc32 and PNG compute it) of bytes, continuing from crc.
std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc = 0);

}  // namespace twell
