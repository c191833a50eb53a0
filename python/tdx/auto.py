"""tdx.auto_parallelize: a plan chosen by the cost model, returned in the
form tdx.parallelize takes."""

import fnmatch
import json
import os
import re
import tempfile

# Mesh axis names auto_parallelize reads as data and tensor parallel.
DATA_AXES = ("dp", "data", "ddp", "fsdp")
TENSOR_AXES = ("tp", "model", "mp", "tensor")
# The cost model's defaults (tdx/Sharding/Layout.h): bytes/s and seconds per
# step of a collective on a mesh axis, and seconds per byte a rank holds.
BANDWIDTH, LATENCY, SECONDS_PER_BYTE_HELD = 1e10, 1e-5, 1e-10


def _linear_pairs(prog):
    """{"column": [weight names], "row": [...], "norm": [...]}: what
    tdx-linear-pairs finds in the program's forward."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pairs.json")
        prog.run_pipeline(f"tdx-linear-pairs{{output={path}}}")  # reads, changes nothing
        with open(path) as f:
            return json.load(f)


def _patterns(prog, kinds):
    """{module: kind} as fnmatch patterns: a module's layer numbers made
    `*` where every module the pattern matches has the same kind (one
    decision for repeated layers), else the module's own name."""
    modules = sorted({n.rpartition(".")[0] for n in prog.parameters()})
    patterns = {}
    for module, kind in sorted(kinds.items()):
        pattern = re.sub(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)", "*", module)
        matched = [m for m in modules if fnmatch.fnmatchcase(m, pattern)]
        if not all(kinds.get(m) == kind for m in matched):
            pattern = module
        patterns.setdefault(pattern, kind)
    return patterns


def _tensor_parallel_plans(prog, axis):
    """Megatron's plan over mesh axis `axis` from the pairs tdx-linear-pairs
    finds, and (when it finds the norms before the column-parallel layers)
    the same with sequence parallelism on those norms; [] when nothing
    pairs."""
    from .sharding import ColwiseParallel, RowwiseParallel, SequenceParallel
    pairs = _linear_pairs(prog)
    module = lambda name: name.rpartition(".")[0]
    kinds = {module(n): "column" for n in pairs["column"]}
    kinds.update({module(n): "row" for n in pairs["row"]})
    if not kinds:
        return []
    styles = {"column": lambda: ColwiseParallel(axis), "row": lambda: RowwiseParallel(axis),
              "norm": lambda: SequenceParallel(axis)}
    megatron = {p: styles[k]() for p, k in _patterns(prog, kinds).items()}
    norms = {module(n): "norm" for n in pairs["norm"]}
    if not norms:
        return [megatron]
    sequence = dict(megatron, **{p: styles[k]() for p, k in _patterns(prog, norms).items()})
    return [megatron, sequence]


def _comm_seconds(report):
    """The seconds a step's collectives take under the alpha-beta model
    (comm_report's bytes: what a rank passes in)."""
    seconds = 0.0
    for c in report:
        g, n = c["group_size"], max(c["bytes"], 0)
        if g <= 1:
            continue
        if c["kind"] == "all_reduce":
            seconds += 2 * (g - 1) * LATENCY + 2 * (g - 1) / g * n / BANDWIDTH
        elif c["kind"] == "all_gather":
            seconds += (g - 1) * LATENCY + (g - 1) * n / BANDWIDTH
        else:  # reduce_scatter, all_to_all, broadcast
            seconds += (g - 1) * LATENCY + (g - 1) / g * n / BANDWIDTH
    return seconds


