//===- TdxAttrs.td - placements and shardings --------------*- tablegen -*-===//

#ifndef TDX_DIALECT_TDXATTRS_TD
#define TDX_DIALECT_TDXATTRS_TD

include "TdxBase.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"

class Tdx_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Tdx_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

def Tdx_PlacementAttr : Tdx_Attr<"Placement", "placement"> {
  let summary = "how a tensor is laid out over one mesh axis (PyTorch DTensor)";
  let description = [{
    One of the three DTensor placements, printed the way PyTorch prints them:

    * `Shard(d)`: tensor dimension `d` is split over the mesh axis in
      `torch.chunk` order (chunk size `ceil(n / k)`; trailing ranks may hold
      a short or empty chunk).
    * `Replicate`: every rank along the axis holds the whole tensor.
    * `Partial(sum|avg|max|min)`: every rank holds a partial value; the
      logical tensor is their reduction.

    Standalone: `#tdx.placement<Shard(0)>`, `#tdx.placement<Replicate>`,
    `#tdx.placement<Partial(sum)>`. Inside a sharding the prefix is dropped.
  }];
  let parameters = (ins "PlacementKind":$kind, "int64_t":$dim,
                        "ReduceKind":$reduce);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    static PlacementAttr shard(::mlir::MLIRContext *ctx, int64_t dim) {
      return get(ctx, PlacementKind::Shard, dim, ReduceKind::Sum);
    }
    static PlacementAttr replicate(::mlir::MLIRContext *ctx) {
      return get(ctx, PlacementKind::Replicate, 0, ReduceKind::Sum);
    }
    static PlacementAttr partial(::mlir::MLIRContext *ctx, ReduceKind r) {
      return get(ctx, PlacementKind::Partial, 0, r);
    }
    bool isShard() const { return getKind() == PlacementKind::Shard; }
    bool isReplicate() const { return getKind() == PlacementKind::Replicate; }
    bool isPartial() const { return getKind() == PlacementKind::Partial; }
    /// Prints `Shard(0)`, `Replicate` or `Partial(sum)`.
    void printBody(::mlir::AsmPrinter &printer) const;
    /// Parses what printBody prints.
    static PlacementAttr parseBody(::mlir::AsmParser &parser);
  }];
}

def Tdx_ShardingAttr : Tdx_Attr<"Sharding", "sharding"> {
  let summary = "a mesh and one placement per mesh axis";
  let description = [{
    Binds a tensor to a `tdx.mesh` and gives one placement per mesh axis, in
    the mesh's axis order, like a DTensor's `(device_mesh, placements)`:

    ```mlir
    tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
    // dim 0 split over "dp", replicated over "tp"
    #tdx.sharding<@mesh, [Shard(0), Replicate]>
    ```

    Whether the sharding fits a tensor (shard dims within the tensor's rank,
    one placement per mesh axis) is checked by the op that carries it.
  }];
  let parameters = (ins "::mlir::FlatSymbolRefAttr":$mesh,
                        ArrayRefParameter<"PlacementAttr">:$placements);
  let hasCustomAssemblyFormat = 1;
  let extraClassDeclaration = [{
    /// Checks the sharding against the mesh it names and the tensor type it
    /// lays out. Reports through `emitError` and names the fix.
    ::mlir::LogicalResult verifyFor(::mlir::Operation *op,
                                    ::mlir::Type tensorType,
                                    ::mlir::SymbolTableCollection &symbols,
                                    ::llvm::StringRef what) const;
    bool isFullyReplicated() const;
  }];
}

#endif // TDX_DIALECT_TDXATTRS_TD
