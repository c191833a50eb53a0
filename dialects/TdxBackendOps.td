//===- TdxBackendOps.td - what the backend passes decide ---*- tablegen -*-===//
//
// After tdx-spmd, the backend pipeline (tdx-backend) writes its decisions
// into the per-rank program, where passes can see and tests can check them,
// and the C++ and CUDA emitters only print: fused kernels are `tdx.fused`
// regions, asynchronous collectives are `tdx.start` / `tdx.wait` pairs
// joined by a `!tdx.token`, and the memory plan and the step's parts are the
// `tdx.arena` and `tdx.part` attributes (TdxDialect::kArenaAttrName, ...).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_DIALECT_TDXBACKENDOPS_TD
#define TDX_DIALECT_TDXBACKENDOPS_TD

include "TdxOpBase.td"

def Tdx_TokenType : TypeDef<Tdx_Dialect, "Token"> {
  let mnemonic = "token";
  let summary = "a collective in flight";
  let description = [{
    What `tdx.start` gives and `tdx.wait` takes: the handle of a collective
    the runtime has started and not yet finished.
  }];
}

def Tdx_FusedOp : Tdx_Op<"fused", [IsolatedFromAbove, SingleBlock]> {
  let summary = "elementwise ops that run as one kernel";
  let description = [{
    A kernel of the backends (made by `tdx-fuse-elementwise`): the body runs
    once per element of the iteration shape, which is every result's shape;
    its block arguments are the `inputs` (broadcast to that shape) read one
    element at a time. The body holds elementwise ops, splat constants, and
    at most one row op (softmax, log_softmax, layer_norm, rms_norm over the
    last dim), which must be last before `tdx.yield`: it runs on each row of
    what the body computes, in place. The C++ backend loops the body over
    rows (vectorized when every value has one float type), the CUDA backend
    launches it, one thread per element.

    ```mlir
    %y = tdx.fused (%x, %b) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32> {
    ^bb0(%a: tensor<4x8xf32>, %c: tensor<8xf32>):
      %s = tdx.add %a, %c : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
      %r = tdx.relu %s : (tensor<4x8xf32>) -> tensor<4x8xf32>
      tdx.yield %r : tensor<4x8xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<Tdx_Tensor>:$inputs);
  let results = (outs Variadic<Tdx_Tensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `(` $inputs `)` `:` functional-type($inputs, $results) $body attr-dict
  }];
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The row op that ends the body, if any.
    ::mlir::Operation *getRowOp();
    /// The iteration shape: every result's type.
    ::mlir::RankedTensorType getSpace() {
      return ::llvm::cast<::mlir::RankedTensorType>(getResult(0).getType());
    }
  }];
}

def Tdx_StartOp : Tdx_Op<"start", [SingleBlock]> {
  let summary = "starts a collective without waiting for it";
  let description = [{
    Made by `tdx-async-collectives`: the body holds one collective that may
    run asynchronously (trait `Tdx_AsyncCollective`: all_gather, all_reduce,
    reduce_scatter, collective_permute, ragged_all_to_all) and yields its
    result; the runtime starts it here and
    `tdx.wait` on the token, once, gives the result. Work between the two
    overlaps the collective.

    ```mlir
    %t = tdx.start {
      %r = tdx.all_reduce %x on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
      tdx.yield %r : tensor<8xf32>
    }
    %y = tdx.wait %t : tensor<8xf32>
    ```
  }];
  let results = (outs Tdx_TokenType:$token);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$body attr-dict";
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The collective the op starts.
    ::mlir::Operation *getCollective() { return &getBody().front().front(); }
    /// The one tdx.wait of the token (null in invalid IR).
    WaitOp getWait();
  }];
}

def Tdx_WaitOp : Tdx_Op<"wait"> {
  let summary = "waits for a started collective and gives its result";
  let arguments = (ins Tdx_TokenType:$token);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = "$token attr-dict `:` type($result)";
  let hasVerifier = 1;
}

#endif // TDX_DIALECT_TDXBACKENDOPS_TD
