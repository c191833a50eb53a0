//===- TdxShardingOps.td - annotations and collectives -----*- tablegen -*-===//

#ifndef TDX_DIALECT_TDXSHARDINGOPS_TD
#define TDX_DIALECT_TDXSHARDINGOPS_TD

include "TdxOpBase.td"

def Tdx_AnnotateOp : Tdx_Op<"annotate", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a user's placement for a value (global view)";
  let description = [{
    States that `input` is laid out as `sharding`. Propagation never
    overrides it; `priority` (0 is highest) orders conflicting annotations.

    ```mlir
    %y = tdx.annotate %x <@mesh, [Shard(0), Replicate]> : tensor<8x16xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, Tdx_ShardingAttr:$sharding,
                       DefaultValuedAttr<I64Attr, "0">:$priority);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$input $sharding (`priority` $priority^)? attr-dict `:` type($input)";
}

def Tdx_RedistributeOp : Tdx_Op<"redistribute", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "change a value's placement (DTensor.redistribute, global view)";
  let description = [{
    The logical value is unchanged; its layout goes from `source` to
    `target` over the same mesh. `tdx-insert-collectives` turns it into
    collectives.

    ```mlir
    %r = tdx.redistribute %x <@mesh, [Shard(0)]> to <@mesh, [Replicate]> : tensor<8x16xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, Tdx_ShardingAttr:$source,
                       Tdx_ShardingAttr:$target);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$input $source `to` $target attr-dict `:` type($input)";
}

def Tdx_ToLocalOp : Tdx_Op<"to_local", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "enter a manual region: this rank's piece of a global value (global view)";
  let description = [{
    `result` is this rank's piece of `input` laid out as `sharding` (GSPMD's
    full-to-shard; the input of `tdx.local_map` and `tdx.shard_map`). The
    ops that compute from it, up to the `tdx.from_local` that leave, are a
    manual region: per-rank code the user wrote, whose collectives are the
    user's (`tdx.aten "tdx::..."` until tdx-partition makes them the
    dialect's). Propagation gives `input` the layout `sharding`, places the
    region's values Replicate (each rank's own) and partitions none of its
    ops; tdx-partition makes the op the identity. Splits are even. `site`
    is the user's `file:line` of the region (diagnostics name it).

    ```mlir
    %l = tdx.to_local %x <@mesh, [Shard(0)]> : tensor<8x16xf32> -> tensor<4x16xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, Tdx_ShardingAttr:$sharding,
                       OptionalAttr<StrAttr>:$site);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$input $sharding attr-dict `:` type($input) `->` type($result)";
}

def Tdx_FromLocalOp : Tdx_Op<"from_local", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "leave a manual region: the global value of every rank's piece (global view)";
  let description = [{
    `result` is the global value whose layout `sharding` gives each rank its
    `input` (GSPMD's shard-to-full): Shard concatenates the ranks' pieces,
    Partial sums them, Replicate claims they are equal, which
    tdx-check-replication verifies unless `unchecked`.

    ```mlir
    %y = tdx.from_local %l <@mesh, [Shard(0)]> : tensor<4x16xf32> -> tensor<8x16xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, Tdx_ShardingAttr:$sharding,
                       UnitAttr:$unchecked, OptionalAttr<StrAttr>:$site);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$input $sharding (`unchecked` $unchecked^)? attr-dict `:` "
    "type($input) `->` type($result)";
}

/// Communicates across ranks (tdx-fold-mesh refuses it on a folded axis).
def Tdx_Collective : NativeOpTrait<"TdxCollective">;
/// The runtimes start it where it stands and wait for its result where that
/// is first read (Context::start* and wait); every pass and emitter that
/// asks which collectives run asynchronously asks this trait.
def Tdx_AsyncCollective : NativeOpTrait<"TdxAsyncCollective">;
/// Combines the ranks' partial values (`reduce`): with Tdx_AsyncCollective,
/// what tdx-hoist-collectives starts early and tdx-schedule-waits waits for
/// late.
def Tdx_Reducing : NativeOpTrait<"TdxReducing">;

