//===- Passes.td - tdx passes ------------------------------*- tablegen -*-===//

#ifndef TDX_PASSES_TD
#define TDX_PASSES_TD

include "mlir/Pass/PassBase.td"

def ModelSummary : Pass<"tdx-model-summary", "::mlir::ModuleOp"> {
  let summary = "Print a table of parameters, buffers and forward ops";
  let description = [{
    Prints, for every `tdx.parameter` and `tdx.buffer`: its qualified name,
    dtype, global shape, element count, bytes, how it is initialized (the op
    that produces the yielded value, or the name it is tied to) and its
    sharding. Then the totals (tied names counted once) and, for each
    function, how many times each op occurs. The IR is left unchanged.

    ```
    tdx-opt model.mlir --tdx-model-summary -o /dev/null
    ```
  }];
  let options = [
    Option<"outputFile", "output", "std::string", /*default=*/"\"-\"",
           "Where to write the summary ('-' is stdout)">
  ];
}

def RaiseAten : Pass<"tdx-raise-aten", "::mlir::ModuleOp"> {
  let summary = "Raise generic tdx.aten ops to first-class tdx ops";
  let description = [{
    Capture records every aten op as a generic `tdx.aten` op with all of its
    schema arguments; this pass rewrites the ones tdx knows into first-class
    ops (which have sharding rules and CPU and CUDA lowerings), from one
    table in `passes/RaiseAten.cpp` (the elementwise rows come from
    `include/tdx/Runtime/ElementwiseOps.def`). Type promotion becomes
    explicit `tdx.cast` ops; Scalars become `tdx.full` scalars; decompositions
    (batch norm in eval mode, clamp, hardtanh, triu, outer, ...) become
    several ops. An op whose arguments the table does not cover (a
    rounding mode, a used second result, training-mode batch norm) stays
    generic and runs through ATen on the CPU backend. Parameter init
    regions are raised too. Capture runs this pass; `tdx-opt` exposes it
    for tests.

    ```
    tdx-opt captured.mlir --tdx-raise-aten
    ```
  }];
  let options = [
    Option<"report", "report", "bool", /*default=*/"false",
           "Emit a remark at every tdx.aten op left generic">
  ];
}

def ManualProgram : Pass<"tdx-manual-program", "::mlir::ModuleOp"> {
  let summary = "Make a program written per rank (user collectives) the partitioned program of its mesh";
  let description = [{
    A program whose communication the user wrote (`tdx.mpi`'s calls inside
    `tdx.trace` / `tdx.trace_train_step`, recorded as `tdx.aten "tdx::..."`
    ops) is per-rank code already. This pass declares its mesh, places
    every parameter and buffer Replicate, every function argument of rank
    >= 1 as this rank's rows of a global input split along dim 0 over all
    mesh axes (`Shard(0)`, with its `tdx.global_type`), 0-D arguments and
    results Replicate, and rewrites each `tdx::all_reduce`, `all_gather`,
    `reduce_scatter`, `all_to_all`, `broadcast`, `permute` into the
    dialect's collective and `tdx::rank` into `tdx.mesh_coord`, located at
    the user's source line (the call's `site`). The module is then
    partitioned: propagation and partitioning leave it alone.

    ```
    tdx-opt step.mlir --tdx-manual-program="shape=4 axes=world"
    ```
  }];
  let options = [
    Option<"meshName", "mesh", "std::string", /*default=*/"\"mesh\"",
           "The mesh's symbol name">,
    ListOption<"shape", "shape", "int64_t", "The mesh's shape">,
    ListOption<"axes", "axes", "std::string", "The mesh's axis names">
  ];
}

