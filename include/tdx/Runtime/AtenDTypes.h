//===- AtenDTypes.h - stored element types as ATen names them -----*- C++ -*-===//
//
// The ATen side of tdx/StateFormat/DTypes.def, for the CPU runtime and the
// Python extension (both link ATen; the rest of the runtime does not).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_ATENDTYPES_H
#define TDX_RUNTIME_ATENDTYPES_H

#include "tdx/StateFormat/Safetensors.h"

#include <c10/core/ScalarType.h>

#include <stdexcept>
#include <string>

namespace tdx::rt {

/// The ATen scalar type of a stored element type.
inline at::ScalarType scalarTypeOf(DType t) {
  switch (t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs)                                          \
  case DType::Name:                                                                                \
    return at::aten;
#include "tdx/StateFormat/DTypes.def"
  }
  return at::kFloat;
}

/// The stored element type of an ATen scalar type; throws naming a type
/// tensor files do not hold.
inline DType dtypeOf(at::ScalarType t) {
  switch (t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs)                                          \
  case at::aten:                                                                                   \
    return DType::Name;
#include "tdx/StateFormat/DTypes.def"
  default:
    throw std::runtime_error(std::string("tdx: cannot store dtype ") + c10::toString(t) +
                             " (tensor files and model binaries hold float32, float64, "
                             "float16, bfloat16, int64, int32 and bool)");
  }
}

} // namespace tdx::rt

#endif // TDX_RUNTIME_ATENDTYPES_H
