//===- EmitText.cpp - the text of types, shapes, numbers and layouts ------===//

#include "Emitter.h"

#include "llvm/Support/FormatVariadic.h"

#include <cmath>

using namespace mlir;
using namespace mlir::tdx;

namespace mlir::tdx::cpp {

/// The emitted dtype of element type `t` ("T::kFloat"), "" when none.
std::string dtype(Type t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs)                                  \
  if ((mlir) && runs)                                                                      \
    return "T::" #aten;
#include "tdx/StateFormat/DTypes.def"
  return "";
}

/// The element types programs compute with ("f32/f64/..."), or with
/// `kernels`, those fused kernels compute with, for messages.
std::string runnableTypes(bool kernels) {
  std::string s;
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs)                                  \
  if (runs && (!kernels || *ctype))                                                                \
    s += (s.empty() ? "" : "/") + std::string(ir);
#include "tdx/StateFormat/DTypes.def"
  return s;
}

std::string list(ArrayRef<int64_t> xs) {
  std::string s = "{";
  for (auto [i, x] : llvm::enumerate(xs))
    s += (i ? ", " : "") + std::to_string(x);
  return s + "}";
}

std::string number(double v) {
  if (std::isinf(v))
    return v > 0 ? "INFINITY" : "-INFINITY";
  if (std::isnan(v))
    return "NAN";
  return llvm::formatv("{0:e17}", v).str();
}

/// A C++ string literal of `s`.
std::string quoted(StringRef s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string strings(ArrayAttr axes) {
  std::string s = "{";
  for (auto [i, a] : llvm::enumerate(axes.getAsValueRange<StringAttr>()))
    s += (i ? ", \"" : "\"") + a.str() + "\"";
  return s + "}";
}

std::string layoutText(ShardingAttr sharding, int64_t rank) {
  if (!sharding) {
    std::string s = "[";
    for (int64_t i = 0; i < rank; ++i)
      s += i ? ", Replicate" : "Replicate";
    return s + "]";
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  static_cast<Attribute>(sharding).print(os);
  return text.substr(text.find('['), text.rfind(']') - text.find('[') + 1);
}

/// The runtime's key of the state `name` names from `op`: a tied name reads
/// and writes the value it shares.

} // namespace mlir::tdx::cpp