class Tdx_CollectiveOp<string mnemonic, string what, dag extra, string extraFmt,
                       list<Trait> traits = []>
    : Tdx_Op<mnemonic, !listconcat(traits, [Tdx_Collective,
        DeclareOpInterfaceMethods<SymbolUserOpInterface>])> {
  let summary = what # " over named mesh axes (local view)";
  let arguments = !con((ins Tdx_Tensor:$input, FlatSymbolRefAttr:$mesh,
                            StrArrayAttr:$mesh_axes), extra);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = "$input `on` $mesh `axes` `=` $mesh_axes " # extraFmt #
      " attr-dict `:` type($input) `->` type($result)";
  let extraClassDeclaration = [{
    /// Checks the mesh and axes, and returns the group size (the product of
    /// the sizes of the named axes), or failure after a diagnostic.
    ::mlir::FailureOr<int64_t> verifyGroup(::mlir::SymbolTableCollection &symbols);
  }];
}

def Tdx_AllGatherOp : Tdx_CollectiveOp<"all_gather", "all_gather",
    (ins I64Attr:$gather_dim), "`dim` `=` $gather_dim", [Tdx_AsyncCollective]> {
  let description = [{
    Concatenates every rank's `input` along `gather_dim`, in the group's rank
    order. Ranks may hold uneven chunks (`?` dims).

    ```mlir
    %g = tdx.all_gather %x on @mesh axes = ["tp"] dim = 0 : tensor<2x16xf32> -> tensor<8x16xf32>
    ```
  }];
}

def Tdx_AllReduceOp : Tdx_CollectiveOp<"all_reduce", "all_reduce",
    (ins Tdx_ReduceKind:$reduce), "`reduce` `=` $reduce",
    [Tdx_AsyncCollective, Tdx_Reducing]> {
  let runtimeCall = "ctx.startAllReduce($input, $mesh_axes, $reduce)";
  let description = [{
    ```mlir
    %s = tdx.all_reduce %x on @mesh axes = ["tp"] reduce = sum : tensor<8x16xf32> -> tensor<8x16xf32>
    ```
  }];
}

def Tdx_ReduceScatterOp : Tdx_CollectiveOp<"reduce_scatter", "reduce_scatter",
    (ins Tdx_ReduceKind:$reduce, I64Attr:$scatter_dim),
    "`reduce` `=` $reduce `dim` `=` $scatter_dim", [Tdx_AsyncCollective, Tdx_Reducing]> {
  let runtimeCall = "ctx.startReduceScatter($input, $mesh_axes, $reduce, $scatter_dim)";
  let description = [{
    Reduces across the group and leaves each rank its `torch.chunk` piece of
    `scatter_dim`. When the dim does not divide evenly the result dim is `?`.

    ```mlir
    %r = tdx.reduce_scatter %x on @mesh axes = ["tp"] reduce = sum dim = 0 : tensor<8x16xf32> -> tensor<2x16xf32>
    ```
  }];
}

def Tdx_AllToAllOp : Tdx_CollectiveOp<"all_to_all", "all_to_all",
    (ins I64Attr:$split_dim, I64Attr:$concat_dim),
    "`split` `=` $split_dim `concat` `=` $concat_dim"> {
  let runtimeCall = "ctx.allToAll($input, $mesh_axes, $split_dim, $concat_dim)";
  let description = [{
    Splits `split_dim` into group-size chunks, sends chunk `j` to rank `j`,
    and concatenates what it receives along `concat_dim`: `Shard(concat_dim)`
    becomes `Shard(split_dim)`.

    ```mlir
    %a = tdx.all_to_all %x on @mesh axes = ["tp"] split = 1 concat = 0 : tensor<2x16xf32> -> tensor<8x4xf32>
    ```
  }];
}