def CheckMessages : Pass<"tdx-check-messages", "::mlir::ModuleOp"> {
  let summary = "Check that every rank's sends, receives and collectives can complete";
  let description = [{
    Runs the communication of every rank's program without data, as the
    runtime would: a pipeline's rank runs the function `tdx.pipeline` names
    for its coordinate on the pipeline's axis (the forward and the derived
    backward of `tdx-schedule-pipeline`'s schedule), any other program with
    a `tdx.send` or `tdx.recv` is run by every rank of the mesh. A
    `tdx.send` never waits; a `tdx.recv` waits for the oldest send from its
    peer with its tag; a collective waits until every rank of its group
    (the ranks that differ from it only on its `mesh_axes`) reaches a
    collective over the same axes. Errors, each at the op with a note at
    the other rank's:

    - a receive whose sender sends another shape or dtype;
    - a send no rank receives (a note where the peer's program ends);
    - a wait-for cycle (every rank of it waits for the next: a deadlock),
      or a receive or collective whose peer's program ends first;
    - two ranks of one group that reach different collectives there (ops,
      attributes or types), i.e. their collectives in different orders.

    `tdx-spmd` runs it last, on the per-rank programs it makes.

    ```
    tdx-opt step.mlir --tdx-check-messages
    ```
  }];
}

def CheckReplication : Pass<"tdx-check-replication", "::mlir::ModuleOp"> {
  let summary = "Check that a manual region's Replicate outputs are equal across their axes";
  let description = [{
    In a manual region (`tdx.to_local` ... `tdx.from_local`, from
    `tdx.local_map` / `tdx.shard_map`), a value varies over a mesh axis when
    it is computed from an input split or partial over that axis, from the
    rank on it (`tdx::rank`), or from a `tdx::permute`, `reduce_scatter` or
    `all_to_all` over it; `tdx::all_reduce`, `all_gather` and `broadcast`
    over an axis make it equal there again. A `tdx.from_local` that claims
    Replicate over an axis its value varies over is an error naming the
    region's output and the op that made it vary (JAX's replication check),
    unless it is `unchecked`. A region input's gradient claimed Replicate
    (`in_grad_placements`) is checked the same way: one that differs across
    the axis would silently differ from eager's.

    ```
    tdx-opt step.mlir --tdx-check-replication
    ```
  }];
}

def ExpandBatchNorm : Pass<"tdx-expand-batch-norm", "::mlir::ModuleOp"> {
  let summary = "Write training-mode batch norm as per-channel sums";
  let description = [{
    Rewrites `aten::native_batch_norm` in training mode and its
    `aten::native_batch_norm_backward` (generic ops ATen runs on whole
    tensors) into per-channel sums and elementwise ops: the mean, the sum
    of squares about it, the normalized batch; in the backward the sums of
    `dy` and `dy * (x - mean)`. The running statistics become `tdx.assign`s
    of their buffers (momentum, unbiased variance, as ATen). With the batch
    split over a mesh axis every sum is a per-channel Partial that
    propagation all-reduces, so a data-parallel step never gathers the
    batch and its statistics are the global batch's (SyncBatchNorm's).

    A module attribute `tdx.batch_norm_local = "dp"` (`tdx.parallelize(...,
    batch_norm="local")`) takes each shard's own statistics instead, as DDP
    without SyncBatchNorm: the batch is viewed as `[G, N/G, ...]` for the
    axis' `G` ranks, every statistic is per group (no communication), the
    parameters' gradients sum over the groups and the running statistics
    follow group 0 (DDP's rank 0). Eval-mode batch norm is left to
    `tdx-raise-aten`. The place pipeline runs this pass first.

    ```
    tdx-opt step.mlir --tdx-expand-batch-norm
    ```
  }];
}

