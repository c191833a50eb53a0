//===- Functionalizer.h - a recording replayed as SSA values -----*- C++ -*-===//
//
// Internal to lib/Capture. EmitIR.cpp holds the replay (reads, writes and
// views of fake tensors, generic ops) and the module it builds;
// FunctionalizeOps.cpp the ops it knows by name (creation, random init,
// copies) and the dispatch of each recorded op.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_CAPTURE_FUNCTIONALIZER_H
#define TDX_LIB_CAPTURE_FUNCTIONALIZER_H

#include "CaptureInternal.h"

#include "tdx/IR/TdxOps.h"

#include "mlir/IR/Builders.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>
#include <unordered_map>
#include <unordered_set>

namespace tdx::capture::detail {

using namespace mlir;
using namespace mlir::tdx;

Type elementType(Builder &b, at::ScalarType t);
RankedTensorType tensorType(Builder &b, const at::Tensor &t);
std::string fullName(const RecordedOp &op);
/// `base` read as `type` through aten::as_strided(sizes, strides, offset).
Value asStrided(OpBuilder &b, Location loc, Value base, RankedTensorType type,
                ArrayRef<int64_t> sizes, ArrayRef<int64_t> strides, int64_t offset);
Attribute toAttribute(Builder &b, const c10::IValue &v, const std::string &op,
                      const std::string &arg);

class Functionalizer {
public:
  Functionalizer(OpBuilder &b, Location loc, int64_t seed) : b(b), loc(loc), seed(seed) {}

  /// Emits `ops`; `outputs` (what the function returns) count as read.
  void run(const std::vector<RecordedOp> &ops, const std::vector<at::Tensor> &outputs = {});

  void bindInput(const at::Tensor &t, Value v) { define(t, v); }

  Value read(const at::Tensor &t);

private:
  struct View {
    at::Tensor base;
    const RecordedOp *op; // null: identity (alias, detach), or a slice below
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
    // One piece of split/unbind/chunk: [sliceStart, sliceEnd) of sliceDim,
    // with the dim dropped when `squeeze`.
    int64_t sliceDim = -1, sliceStart = 0, sliceEnd = 0;
    bool squeeze = false;
  };

public:
  /// Called for a fake tensor that no op made (a parameter in the forward).
  std::function<Value(const at::Tensor &)> resolver;

private:

  OpBuilder &b;
  Location loc;
  int64_t seed;
  std::string current = "the module";
  int depth = 0;
  int64_t stream = 0;
  std::unordered_map<c10::TensorImpl *, Value> cur;
  std::unordered_map<c10::TensorImpl *, int64_t> seen;
  std::unordered_map<c10::TensorImpl *, View> views;
  std::unordered_map<c10::StorageImpl *, int64_t> version;

  std::unordered_map<c10::StorageImpl *, at::Tensor> owners;
  std::unordered_set<const c10::TensorImpl *> read_;

  /// Whether a later op reads result `i` or beyond of `op`.
  bool auxiliaryResultsRead(const RecordedOp &op, size_t from) const;

  void define(const at::Tensor &t, Value v);

  void write(const at::Tensor &t, Value v);

  /// The data of a real tensor as a constant of `type`.
  Value constant(const at::Tensor &real, RankedTensorType type);

  Value full(double value, RankedTensorType type);

  /// `v` converted to the type of `t` (dtype cast, then broadcast).
  Value fit(Value v, RankedTensorType type);

  /// A generic tdx.aten op: every schema argument is kept. Tensors are
  /// operands in schema order; a Tensor[] / Tensor?[] argument is an array
  /// of operand numbers (`index` integers) and `unit` for a None element;
  /// everything else is an attribute (toAttribute).
  Value generic(StringRef schema, const RecordedOp &op, ArrayRef<Type> results);

  static bool isTensorListType(const c10::TypePtr &t);

  static const c10::FunctionSchema &schemaOf(const RecordedOp &op) {
    return c10::Dispatcher::singleton()
        .findSchemaOrThrow(op.name.c_str(), op.overload.c_str())
        .schema();
  }

  Value applyView(Value base, const View &view, const at::Tensor &result);

  Value reshapeOrStrided(Value base, const View &view, RankedTensorType type);

  /// The base after writing `value` into the view `view` of it.
  Value scatter(Value base, Value value, const View &view, const at::Tensor &result);

  /// The functional value of an op on tensors, or null when unknown.
  Value functional(const RecordedOp &op, const at::Tensor &out);

  void handle(const RecordedOp &op);
};

} // namespace tdx::capture::detail

#endif // TDX_LIB_CAPTURE_FUNCTIONALIZER_H