def Tdx_BroadcastOp : Tdx_CollectiveOp<"broadcast", "broadcast",
    (ins DenseI64ArrayAttr:$root), "`root` `=` $root",
    [SameOperandsAndResultType]> {
  let runtimeCall = "ctx.broadcast($input, $mesh_axes, $root)";
  let description = [{
    Every rank of the group receives the value of the rank at mesh
    coordinates `root` (one coordinate per named axis).

    ```mlir
    %b = tdx.broadcast %x on @mesh axes = ["dp"] root = [0] : tensor<8xf32> -> tensor<8xf32>
    ```
  }];
}

def Tdx_CollectivePermuteOp : Tdx_CollectiveOp<"collective_permute", "collective_permute",
    (ins DenseI64ArrayAttr:$pairs), "`pairs` `=` $pairs",
    [SameOperandsAndResultType, Tdx_AsyncCollective]> {
  let runtimeCall = "ctx.startPermute($input, $mesh_axes, $pairs)";
  let description = [{
    Every rank of the group sends its `input` to one rank and receives one
    rank's: `pairs` lists `source, target` group coordinates (flattened),
    each source and each target at most once, as JAX's `ppermute` and
    torch's `permute_tensor` take them. A rank no pair targets receives
    zeros. The ring of a hand-written all-reduce or of ring attention:

    ```mlir
    %n = tdx.collective_permute %x on @mesh axes = ["cp"] pairs = [0, 1, 1, 2, 2, 3, 3, 0] : tensor<4x8xf32> -> tensor<4x8xf32>
    ```
  }];
  let extraClassDeclaration = [{
    ::mlir::FailureOr<int64_t> verifyGroup(::mlir::SymbolTableCollection &symbols);
    /// The rank whose value coordinate `rank` receives, or -1.
    int64_t sourceOf(int64_t rank);
    /// The rank coordinate `rank` sends to, or -1.
    int64_t targetOf(int64_t rank);
  }];
}