def PrintShardingRules : Pass<"tdx-print-sharding-rules"> {
  let summary = "Report the sharding rule (factor mapping) of every op";
  let description = [{
    Emits a remark at every op in the IR with its factor mapping as
    `tdx-propagate-sharding` sees it, Shardy-style:

    ```
    remark: sharding rule: ([i, k], [k, j]) -> ([i, j]) {i=8, j=4, k=16} reduction={k} partial=sum
    ```

    A dim is written as its factors, major to minor (`jk` for a dim that a
    reshape splits into `j` and `k`), or `1` when it has none. Ops without a
    rule of their own (generic `tdx.aten` ops, other dialects' ops) report
    the fully replicated rule they are treated with. The IR is unchanged.
  }];
}

def PropagateSharding : Pass<"tdx-propagate-sharding", "::mlir::ModuleOp"> {
  let summary = "Give every tensor value of every function a placement";
  let description = [{
    Starts from the user's placements (`tdx.annotate` ops, `sharding` on
    `tdx.parameter`, `tdx.sharding` argument attributes) and gives every
    tensor value of each function a placement on the mesh they name, using
    each op's sharding rule (its factor mapping, see
    `tdx-print-sharding-rules`).

    Propagation is global and bidirectional: it sweeps the function forward
    and backward until nothing changes, once per priority level (annotation
    `priority` 0 first), so higher-priority annotations claim values first.
    A user annotation is never overridden. Two user annotations that ask one
    op to shard different factors over one mesh axis at the same priority are
    an error that names both; other contested choices are settled by the cost
    model: bytes moved under an alpha-beta model of each collective
    (bandwidth and latency per mesh axis, plus 25 us for each call of a
    collective, tdx::collectiveSeconds) plus compute plus memory (the
    bytes each rank holds of the results, weighed by `memory`). `explain` reports the
    candidates and costs of every contested choice as remarks.

    Then every op picks the layout it computes in (the cheapest given its
    operands), and every operand whose layout differs from what its op needs
    gets a `tdx.redistribute`. Results carry `tdx.shardings`, arguments
    `tdx.sharding`; parameters without a `sharding` get the one chosen for
    them; `tdx.annotate` ops are folded away.
  }];
  let options = [
    ListOption<"bandwidth", "bandwidth", "double",
               "Bytes per second of each mesh axis, in mesh order (default 1e10)">,
    ListOption<"latency", "latency", "double",
               "Seconds of latency per collective step on each mesh axis (default 1e-5)">,
    Option<"flops", "flops", "double", /*default=*/"1e11",
           "Floating-point operations per second of one device">,
    Option<"memory", "memory", "double", /*default=*/"1e-10",
           "Seconds charged per byte a rank holds of an op's results and "
           "of its operands' redistributed copies beyond what it held (the "
           "memory term; default: writing them at 10 GB/s; 0 leaves memory "
           "out, larger trades communication for memory)">,
    Option<"explain", "explain", "bool", /*default=*/"false",
           "Emit a remark for every contested placement with the candidates' costs">
  ];
}

def InsertCollectives : Pass<"tdx-insert-collectives", "::mlir::ModuleOp"> {
  let summary = "Split every layout change into single-collective steps";
  let description = [{
    Rewrites every `tdx.redistribute` into a chain of redistributes that each
    change one mesh axis by one collective or local step:

    | on one axis | becomes |
    |---|---|
    | `Shard(d)` to `Replicate` | all_gather |
    | `Partial` to `Replicate` | all_reduce |
    | `Partial` to `Shard(d)` | reduce_scatter |
    | `Shard(i)` to `Shard(j)` | all_to_all |
    | `Replicate` to `Shard(d)` | local chunk (no communication) |
    | `Replicate` to `Partial(sum)` | local zeroing off coordinate 0 |
    | `Shard` to `Partial`, `Partial` to another `Partial` | through `Replicate` |

    On N-D meshes the order of the steps is the cheapest valid one under the
    alpha-beta cost model (for example reducing before gathering moves fewer
    bytes); shards of one dim over several axes stay nested in mesh order.
    Uneven shards follow `torch.chunk`. With `report`, each step is also
    reported as a remark naming its collective and bytes.
  }];
  let options = [
    ListOption<"bandwidth", "bandwidth", "double",
               "Bytes per second of each mesh axis, in mesh order (default 1e10)">,
    ListOption<"latency", "latency", "double",
               "Seconds of latency per collective step on each mesh axis (default 1e-5)">,
    Option<"report", "report", "bool", /*default=*/"false",
           "Emit a remark per step with its collective and bytes per rank">
  ];
}

