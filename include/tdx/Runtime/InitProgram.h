//===- InitProgram.h - init programs evaluated element by element -*- C++ -*-===//
//
// A parameter's init region (tdx.parameter / tdx.buffer) as a small DAG that
// gives any element of the global tensor from its global index alone: random
// ops through tdx/Runtime/Philox.h, creation ops, constants, elementwise ops
// with broadcasting, casts, reshapes and expands. Every value is computed in double
// and rounded once per op to its element type. One rank fills its box of the
// global tensor without building the rest, and the boxes of all ranks put
// together are bitwise the one-rank tensor.
//
// No MLIR and no ATen: tdx-translate writes the program into the emitted
// source (InitEvaluator.h builds it from the IR) and the runtimes evaluate it.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_INITPROGRAM_H
#define TDX_RUNTIME_INITPROGRAM_H

#include "tdx/StateFormat/Safetensors.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tdx::rt {

struct InitProgram {
  /// Leaves, then cast, reshape, expand (a broadcast), comparison (p[0]: the tdx.cmp predicate,
  /// eq ne lt le gt ge) and where (a ? b : c), then the elementwise table's
  /// ops (ElementwiseOps.def), named like their tdx ops.
#define TDX_INIT_KINDS(X)                                                                  \
  X(Empty) X(Full) X(Arange) X(Uniform) X(Normal) X(TruncNormal) X(Bernoulli) X(Constant) X(Cast) \
  X(Reshape) X(Expand) X(Cmp) X(Where)
  enum Kind : int {
#define TDX_KIND(k) k,
    TDX_INIT_KINDS(TDX_KIND)
#undef TDX_KIND
#define TDX_UNARY(Name, fn, aten, linear, ...) Name,
#define TDX_BINARY(Name, fn, aten, ...) Name,
#include "tdx/Runtime/ElementwiseOps.def"
  };
  /// The enumerator's name ("Full", "Exp"): emitted sources spell nodes so.
  static const char *kindName(Kind kind);
  struct Node {
    Kind kind;
    DType dtype;
    std::vector<int64_t> shape;
    int a = -1, b = -1;
    /// Full: value; Arange: start, step; Uniform: low, high; Normal: mean,
    /// std; TruncNormal: mean, std, a, b; Bernoulli: p.
    double p[4] = {0, 0, 0, 0};
    uint64_t seed = 0, stream = 0;
    /// Constant: every element (one for a splat).
    std::vector<double> values;
    /// Where: the value where the condition `a` is false (`b` where true).
    int c = -1;
  };
  /// Topologically ordered; the last node is the result.
  std::vector<Node> nodes;

  /// The element of node `n` at multi-index `index` (of its shape).
  double at(int n, const int64_t *index) const;
  /// Fills the box [offset, offset + size) of the result, row-major, as
  /// elements of the result's dtype (F32, F64, I64, I32 or Bool).
  void fillBox(const std::vector<int64_t> &offset, const std::vector<int64_t> &size,
               void *out) const;
  const Node &result() const { return nodes.back(); }
};

/// An InitProgram::Node as constant data: what emitted sources hold (a
/// table of these initializes at compile time; a table of InitPrograms
/// would be code the C++ compiler spends minutes on for a deep model).
struct InitNodeData {
  InitProgram::Kind kind;
  DType dtype;
  const int64_t *shape;
  int rank;
  int a, b;
  double p[4];
  uint64_t seed, stream;
  const double *values;
  int count;
  int c;
};

/// The programs of a table: program k is the `ranges[k][1]` nodes from
/// `nodes[ranges[k][0]]`.
std::vector<InitProgram> initPrograms(const InitNodeData *nodes, const int (*ranges)[2],
                                      int programs);

/// Whether init programs make tensors of `t` (fillBox writes them).
bool initProgramsMake(DType t);

/// `program` with `seed` mixed (xor) into every random op's seed: --seed S
/// of a model binary; S = 0 is the init the program was captured with.
InitProgram withSeed(InitProgram program, uint64_t seed);

/// `program` as a function's random op draws it at call `call` (from 0):
/// every random op's stream moves to stream + (call + 1) * 2^32, so no call
/// meets another's draws or an init program's (tdx/Runtime/Philox.h).
InitProgram atCall(InitProgram program, uint64_t call);

} // namespace tdx::rt

#endif // TDX_RUNTIME_INITPROGRAM_H