def Tdx_RaggedAllToAllOp : Tdx_Op<"ragged_all_to_all", [Tdx_Collective, Tdx_AsyncCollective,
    AllTypesMatch<["input_offsets", "send_sizes", "output_offsets", "recv_sizes"]>,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "all_to_all of rows whose counts are values (local view)";
  let description = [{
    Every rank sends rows `[input_offsets[j], input_offsets[j] + send_sizes[j])`
    of `input` (dim 0) to group rank `j`, and puts the `recv_sizes[i]` rows
    rank `i` sends it at `output_offsets[i]` of its result; rows nobody
    writes are zero. The buffers are static, the offsets and sizes are
    tensors of one entry per group rank, computed on the ranks and never
    read by the program (XLA's `ragged_all_to_all`, except that the output
    offsets are the receiver's own, as MPI_Alltoallv's displacements are).
    Rank `i`'s `recv_sizes[j]` must be rank `j`'s `send_sizes[i]`; the
    runtime checks it and every range. Its adjoint is the same op with
    the offsets and sizes swapped. It runs asynchronously (a `tdx.start`
    and `tdx.wait` pair after tdx-async-collectives): the sizes are checked
    when it starts, the rows move until its wait. An expert-parallel
    dispatch moves only the routed rows with it:

    ```mlir
    %r = tdx.ragged_all_to_all %x, %in_off, %send, %out_off, %recv on @mesh axes = ["ep"] : tensor<32x64xf32>, tensor<2xi64> -> tensor<64x64xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, Tdx_Tensor:$input_offsets, Tdx_Tensor:$send_sizes,
                       Tdx_Tensor:$output_offsets, Tdx_Tensor:$recv_sizes,
                       FlatSymbolRefAttr:$mesh, StrArrayAttr:$mesh_axes);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$input `,` $input_offsets `,` $send_sizes `,` $output_offsets `,` $recv_sizes `on` $mesh "
    "`axes` `=` $mesh_axes attr-dict `:` type($input) `,` type($input_offsets) `->` type($result)";
}

/// Point to point over one mesh axis (pipeline stages): the peer is the
/// rank whose coordinates differ from this one's only on `mesh_axes`' one
/// axis, where it is `peer`. A send never waits for its receiver (the
/// runtime copies the value and sends it in the background, so no schedule
/// deadlocks on sends); a recv waits for its value with the collective
/// deadline. Messages between two ranks match by `tag`.
def Tdx_SendOp : Tdx_Op<"send", [Tdx_Collective,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "send a value to the rank at `peer` on one mesh axis (local view)";
  let description = [{
    `tdx-schedule-pipeline` sends an activation, a gradient or the loss to
    the pipeline stage that reads it.

    ```mlir
    tdx.send %x on @mesh axes = ["pp"] to 1 tag 3 : tensor<4x16xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, FlatSymbolRefAttr:$mesh,
                       StrArrayAttr:$mesh_axes, I64Attr:$peer, I64Attr:$tag);
  let assemblyFormat =
    "$input `on` $mesh `axes` `=` $mesh_axes `to` $peer `tag` $tag attr-dict `:` type($input)";
}

def Tdx_RecvOp : Tdx_Op<"recv", [Tdx_Collective,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "receive a value from the rank at `peer` on one mesh axis (local view)";
  let description = [{
    Waits for the `tdx.send` with the same `tag` from `peer` (at most one
    `?` dim, whose size the message gives).

    ```mlir
    %x = tdx.recv on @mesh axes = ["pp"] from 0 tag 3 : tensor<4x16xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$mesh, StrArrayAttr:$mesh_axes, I64Attr:$peer,
                       I64Attr:$tag);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "`on` $mesh `axes` `=` $mesh_axes `from` $peer `tag` $tag attr-dict `:` type($result)";
}

def Tdx_MeshCoordOp : Tdx_Op<"mesh_coord", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let runtimeCall = "T::scalar_tensor(ctx.coord($axis), T::kLong)";
  let summary = "this rank's coordinate on one mesh axis (local view)";
  let description = [{
    A 0-D i64 tensor holding the calling rank's coordinate along `axis`;
    the partitioner uses it for rank-dependent slices.

    ```mlir
    %c = tdx.mesh_coord @mesh axis = "tp" : tensor<i64>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$mesh, StrAttr:$axis);
  let results = (outs 0DTensorOf<[I64]>:$result);
  let assemblyFormat = "$mesh `axis` `=` $axis attr-dict `:` type($result)";
}

def Tdx_ChunkOp : Tdx_Op<"chunk", [Pure]> {
  let runtimeCall = "Context::chunk($input, $chunks, $index.item<int64_t>(), $dim)";
  let summary = "the index-th torch.chunk of a dim (local view)";
  let description = [{
    Splits `dim` into `chunks` pieces as `torch.chunk` does (piece size
    `ceil(n / chunks)`, trailing pieces short or empty) and yields piece
    `index`. When the split is uneven the result dim is `?`. The partitioner
    emits it, with a `tdx.mesh_coord` index, where a replicated value becomes
    sharded.

    ```mlir
    %c = tdx.mesh_coord @mesh axis = "tp" : tensor<i64>
    %s = tdx.chunk %x[%c] chunks = 4 dim = 0 : tensor<8x16xf32>, tensor<i64> -> tensor<2x16xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, 0DTensorOf<[AnySignlessInteger]>:$index,
                       I64Attr:$chunks, I64Attr:$dim);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = [{
    $input `[` $index `]` `chunks` `=` $chunks `dim` `=` $dim attr-dict `:`
    type($input) `,` type($index) `->` type($result)
  }];
  let hasVerifier = 1;
  // This rank's chunk of an all_gather over one axis along the same dim is
  // the all_gather's input.
  let hasFolder = 1;
}

#endif // TDX_DIALECT_TDXSHARDINGOPS_TD