def FoldMesh : Pass<"tdx-fold-mesh", "::mlir::ModuleOp"> {
  let summary = "Run folded mesh axes inside each rank, with the whole mesh's reductions";
  let description = [{
    For a `tdx.mesh` with `ranks` (after `tdx-insert-collectives`): every
    axis of `ranks` 1 is folded. Each value a folded axis splits or leaves
    Partial is held as one value per shard of the folded axes, each op that
    reads one is cloned per shard with the shard's shapes (the op that rank
    of the whole mesh runs), and each single-axis `tdx.redistribute` over a
    folded axis becomes local: Partial shards are summed pairwise in
    coordinate order, shards are concatenated (`tdx.concat`) or sliced
    (`tdx.slice`). A redistribute over an axis that keeps its ranks runs per
    shard. State, arguments and results stay whole. Then the folded axes
    leave every placement and the mesh's shape becomes its `ranks`.

    Every folding of one mesh so computes the same ops on the same shapes
    and sums what crosses an axis in the same order: with unfolded axes of
    at most 2 ranks (whose all_reduce adds two values, in either order),
    the results are bitwise the same on every folding. Without `ranks` the
    pass does nothing.

    ```
    tdx-opt model.mlir --tdx-insert-collectives --tdx-fold-mesh --tdx-partition
    ```
  }];
}

def Partition : Pass<"tdx-partition", "::mlir::ModuleOp"> {
  let summary = "Rewrite the global program into the per-rank (SPMD) program";
  let description = [{
    Turns every placed function (after `tdx-propagate-sharding` and
    `tdx-insert-collectives`) into the program each rank runs: every tensor
    type becomes its local shard type (`torch.chunk` sizes; `?` where ranks
    hold different sizes), shape attributes follow (`tdx.reshape`,
    `tdx.expand`), and each single-axis `tdx.redistribute` becomes its
    collective over the named mesh axis: `tdx.all_gather`,
    `tdx.all_reduce`, `tdx.reduce_scatter`, `tdx.all_to_all`, or a
    rank-dependent `tdx.chunk` / zeroing through `tdx.mesh_coord`. Each
    collective records its largest per-rank payload in `tdx.payload_bytes`.
    Parameter declarations keep their global type and sharding; references
    read the local shard; each function argument and result keeps its global
    type in `tdx.global_type`. The module is marked `tdx.partitioned`.
  }];
}

def WidenReductions : Pass<"tdx-widen-reductions", "::mlir::ModuleOp"> {
  let summary = "Sum every collective's narrow floats in the module's reduce type";
  let description = [{
    Mixed precision's `reduce_dtype`: on a partitioned module whose
    `tdx.reduce_type` is a float type (or with `reduce-type=f32`), every
    collective that sums (`tdx.all_reduce`, `tdx.reduce_scatter`) on a
    narrower float becomes a cast to that type, the collective on it, and a
    cast back, so tensor and sequence parallelism's reductions sum in it as
    the data-parallel gradients' do. Its `tdx.payload_bytes` grows with the
    element. Without a reduce type the pass does nothing.

    ```
    tdx-opt step.mlir --tdx-partition --tdx-widen-reductions=reduce-type=f32
    ```
  }];
  let options = [Option<"reduceType", "reduce-type", "std::string", "\"\"",
                        "The float type to sum in (f32, f64), over the module's tdx.reduce_type">];
}

def RegatherParameters : Pass<"tdx-regather-parameters", "::mlir::ModuleOp"> {
  let summary = "ZeRO-3: gather a parameter again for a reader far from the first";
  let description = [{
    On a partitioned module, a parameter's `tdx.all_gather` (of its
    `tdx.param_ref`, or of the narrowing cast mixed precision reads it
    through) whose next reader comes `distance` ops or more after the one
    before it (the backward's, after the rest of the forward and backward)
    is made again right before that reader, with its `param_ref`, so the
    gathered parameter is not held between the forward and the backward.
    `tdx-prefetch-all-gathers` then starts the new gather ahead as it does
    the forward's. A state written in between keeps its one gather. The
    numbers do not change: the same shard is gathered twice.

    ```
    tdx-opt step.mlir --tdx-partition --tdx-regather-parameters=distance=64
    ```
  }];
  let options = [Option<"distance", "distance", "int64_t", /*default=*/"64",
                        "Ops between two readers from which the later one gathers again "
                        "(0: never)">];
}

