//===- TdxStructureOps.td - meshes, parameters, buffers ----*- tablegen -*-===//

#ifndef TDX_DIALECT_TDXSTRUCTUREOPS_TD
#define TDX_DIALECT_TDXSTRUCTUREOPS_TD

include "TdxOpBase.td"

def Tdx_MeshOp : Tdx_Op<"mesh", [Symbol]> {
  let summary = "an N-D mesh of devices with named axes";
  let description = [{
    Declares a device mesh, like `torch.distributed.DeviceMesh`. Ranks are laid
    out row-major over `shape`; `axes` names each mesh dimension.

    ```mlir
    tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
    ```

    An optional `ranks` gives the processes of each axis when fewer run the
    program than `shape` has devices: an axis of `ranks` 1 is *folded*, each
    rank computes every shard of it in turn, as its own op of the shard's
    shape, and sums what the axis would all-reduce in a fixed order
    (`tdx-fold-mesh`). A program then gives bitwise the same results on
    every folding of one mesh.

    ```mlir
    // The reductions of a 2x2 mesh, run by 2 processes over "tp".
    tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"] ranks = [1, 2]
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, DenseI64ArrayAttr:$shape,
                       StrArrayAttr:$axes, OptionalAttr<DenseI64ArrayAttr>:$ranks);
  let assemblyFormat =
    "$sym_name `shape` `=` $shape `axes` `=` $axes (`ranks` `=` $ranks^)? attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Number of ranks in the mesh.
    int64_t getNumDevices();
    /// Index of the axis called `name`, or -1.
    int64_t getAxisIndex(::llvm::StringRef name);
  }];
}

class Tdx_StateOp<string mnemonic, string what>
    : Tdx_Op<mnemonic, [Symbol, IsolatedFromAbove, Tdx_StateOpInterface,
                        DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a module " # what # " with its init program";
  let description = [{
    Declares a }] # what # [{ by its fully-qualified name (as in
    `named_parameters()`), its logical (global) tensor type, and the
    functionalized program that initializes it. The `init` region takes no
    arguments and yields the initial value with `tdx.yield`.

    A tied }] # what # [{ has no init region and names the one it shares its
    value with (`tied_to`); both names then denote one value, as with
    `lm_head.weight = wte.weight` in PyTorch.

    An optional `sharding` places the }] # what # [{ on a mesh; the sharding
    passes treat it as a user annotation. `non_persistent` marks a buffer
    registered with `persistent=False`: state of the program, but not of
    `model.state_dict()` (a runner's `state_dict()` leaves it out).

    ```mlir
    tdx.}] # mnemonic # [{ @"wte.weight" : tensor<100x16xf32> init {
      %0 = tdx.normal(0.000000e+00, 2.000000e-02) seed(0, 0) : tensor<100x16xf32>
      tdx.yield %0 : tensor<100x16xf32>
    }
    tdx.}] # mnemonic # [{ @"lm_head.weight" : tensor<100x16xf32> tied_to @"wte.weight"
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<Tdx_Tensor>:$type,
                       OptionalAttr<FlatSymbolRefAttr>:$tied_to,
                       OptionalAttr<Tdx_ShardingAttr>:$sharding,
                       UnitAttr:$non_persistent);
  let regions = (region AnyRegion:$init);
  let assemblyFormat = [{
    $sym_name `:` $type (`tied_to` $tied_to^)? (`sharding` $sharding^)?
    (`non_persistent` $non_persistent^)? (`init` $init^)? attr-dict
  }];
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
  }];
}

def Tdx_ParameterOp : Tdx_StateOp<"parameter", "parameter">;
def Tdx_BufferOp : Tdx_StateOp<"buffer", "buffer">;

def Tdx_YieldOp : Tdx_Op<"yield", [Pure, Terminator, ReturnLike,
    ParentOneOf<["ParameterOp", "BufferOp", "FusedOp", "StartOp"]>]> {
  let summary = "yields the values of a region: a parameter's or buffer's initial value, a fused kernel's results, a started collective's result";
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "$values attr-dict `:` type($values)";
}

def Tdx_ParamRefOp : Tdx_Op<"param_ref", [Pure, Tdx_HasShardingRule, Tdx_StateAccessOpInterface,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "the value of a parameter or buffer, by qualified name";
  let description = [{
    Reads a `tdx.parameter` or `tdx.buffer` in a function. The result type
    must be the declared type. A tied name reads the value it is tied to.

    ```mlir
    %w = tdx.param_ref @"lm_head.weight" : tensor<100x16xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Tdx_AssignOp : Tdx_Op<"assign", [Tdx_HasShardingRule, Tdx_StateAccessOpInterface,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "writes the new value of a parameter or buffer";
  let description = [{
    Program state updated in place: after the function returns, the
    `tdx.parameter` or `tdx.buffer` named `name` holds `value` (a training
    step's updated weights and optimizer state). `tdx.param_ref`s of the
    name read the value the state had when the function was entered,
    wherever they are. The value must have the declared type (the local type
    in a partitioned module); propagation gives it the state's placement, so
    a state is placed the same before and after a step. A tied name writes
    the value it shares.

    ```mlir
    %w = tdx.param_ref @w : tensor<4x8xf32>
    %n = tdx.sub %w, %u : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    tdx.assign @w, %n : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name, Tdx_Tensor:$value);
  let assemblyFormat = "$name `,` $value attr-dict `:` type($value)";
}

#endif // TDX_DIALECT_TDXSTRUCTUREOPS_TD
