//===- BackendPasses.td - the tdx-backend pipeline's passes -*- tablegen -*-===//
//
// Included by Passes.td: the passes whose decisions the emitters print.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_BACKENDPASSES_TD
#define TDX_BACKENDPASSES_TD

include "mlir/Pass/PassBase.td"

def FuseElementwise : Pass<"tdx-fuse-elementwise", "::mlir::ModuleOp"> {
  let summary = "Group elementwise chains into tdx.fused kernels";
  let description = [{
    On a partitioned module, groups chains of elementwise ops (add ... gelu,
    cmp, where, cast) over one iteration shape into `tdx.fused` regions,
    one kernel each, placed where the kernel's last op stood. Ops join the
    open kernel of their shape whose value they read, open kernels they both
    read merge, and a kernel closes when something else reads its value or
    its inputs and results would exceed a launch's 16 operands. A softmax,
    log_softmax, layer_norm or rms_norm over the last dim whose input a
    kernel makes ends that kernel (it runs on each row of the body's
    result). Splat constants only kernels read become literals inside them,
    and a `tdx.linear` whose every reader is fused leaves its bias to those
    kernels (each adds it first). Unread elementwise ops are erased.

    ```
    tdx-opt step.mlir --tdx-fuse-elementwise
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

def AsyncCollectives : Pass<"tdx-async-collectives", "::mlir::ModuleOp"> {
  let summary = "Start asynchronous collectives and wait for them where first read";
  let description = [{
    Wraps every collective with the `Tdx_AsyncCollective` trait (all_gather,
    all_reduce, reduce_scatter) of a function's body in `tdx.start`, and
    puts the `tdx.wait` of its token right before the first op that reads
    the result (one that nothing reads is waited for before the return).
    Run after `tdx-fuse-elementwise`, so a kernel waits where it runs.
  }];
}

def OverlapDispatch : Pass<"tdx-overlap-dispatch", "::mlir::ModuleOp"> {
  let summary = "Run the work that needs no ragged all-to-all while it is in flight";
  let description = [{
    After `tdx-async-collectives`: for each `tdx.wait` of a
    `tdx.ragged_all_to_all` (an expert-parallel dispatch or combine), the
    ops that follow it up to the first collective, start, wait, state
    write or random generic op move before the wait, in their order, unless
    they need its result (directly or through the ops between). In a
    DeepSeek-style MoE block the shared expert, which reads the block's
    input only, then computes while the combine's rows come back:
    DeepSeek's overlap at the granularity of start and wait. Dependences
    are kept; the ops that need the result stay after the wait.

    ```
    tdx-opt step.mlir --tdx-async-collectives --tdx-overlap-dispatch
    ```
  }];
}

def Recompute : Pass<"tdx-recompute", "::mlir::ModuleOp"> {
  let summary = "Run ops again after the step's peak instead of holding their results";
  let description = [{
    Fits a partitioned step in its memory budget (`tdx.memory_budget` on the
    module, or the `budget` option) by holding fewer tensors across its
    peak. A tensor made before the peak and read after it is either held,
    or made again right before its first read after the peak, from tensors
    that are held (the step's arguments and state are always at hand).

    The choice is a minimum cut of the ops before the peak that the reads
    after it need, as functorch's min-cut rematerialization: holding an
    op's results costs their bytes; running the op again costs its time at
    a price in bytes per second (a matmul's FLOPs, a collective's latency
    and bytes, the bytes any other op moves), so a collective is run again
    only where that is the cheaper side of the cut. The price starts at
    1e12 (nothing runs again) and falls tenfold to 1e5 until the step fits;
    at each price the pass cuts at the peak and again at the peak that
    moves. Of the prices tried, the first that fits is kept, else the one
    with the lowest peak (which tdx-memory-report then refuses). The ops run
    again carry `tdx.recomputed` (a collective: its `tdx.start` and
    `tdx.wait`), and tdx-memory-report counts them.

    Random ops are the tdx counter-based ones, so running them again gives
    the same values; a generic aten op that draws random numbers is held.
    A step within its budget, or without one, is left as it is. Each
    pipeline rank's step (tdx-schedule-pipeline's) is fitted on its own,
    with the state of its own stages. tdx-backend
    runs it after tdx-async-collectives, on the kernels the backends run.

    ```
    tdx-opt step.mlir --tdx-recompute=budget=1000000 --tdx-memory-report
    ```
  }];
  let options = [
    Option<"budget", "budget", "int64_t", /*default=*/"0",
           "Bytes a rank may hold at the peak (0: the module's tdx.memory_budget)">
  ];
}

def PlanMemory : Pass<"tdx-plan-memory", "::mlir::ModuleOp"> {
  let summary = "Place the step's tensors in one arena and its state writes";
  let description = [{
    The memory plan of a partitioned step, written into the IR:

    - Every tensor the step makes and drops within the step (not a view,
      not returned, not written to a state) gets a byte offset in one arena
      (`tdx.arena`, one entry per result, -1 for a tensor left to the
      allocator); tensors alive at once get disjoint ranges of 64-byte
      lines, the largest placed first, each at the lowest offset that fits.
      A started collective's result is made by its `tdx.start`.
    - A state written once, by a value an op makes, is written
      (`tdx.assign` moved) right after both that op and the state's last
      `tdx.param_ref`, so an update holds one copy of the state, not two.
      Other writes move before the return, by state name.
    - The module gets `tdx.arena_bytes` and `tdx.step_bytes`: the most
      bytes of the step's own tensors alive at once.
  }];
}

def MemoryReport : Pass<"tdx-memory-report", "::mlir::ModuleOp"> {
  let summary = "Print each rank's bytes by kind, and refuse a step over its budget";
  let description = [{
    On a partitioned module, the bytes one rank holds for the entry
    function (its most loaded rank where shards are uneven; of a pipeline,
    the rank whose step peaks highest, as it holds its own stages):

    - `parameters`: the parameters and buffers it stores (their local
      shards; a tied name counts once);
    - `optimizer`: the optimizer state it stores (`optimizer.*`);
    - `inputs`: the entry's arguments (the batch);
    - `gradients`: for every parameter the step writes, its gradient as the
      update reads it (placed as the parameter's optimizer state is: a
      ZeRO shard, or the whole gradient);
    - `activations`: the rest of the step's working memory at its peak
      (saved activations and temporaries): the working memory less the
      gradients;
    - `peak`: parameters + optimizer + inputs + the working memory, the
      most bytes of the step's own tensors alive at once (`tdx.step_bytes`
      of `tdx-plan-memory` when the step is planned, else the same
      liveness on it as it is).

    It also reports the ops tdx-recompute runs again (`tdx.recomputed`)
    and the bytes they make, and the module's `tdx.memory_budget` (bytes
    per rank) if it has one. `format=json` prints one object with these
    keys (`recomputed`: `ops`, `bytes`, `seconds` (by the cost model's
    defaults) and `kinds`, the ops by name, a
    started collective by the collective's; `budget`; `largest`: the states
    and the tensors alive at the peak that hold the most bytes).
    `format=none` prints nothing and checks the budget: over it, the pass
    fails with an error that names the largest consumers and what to change
    (tdx-backend runs it so, before any code is emitted).

    ```
    tdx-opt step.mlir --tdx-spmd --tdx-backend=check-budget=0 --tdx-memory-report
    ```
  }];
  let options = [
    Option<"outputFile", "output", "std::string", /*default=*/"\"-\"",
           "Where to write the report ('-' is stdout)">,
    Option<"format", "format", "std::string", /*default=*/"\"table\"",
           "'table', 'json' or 'none'">
  ];
}

def SplitParts : Pass<"tdx-split-parts", "::mlir::ModuleOp"> {
  let summary = "Split the step into parts the emitters print as functions";
  let description = [{
    Numbers the ops of each function's body with `tdx.part`, starting a
    new part after every `ops-per-part` ops that run (not counting
    `tdx.wait` and `tdx.assign`). The emitters print each part as one C++
    function and the step calls them in order: the C++ compiler's
    optimizations are superlinear in a function's size.
  }];
  let options = [
    Option<"opsPerPart", "ops-per-part", "int64_t", /*default=*/"24",
           "Ops that run in one part of the step (> 0)">
  ];
}


#endif // TDX_BACKENDPASSES_TD