def PrefetchAllGathers : Pass<"tdx-prefetch-all-gathers", "::mlir::ModuleOp"> {
  let summary = "Start each parameter's all_gather while the ops before it run";
  let description = [{
    On a partitioned module, moves every `tdx.all_gather` of a parameter
    (of a `tdx.param_ref`'s value, ZeRO-3's) together with its `param_ref`
    up to right after the first reader of the all_gather `ahead` gathers
    before it, so the gather runs while that reader and what follows it
    compute (the backends start it there and wait where its result is first
    read). At most `ahead` prefetched gathers are alive beyond what the
    program holds anyway. A gather does not move above a `tdx.assign` of its
    parameter, nor above where its `param_ref` could not go.

    ```
    tdx-opt model.mlir --tdx-insert-collectives --tdx-partition \
        --tdx-prefetch-all-gathers
    ```
  }];
  let options = [
    Option<"ahead", "ahead", "unsigned", /*default=*/"1",
           "How many gathers ahead a gather starts (0: where it stands)">
  ];
}

def HoistCollectives : Pass<"tdx-hoist-collectives", "::mlir::ModuleOp"> {
  let summary = "Start each all_reduce and reduce_scatter as soon as its input is made";
  let description = [{
    On a partitioned module, moves every `tdx.all_reduce` and
    `tdx.reduce_scatter` of a function's body up to right after the op that
    makes its input (to the top of the body for an argument), with the
    reshapes and transposes between that op and it that nothing else reads
    (autograd leaves a bias gradient's reshape where the optimizer reads
    it). The backends
    start a collective where it stands and wait for it where its result is
    first read, so everything between runs while it is in flight: a
    training step's gradient reductions start as each gradient is made and
    overlap the rest of the backward, instead of starting where the
    optimizer first reads them. Every rank runs the same program, so the
    collectives keep one order across ranks, and what meets at one place
    keeps its program order. Nothing else moves.

    ```
    tdx-opt model.mlir --tdx-insert-collectives --tdx-partition \
        --tdx-hoist-collectives
    ```
  }];
}

def ScheduleWaits : Pass<"tdx-schedule-waits", "::mlir::ModuleOp"> {
  let summary = "Order the work after the last reduction by the reductions it waits for";
  let description = [{
    On a partitioned module, reorders the ops of a function's body that
    follow its last reduction (`tdx.all_reduce`, `tdx.reduce_scatter`) so
    that work waiting for a reduction started earlier runs first, and work
    that waits for none runs right before the first op that needs it (an
    all_gather there, ZeRO's of an updated parameter, goes with the update
    that makes its input). A training step's
    optimizer updates then run in the order their gradients' reductions
    started (the last layers' first), so the first layers' reductions, the
    last to start, complete while the other updates compute, instead of
    the first update waiting for them. Dependences are kept, and so is the
    order of the `tdx.param_ref`s and `tdx.assign`s of one state and of
    generic `tdx.aten` ops.

    ```
    tdx-opt model.mlir --tdx-insert-collectives --tdx-partition \
        --tdx-hoist-collectives --tdx-schedule-waits
    ```
  }];
}

def SplitStages : Pass<"tdx-split-stages", "::mlir::ModuleOp"> {
  let summary = "Split a training step into pipeline stages, balanced by cost";
  let description = [{
    On a partitioned module whose `tdx.pipeline` asks for a pipeline
    (`tdx.parallelize(..., pipeline=tdx.Pipeline("pp", ...))`), cuts the
    model's layers into `ranks x stages_per_rank` contiguous chunks whose
    forward seconds (by the cost model) are as even as they can be, and gives
    every op of `@train_step` and every state its chunk (`tdx.stage`). A
    state's layer is its name up to its first number (`h.3.mlp.c_fc.weight`
    is layer `h.3`), else its module (`ln_f.weight`: `ln_f`); optimizer state
    goes with its parameter. Every layer is in exactly one chunk; a model
    with fewer layers than chunks, or a plan that places anything on the
    pipeline's axis, is refused. Adds each chunk's layers (`stages`) and
    seconds (`chunk_seconds`), and each layer's seconds in order
    (`layer_seconds`), to `tdx.pipeline`. Without `tdx.pipeline` it
    does nothing.

    ```
    tdx-opt step.mlir --tdx-place --tdx-spmd     # runs it, and tdx-schedule-pipeline
    tdx-opt partitioned.mlir --tdx-split-stages
    ```
  }];
}