def auto_parallelize(prog, mesh, memory_budget=None):
    """Places ``prog`` on ``mesh`` as ``tdx.parallelize`` does, with no plan
    given, and returns the plan it chose in the form ``parallelize`` takes
    (``tdx.parallelize(other, mesh, **chosen)`` places another program the
    same way; print it to see it):
    ``{"plan": {...}, "data_parallel": axis or None, "zero": k}``.

    - A mesh axis named ``dp`` (or ``data``, ``ddp``, ``fsdp``) is data
      parallel: the batch is split over it, and for a training step the
      ZeRO stage (0, 1 or 3) is chosen.
    - An axis named ``tp`` (or ``model``, ``mp``, ``tensor``) is tensor
      parallel: the linear layers the forward pairs (tdx-linear-pairs:
      attention's q, k, v and output projections, an MLP's up, gate and
      down projections) are split Megatron's way, column then row, with or
      without sequence parallelism on the norms before the column-parallel
      layers (both are candidates); the layers of one name in every block
      share one decision (``"h.*.c_attn"``).
    - Every candidate is placed on a copy and scored by the cost model:
      its collectives' seconds (alpha-beta, ``comm_report()``), the
      seconds of what it recomputes to fit a budget, and its peak bytes
      per rank (``memory_report()``) at the price propagation charges for
      memory. Under ``memory_budget`` (bytes per rank) only
      candidates whose peak fits count (the compiler recomputes to fit,
      tdx-recompute); if none fits, the one with the lowest peak is kept
      (tdx.compile then refuses it, naming what holds the memory).
    - The ZeRO stage is chosen with Megatron's plan, then sequence
      parallelism at that stage. The choice is deterministic: candidates
      are scored in a fixed order and a tie keeps the first.

    A ``pp`` axis (pipeline parallelism) is not handled yet."""
    from .program import Program
    from .errors import TdxError
    from .sharding import DeviceMesh, _json_report, parallelize
    if not isinstance(prog, Program):
        raise TypeError(f"auto_parallelize places a tdx.Program, got {type(prog).__name__}")
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"auto_parallelize takes a tdx.DeviceMesh, got {type(mesh).__name__}")
    if prog.is_partitioned or prog._module.is_placed() or prog._module.meshes():
        raise ValueError("auto_parallelize places a program that is not placed yet: trace it "
                         "again (tdx.trace / tdx.trace_train_step)")
    if memory_budget is not None and not (isinstance(memory_budget, int) and memory_budget > 0):
        raise ValueError(f"memory_budget is a positive number of bytes per rank, got "
                         f"{memory_budget!r}")
    data = [a for a in mesh.mesh_dim_names if a in DATA_AXES]
    tensor = [a for a in mesh.mesh_dim_names if a in TENSOR_AXES]
    for axis in mesh.mesh_dim_names:
        if axis == "pp":
            raise ValueError("auto_parallelize: mesh axis 'pp' asks for pipeline parallelism, "
                             "which tdx does not build yet; use data- and tensor-parallel axes")
        if axis not in DATA_AXES + TENSOR_AXES:
            raise ValueError(f"auto_parallelize: mesh axis {axis!r} is neither data parallel "
                             f"{DATA_AXES} nor tensor parallel {TENSOR_AXES}; name it as one")
    if len(data) > 1 or len(tensor) > 1:
        raise ValueError(f"auto_parallelize takes at most one data-parallel and one "
                         f"tensor-parallel axis, got {list(mesh.mesh_dim_names)}")
    dp = data[0] if data else None
    plans = [{}]
    if tensor:
        plans = _tensor_parallel_plans(prog, tensor[0])
        if not plans:
            raise ValueError(f"auto_parallelize found no pair of linear layers to split over "
                             f"{tensor[0]!r} (a linear feeding another); give tdx.parallelize "
                             f"a plan, or use a mesh without a tensor-parallel axis")
    training = prog._module.entry() == "train_step"
    zeros = (0, 1, 3) if dp is not None and training else (0,)
    best, failed = None, []

    def score(plan, zero):
        """Places a copy with `plan` and `zero` and keeps it if it beats the
        best so far: (over the budget, its cost)."""
        nonlocal best
        # One copy, partitioned once, for both reports (the comm report
        # reads it; the memory report plans it as tdx.compile does).
        try:
            work = parallelize(prog.copy(), mesh, plan, data_parallel=dp, zero=zero,
                               memory_budget=memory_budget).partition()
            comm = _json_report(work, "tdx-comm-report")
            work.run_pipeline("tdx-backend{check-budget=0}")
            memory = _json_report(work, "tdx-memory-report")
        except TdxError as e:  # a candidate the compiler cannot place
            failed.append(f"{plan}, zero={zero}: {e}")
            return
        seconds = (_comm_seconds(comm) + memory["recomputed"]["seconds"] +
                   SECONDS_PER_BYTE_HELD * memory["peak"])
        fits = memory_budget is None or memory["peak"] <= memory_budget
        key = (not fits, seconds if fits else memory["peak"])
        if best is None or key < best[0]:
            best = (key, plan, zero)

    # The ZeRO stage with the first plan, then the other plans at that
    # stage: the two choices barely interact, and each candidate costs a
    # whole placement.
    for zero in zeros:
        score(plans[0], zero)
    for plan in plans[1:]:
        score(plan, best[2] if best else 0)
    if best is None:
        raise TdxError("auto_parallelize could place no candidate plan:\n  " +
                       "\n  ".join(failed))
    chosen = {"plan": best[1], "data_parallel": dp, "zero": best[2]}
    parallelize(prog, mesh, memory_budget=memory_budget, **chosen)
    return chosen
