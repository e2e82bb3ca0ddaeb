#include <twell/error.hpp>

namespace twell {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::shape_mismatch: return "shape_mismatch";
    case ErrorCode::dtype_mismatch: return "dtype_mismatch";
    case ErrorCode::space_mismatch: return "space_mismatch";
    case ErrorCode::misaligned: return "misaligned";
    case ErrorCode::malformed: return "malformed";
    case ErrorCode::overflow: return "overflow";
    case ErrorCode::cuda: return "cuda";
    case ErrorCode::io: return "io";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::no_device: return "no_device";
    case ErrorCode::out_of_memory: return "out_of_memory";
  }
  return "unknown";
}

}  // namespace twell