def SchedulePipeline : Pass<"tdx-schedule-pipeline", "::mlir::ModuleOp"> {
  let summary = "Each pipeline rank's step, straight-line, in its schedule's order";
  let description = [{
    After `tdx-split-stages`, replaces `@train_step` by one function per rank
    of the pipeline axis, `@train_step_pp<r>`, with the same signature: the
    ops of its chunks (chunk c on rank c mod the axis size) in the order
    the schedule (`gpipe`, `1f1b`, `interleaved-1f1b`, `zb-h1`) runs the
    forward and backward of each chunk on each micro-batch (zero bubble's
    H1 splits a backward into its inputs' gradients, B, and its weights',
    W: the ops whose results reach only the gradient sums and the update;
    1F1B's order with each rank's W's p - r - 1 micro-batches late, the rest
    in its cooldown), `tdx.send` right after a
    value another rank reads is made and `tdx.recv` right before a rank
    first reads a value made elsewhere. Summing the micro-batches and the
    optimizer's update run as soon as their inputs are there. The loss
    reaches every rank. All ranks' ops follow one order (the schedule timed
    by the cost model), so no recv waits for a send made after it; that
    timeline is kept as `tdx.pipeline`'s `timeline` (rank, F 0 / B 1 / W 2,
    chunk, micro-batch, start and end seconds per task).

    ```
    tdx-opt split.mlir --tdx-schedule-pipeline
    ```
  }];
}

def CommReport : Pass<"tdx-comm-report", "::mlir::ModuleOp"> {
  let summary = "Print every collective of one forward step and the total bytes";
  let description = [{
    On a partitioned module, prints one line per collective in program order:
    its kind, the mesh axes it runs over, the group size, and its payload in
    bytes per rank (the largest local buffer a rank passes in), then the
    count and the total. `format=json` prints the same as a JSON list of
    objects with keys `kind`, `mesh_axes`, `group_size`, `bytes`, `dtype`,
    `seconds` (by the cost model: alpha-beta plus the call,
    tdx::collectiveSeconds) and `location`. The IR is unchanged.

    ```
    tdx-opt model.mlir --tdx-propagate-sharding --tdx-insert-collectives \
        --tdx-partition --tdx-comm-report -o /dev/null
    ```
  }];
  let options = [
    Option<"outputFile", "output", "std::string", /*default=*/"\"-\"",
           "Where to write the report ('-' is stdout)">,
    Option<"format", "format", "std::string", /*default=*/"\"table\"",
           "'table' or 'json'">
  ];
}

def PipelineReport : Pass<"tdx-pipeline-report", "::mlir::ModuleOp"> {
  let summary = "Print a scheduled pipeline's stages, timeline and bubbles";
  let description = [{
    On a module tdx-split-stages and tdx-schedule-pipeline ran on (a
    partitioned program with `pipeline=`), prints the pipeline: each
    stage's rank, layers and forward seconds by the cost model, and the
    schedule as that model timed it: each rank's busy seconds and bubble
    (its idle over its busy time until the last task ends) next to the
    ideal (p-1)/(v m). `format=json` prints an object with `axis`,
    `schedule`, `ranks`, `microbatches`, `stages_per_rank`, `stages` (each
    stage's layers), `layer_seconds`, `stage_seconds`, `timeline` (tasks
    with `rank`, `phase` F, B or W, `stage`, `microbatch`, `start`, `end`),
    `end`, `busy`, `bubble` (per rank) and `ideal_bubble`:
    `prog.pipeline_report()`. The IR is unchanged.
  }];
  let options = [
    Option<"outputFile", "output", "std::string", /*default=*/"\"-\"",
           "Where to write the report ('-' is stdout)">,
    Option<"format", "format", "std::string", /*default=*/"\"table\"",
           "'table' or 'json'">
  ];
}

def LinearPairs : Pass<"tdx-linear-pairs", "::mlir::ModuleOp"> {
  let summary = "Find Megatron's column- and row-parallel linear layers";
  let description = [{
    Reads the entry function's forward (what its first result is computed
    from) for linear layers: `tdx.linear`, a `tdx.matmul` by a transposed
    2-D parameter (an `nn.Linear` without bias), or a `tdx.matmul` of a 2-D
    input by a parameter stored (in, out) (Hugging Face's `Conv1D`, an
    `addmm`; listed under `in_out`, so its splits take the other dims). A
    linear whose
    output reaches another linear's input through no third linear is the
    first of a pair. In program order, a linear fed by a column-parallel
    one is row parallel; one that feeds another and is fed by none is
    column parallel (attention's q, k and v projections, an MLP's up and
    gate projections); the rest (an output head, a lone projection) stays
    whole, and so does a weight read by layers of both kinds. Prints
    `{"column": [...], "in_out": [...], "norm": [...], "row": [...]}` with
    the weights' names (`norm`: the 1-D parameters of the op that makes a
    column-parallel layer's input):
    `tdx.auto_parallelize` splits them over a tensor-parallel axis. The IR
    is unchanged.

    ```
    tdx-opt step.mlir --tdx-linear-pairs -o /dev/null
    ```
  }];
  let options = [
    Option<"outputFile", "output", "std::string", /*default=*/"\"-\"",
           "Where to write the pairs ('-' is stdout)">
  ];
}

def Explain : Pass<"tdx-explain", "::mlir::ModuleOp"> {
  let summary = "Draw the plan as one static HTML page";
  let description = [{
    On a partitioned module, writes one HTML page with inline SVG (no
    script, nothing fetched):

    - **Placements**: per layer and per state tensor, its placement on
      each mesh axis, and its optimizer state's where that is placed
      otherwise (ZeRO). A layer is the name up to its first number
      (`layers.3`); consecutive layers placed alike are drawn once, with
      their count.
    - **The step**: the live bytes of the step's own tensors from its
      start to its end (the liveness that plans its memory), with the peak
      marked, and every collective where it runs, one lane per kind, tall
      by its bytes (its kind, axes, bytes, element type and source location
      on hover); then the collectives by kind, axes and element type.
    - **Memory per rank**: parameters, optimizer state, inputs, gradients
      and activations as tdx-memory-report counts them, against
      `tdx.memory_budget` when the module has one.
    - **Pipeline** (a module scheduled by `tdx-schedule-pipeline`): each
      stage's layers and forward seconds, and the schedule's `timeline` as
      one row per pipeline rank of forward (F) and backward (B) blocks per
      stage and micro-batch, the gaps between them its bubbles, with each
      rank's idle over busy time next to (p-1)/(v m). The other sections
      show pipeline rank 0's step.

    `tdx.explain(prog, "plan.html")` runs it on a partitioned, planned copy
    of a program.

    ```
    tdx-opt step.mlir --tdx-spmd --tdx-backend=check-budget=0 \
        --tdx-explain=output=plan.html -o /dev/null
    ```
  }];
  let options = [
    Option<"outputFile", "output", "std::string", /*default=*/"\"-\"",
           "Where to write the page ('-' is stdout)">
  ];
}

// The backend pipeline (tdx-backend): decisions the emitters print.
include "BackendPasses.td"

#endif // TDX_PASSES_TD
