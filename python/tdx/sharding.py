"""Meshes, DTensor-style placements, parallel plans, and the sharding passes
from Python. Everything here edits or runs passes on a tdx.Program; the
compiler work is in the C++ passes (docs/sharding.md)."""

import fnmatch
import json
import os
import tempfile


from .errors import CaptureError
from .placements import DeviceMesh, Partial, Replicate, Shard, init_device_mesh
from .plans import ColwiseParallel, RowwiseParallel, SequenceParallel, VocabParallel, _Style
from .precision import MixedPrecision, retraced

__all__ = [
    "DeviceMesh", "init_device_mesh", "Shard", "Replicate", "Partial",
    "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "VocabParallel", "parallelize",
]


def _annotate(prog, name, mesh, placements, priority=-1, checked=False):
    """Places `name` (state, or "input:<i>") on `mesh`; a `priority` >= 0
    (inputs only) makes it a preference at that level, not fixed.
    `checked`: the caller refused a program of the user's communication
    already (parallelize, once: the check reads the whole program)."""
    from . import torch_plans
    if not checked:
        _refuse_manual(prog, f"placing {name}")
    placements = [torch_plans.placement(p) for p in placements]
    if len(placements) != mesh.ndim:
        raise ValueError(f"{len(placements)} placement(s) for a {mesh.ndim}-D mesh "
                         f"{mesh.mesh_dim_names}; give one per mesh axis")
    text = "[" + ", ".join(str(p) for p in placements) + "]"
    prog._module.annotate(name, mesh.name, list(mesh.shape), list(mesh.mesh_dim_names), text,
                          priority=priority)
    return prog


def _refuse_manual(prog, what):
    from . import collectives
    if collectives.is_manual(prog):
        raise CaptureError(f"{what}: this program's communication is the user's (tdx.mpi calls "
                           f"inside the trace): it runs per rank as written, with its state "
                           f"replicated, and tdx places nothing in it; compile it as it is "
                           f"(tdx.compile(prog))")


def _propagate(prog, *, bandwidth=None, latency=None, flops=None, memory=None):
    _refuse_manual(prog, "propagation")
    options = []
    if bandwidth is not None:
        options.append("bandwidth=" + ",".join(str(float(x)) for x in _as_list(bandwidth)))
    if latency is not None:
        options.append("latency=" + ",".join(str(float(x)) for x in _as_list(latency)))
    if flops is not None:
        options.append(f"flops={float(flops)}")
    if memory is not None:
        if not memory >= 0:
            raise ValueError(f"memory= is seconds per byte held and must be >= 0, got {memory}")
        options.append(f"memory={float(memory)}")
    suffix = "{" + " ".join(options) + "}" if options else ""
    # The registered pipeline tdx-compile runs too (passes/Pipelines.cpp).
    return prog.run_pipeline("tdx-place" + suffix)


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _partition(prog):
    if prog.is_partitioned:
        raise CaptureError("the program is already partitioned (its types are per-rank); "
                           "partition the global program once")
    from . import collectives
    if collectives.is_manual(prog):
        return prog.run_pipeline("tdx-manual-program")
    if not prog._module.is_placed():
        _propagate(prog)
    return prog.run_pipeline("tdx-spmd")


def _comm_report(prog):
    """[{kind, mesh_axes, bytes, dtype, group_size, seconds, location}] for one step;
    partitions a copy of the program first if needed."""
    work = prog.copy()
    if not work.is_partitioned:
        _partition(work)
    return _json_report(work, "tdx-comm-report")


def _pipeline_report(prog):
    """The scheduled pipeline (tdx-pipeline-report's JSON) of a partitioned
    copy of the program."""
    work = prog.copy()
    if not work.is_partitioned:
        _partition(work)
    return _json_report(work, "tdx-pipeline-report")


def _json_report(work, report):
    """What the report pass `report` prints with format=json, loaded."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        work.run_pipeline(f"{report}{{format=json output={path}}}")
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def _planned_copy(prog):
    """A copy of `prog` partitioned and planned as tdx.compile plans it
    (tdx-recompute fitting it to its budget), the budget's check left out:
    the reports are what show a program over it."""
    work = prog.copy()
    if not work.is_partitioned:
        _partition(work)
    return work.run_pipeline("tdx-backend{check-budget=0}")


def _memory_report(prog):
    """prog.memory_report(): tdx-memory-report on a planned copy."""
    return _json_report(_planned_copy(prog), "tdx-memory-report")


def _place_zero(prog, mesh, dp, zero, placed):
    """Splits optimizer state over mesh axis ``dp`` on top of the plan's
    placements. zero=1/2 keeps the parameters where the plan puts them
    (replicated over dp): the update runs on the split state and the new
    parameters are all-gathered. zero=3 stores each like its state (split
    over dp) and gathers it over dp where the step reads it."""
    state = prog._module.state()
    params = {name for name, _, _, is_buffer, tied in state if not is_buffer and not tied}

    def split_over_dp(shape, owner):
        """The owner's plan placements with dp splitting the first dim that
        divides evenly and the plan leaves whole; None when none does."""
        placements = list(placed.get(owner, [Replicate()] * mesh.ndim))
        split = {p.dim for p in placements if isinstance(p, Shard)}
        n = mesh.shape[dp]
        dim = next((d for d, size in enumerate(shape)
                    if d not in split and size >= n and size % n == 0), None)
        if dim is None:  # a scalar (Adam's step) or no dim that divides
            return None
        placements[dp] = Shard(dim)
        return placements

    for name, shape, _, is_buffer, tied in state:
        if tied:
            continue
        if name in params:
            use = placed.get(name, [Replicate()] * mesh.ndim)
            stored = split_over_dp(shape, name) if zero == 3 else None
            _annotate(prog, name, mesh, stored or use, checked=True)
            if stored:
                # Stored split like its optimizer state, gathered over dp
                # where the step reads it.
                prog._module.annotate_uses(name, mesh.name,
                                           "[" + ", ".join(str(p) for p in use) + "]", reads=True)
            continue
        if not name.startswith("optimizer."):
            continue
        owner = name[len("optimizer."):].rpartition(".")[0]
        if owner not in params:
            continue
        placements = split_over_dp(shape, owner)
        if placements is not None:
            _annotate(prog, name, mesh, placements, checked=True)


def _place_batch(prog, mesh, axis):
    """Data parallelism's inputs, as DDP splits them: the batch is dim 0 of
    the first input that has dims, and each input whose dim 0 has that size
    is split over `axis`, as a preference (priority 0, not fixed): where
    two inputs' splits disagree at an op (``x @ w`` with both (6, 6)) the
    cost model picks, and a user's own placement wins. 0-D inputs and
    inputs of another leading size (a temperature, a broadcast row, a
    weight given as an input) are left to propagation, which replicates
    them unless splitting is cheaper. Inputs the user placed are kept.

    A step with gradient accumulation takes its micro-batches stacked,
    (k, B, ...): dim 1 is split, so that each rank takes its part of every
    micro-batch, as DDP's ranks do in eager's accumulation loop."""
    entry = prog._module.entry()
    if prog._module.num_arguments(entry) < 0:
        raise CaptureError("data parallelism places the step's inputs; trace the model first "
                           "(tdx.trace or tdx.trace_train_step)")
    # Every entry's batch (prog.add_entry's too); only the main entry's
    # inputs are stacked micro-batches.
    for function in prog._module.entries():
        k = getattr(prog, "accumulation_steps", 1) if function == entry else 1
        dim = 1 if k > 1 else 0
        shapes = prog._module.argument_shapes(function)
        batch = next((shape[dim] for shape, _ in shapes if len(shape) > dim), None)
        for i, (shape, placed) in enumerate(shapes):
            if placed or len(shape) <= dim or shape[dim] != batch or (k > 1 and shape[0] != k):
                continue
            placements = [Replicate()] * mesh.ndim
            placements[axis] = Shard(dim)
            target = f"input:{i}" if function == entry else f"{function}:input:{i}"
            _annotate(prog, target, mesh, placements, priority=0, checked=True)


# --- Parallel plans ----------------------------------------------------------

class Pipeline:
    """Pipeline parallelism over mesh axis ``mesh_axis``: the training step's
    layers are cut into stages balanced by the cost model (``stages_per_rank``
    of them per rank of the axis, for the interleaved schedule), the batch
    into ``microbatches`` micro-batches along dim 0 (the step then equals
    the full-batch step), and each rank runs its stages' forward and
    backward on them in the order of ``schedule``: ``"gpipe"`` (every
    forward, then every backward), ``"1f1b"`` (one forward, one backward in
    turn after a warm-up: at most as many micro-batches in flight as
    stages), ``"interleaved-1f1b"`` (Megatron's, ``stages_per_rank`` >= 2:
    the bubble shrinks by that factor) or ``"zb-h1"`` (zero bubble's H1:
    1F1B with each backward split into its inputs' gradients (B) and its
    weights' (W), the W's postponed into the bubbles). Activations and their gradients go
    point to point between the stages; the loss reaches every rank."""

    SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")

    def __init__(self, mesh_axis="pp", microbatches=1, schedule="1f1b", stages_per_rank=1):
        if not isinstance(mesh_axis, str):
            raise TypeError(f"Pipeline's mesh_axis is a mesh axis name, got {mesh_axis!r}")
        if not (isinstance(microbatches, int) and microbatches >= 1):
            raise ValueError(f"microbatches must be a positive int, got {microbatches!r}")
        if schedule not in self.SCHEDULES:
            raise ValueError(f"schedule must be one of {list(self.SCHEDULES)}, got {schedule!r}")
        if not (isinstance(stages_per_rank, int) and stages_per_rank >= 1):
            raise ValueError(f"stages_per_rank must be a positive int, got {stages_per_rank!r}")
        if stages_per_rank > 1 and schedule != "interleaved-1f1b":
            raise ValueError(f"stages_per_rank={stages_per_rank} is for "
                             f"schedule='interleaved-1f1b'; {schedule!r} runs one stage per rank")
        self.mesh_axis = mesh_axis
        self.microbatches = microbatches
        self.schedule = schedule
        self.stages_per_rank = stages_per_rank

    def __repr__(self):
        return (f"Pipeline({self.mesh_axis!r}, microbatches={self.microbatches}, "
                f"schedule={self.schedule!r}, stages_per_rank={self.stages_per_rank})")


def _place_pipeline(prog, mesh, pipeline, data_parallel, fold):
    """Checks `pipeline` against the mesh and the program, and records the
    step with its micro-batches when it was traced without them."""
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"pipeline takes a tdx.Pipeline, got {type(pipeline).__name__}")
    if pipeline.mesh_axis not in mesh.mesh_dim_names:
        raise ValueError(f"the pipeline's axis {pipeline.mesh_axis!r} is not an axis of the mesh "
                         f"{list(mesh.mesh_dim_names)}")
    if pipeline.mesh_axis in (data_parallel,) + tuple(fold):
        raise ValueError(f"the pipeline's axis {pipeline.mesh_axis!r} cannot also be "
                         f"data_parallel or folded; give the stages an axis of their own")
    if prog._module.entry() != "train_step":
        raise ValueError("a pipeline splits a training step: trace it with "
                         "tdx.trace_train_step first")
    size = mesh.shape[mesh.axis(pipeline.mesh_axis)]
    if pipeline.schedule == "interleaved-1f1b" and pipeline.microbatches % size:
        raise ValueError(f"interleaved-1f1b runs micro-batches in rounds of the {size} pipeline "
                         f"ranks: microbatches={pipeline.microbatches} is not a multiple of "
                         f"{size}")
    k = getattr(prog, "accumulation_steps", 1)
    if k != pipeline.microbatches:
        if k != 1:
            raise ValueError(f"the step was traced with accumulation_steps={k}, but the "
                             f"pipeline asks for microbatches={pipeline.microbatches}; trace "
                             f"it with accumulation_steps={pipeline.microbatches} (or 1)")
        again = getattr(prog, "_retrace", None)
        module = prog._module
        if again is None or module.is_partitioned() or module.is_placed() or module.meshes():
            raise ValueError(f"the pipeline's {pipeline.microbatches} micro-batches need the "
                             f"step recorded with them: trace it with accumulation_steps="
                             f"{pipeline.microbatches}, or give pipeline= to the first "
                             f"parallelize of a freshly traced step")
        fresh = again(getattr(prog, "mixed_precision", None),
                      accumulation_steps=pipeline.microbatches)
        prog._module = fresh._module
        for key, value in vars(fresh).items():
            if key != "_module":
                setattr(prog, key, value)
    prog._module.set_pipeline(pipeline.mesh_axis, pipeline.microbatches, pipeline.schedule,
                              pipeline.stages_per_rank)
    prog.pipeline = pipeline


BATCH_NORM = ("global", "local")


class _HfStyles:
    """tdx's styles for Hugging Face's style names (hf_plans.translate)."""
    colwise = staticmethod(ColwiseParallel)
    rowwise = staticmethod(RowwiseParallel)
    vocab = staticmethod(VocabParallel)
    sequence = staticmethod(SequenceParallel)

    @staticmethod
    def experts(axis):
        from .expert_parallel import ExpertParallel
        return ExpertParallel(axis)

    @staticmethod
    def placed(axis, dims):
        from .torch_plans import _Placed
        return _Placed(axis, {name: Shard(dim) for name, dim in dims.items()})


def parallelize(prog, mesh, plan, *, data_parallel=None, zero=0, fold=(), mixed_precision=None,
                memory_budget=None, pipeline=None, batch_norm="global"):
    """Places a traced program by a plan: ``plan`` maps module name patterns
    (fnmatch, ``"layers.*.attn.wq"``) to ColwiseParallel(), RowwiseParallel(),
    SequenceParallel() or VocabParallel() over their mesh axis (default
    ``"tp"``), to ExpertParallel() or ContextParallel(), or to Hugging
    Face's style names (a config's ``base_model_tp_plan`` or
    ``base_model_ep_plan`` as it is: see ``tdx/hf_plans.py``), tdx's or
    ``torch.distributed.tensor.parallel``'s (a
    torchtitan-style plan works unchanged: torch's styles apply over the
    mesh axis named ``"tp"``, or a 1-D mesh's one axis; RowwiseParallel on an
    Embedding is VocabParallel, ColwiseParallel on one splits its embedding
    dim; PrepareModuleInput/Output and the styles' input and output layouts
    are not needed, since propagation places every activation). ``mesh`` is
    a tdx.DeviceMesh or torch's own DeviceMesh (its root mesh); ``data_parallel`` names the mesh axis that splits the
    inputs' batch dim, as DDP does: every input whose dim 0 is the batch
    (dim 0 of the first input with dims) is split there as a preference
    that the user's own placements override; 0-D inputs and inputs of
    another leading size are replicated unless the cost model finds a
    split cheaper. Every other mesh axis replicates.

    ``zero`` (a training step's program, with ``data_parallel``) is ZeRO as
    placements over the data-parallel axis: 0 leaves optimizer state where
    propagation puts it (replicated over dp, as DDP); 1 and 2 split every
    optimizer state tensor over dp (its first dim that divides evenly and
    the plan does not split), so gradients are reduce-scattered into the
    update and parameters all-gathered after it (2 is 1: gradients are
    values, never stored); 3 also stores the parameters split over dp, which
    are all-gathered once per step where the step reads them.

    ``fold`` names mesh axes that run inside each process instead of on
    ranks of their own: every rank computes each shard of a folded axis in
    turn, as the op the whole mesh's rank would run, and adds what the axis
    would all-reduce in a fixed order. The program then runs on the ranks of
    the other axes, and every folding of one mesh and plan gives bitwise the
    same results (losses, parameters, dropout), where the unfolded axes have
    at most 2 ranks and every run uses the same ``threads``: a 2x2 mesh run
    on 1, 2 (either axis) or 4 processes.

    ``mixed_precision`` (a :class:`tdx.MixedPrecision`) is FSDP2's policy:
    the step is recorded again with every floating-point parameter read as
    ``p.to(param_dtype)`` (so the forward and backward compute in
    ``param_dtype``, and the gradient reaches the float32 parameter cast
    back by the cast's backward), parameters and optimizer state stay
    float32 as placed, and every collective inserted that sums (gradient
    reductions, tensor and sequence parallelism's) sums in ``reduce_dtype``.
    Under ZeRO-3 the cast comes before the all-gather, which moves
    ``param_dtype`` bytes. Give it on the first ``parallelize`` of a freshly
    traced program.

    ``memory_budget`` (bytes per rank) is checked when the program is
    compiled: a step whose peak (``prog.memory_report()["peak"]``) exceeds
    it is refused with its largest consumers named, before any C++ is
    compiled.

    ``pipeline`` (a :class:`tdx.Pipeline`) runs the training step as a
    pipeline over its mesh axis, which the plan, ``data_parallel`` and
    ``zero`` leave alone: they place each stage over the other axes. A step
    traced without micro-batches is recorded again with the pipeline's
    (``accumulation_steps``).

    ``batch_norm`` says whose statistics batch norm in training mode takes
    when ``data_parallel`` splits the batch: ``"global"`` (the default) the
    whole batch's, as eager on one process and SyncBatchNorm (each rank's
    per-channel mean and sum of squares are gathered and merged exactly, and
    the backward's two per-channel sums all-reduced; the batch is never
    gathered); ``"local"`` each rank's own shard's, as DDP without
    SyncBatchNorm (no communication for them; the running statistics follow
    rank 0's, as DDP's broadcast buffers do). Returns the program."""
    _refuse_manual(prog, "tdx.parallelize")
    from . import hf_plans, torch_plans
    mesh = torch_plans.mesh(mesh)
    if any(isinstance(style, str) for style in plan.values()):
        plan = hf_plans.translate(getattr(prog, "_model", None), mesh, plan, _HfStyles)
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {zero!r}")
    if batch_norm not in BATCH_NORM:
        import difflib
        close = difflib.get_close_matches(str(batch_norm), BATCH_NORM, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"batch_norm is 'global' (the whole batch's statistics, the default) "
                         f"or 'local' (each data-parallel rank's own, as DDP without "
                         f"SyncBatchNorm), got {batch_norm!r}{hint}")
    if batch_norm == "local" and data_parallel is None:
        raise ValueError("batch_norm='local' takes each data-parallel rank's own statistics: "
                         "give data_parallel=<mesh axis> too")
    if memory_budget is not None and not (isinstance(memory_budget, int) and memory_budget > 0):
        raise ValueError(f"memory_budget is a positive number of bytes per rank, got "
                         f"{memory_budget!r}")
    if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
        raise TypeError(f"mixed_precision takes a tdx.MixedPrecision, got "
                        f"{type(mixed_precision).__name__}")
    fold = (fold,) if isinstance(fold, str) else tuple(fold)
    for axis in fold:
        if axis not in mesh.mesh_dim_names:
            raise ValueError(f"fold names mesh axis {axis!r}, but the mesh's axes are "
                             f"{list(mesh.mesh_dim_names)}")
    if len(set(fold)) != len(fold):
        raise ValueError(f"fold names an axis twice: {list(fold)}")
    if zero and data_parallel is None:
        raise ValueError("zero shards over the data-parallel axis: give data_parallel=<mesh axis>")
    if zero and prog._module.entry() != "train_step":
        raise ValueError("zero places optimizer state: trace the training step with "
                         "tdx.trace_train_step first")
    if mixed_precision is not None:
        retraced(prog, mixed_precision)
    from .context_parallel import ContextParallel, apply as _context_parallel
    context = {p: s for p, s in plan.items() if isinstance(s, ContextParallel)}
    if context:
        if pipeline is not None:
            raise ValueError("ContextParallel with a pipeline is not built yet; split the "
                             "sequence or pipeline the layers, not both")
        _context_parallel(prog, mesh, context, data_parallel)
        plan = {p: s for p, s in plan.items() if p not in context}
    from .expert_parallel import ExpertParallel, apply as _expert_parallel
    experts = {p: s for p, s in plan.items() if isinstance(s, ExpertParallel)}
    if experts:
        if pipeline is not None or context:
            raise ValueError("ExpertParallel with a pipeline or ContextParallel is not built "
                             "yet")
        expert_weights = _expert_parallel(prog, mesh, experts, data_parallel)
        plan = {p: s for p, s in plan.items() if p not in experts}
    else:
        expert_weights = {}
    if pipeline is not None:
        _place_pipeline(prog, mesh, pipeline, data_parallel, fold)
    params = prog.parameters()
    # The routed experts' weights are placed like a plan's (ZeRO splits
    # their optimizer state on another dim).
    placed = dict(expert_weights)
    for name, placements in expert_weights.items():
        _annotate(prog, name, mesh, placements, checked=True)
    used = set()
    sequence_parallel = []
    model = getattr(prog, "_model", None)
    for pattern, style in plan.items():
        if torch_plans.is_torch_style(style):
            # PrepareModuleInput/Output: activations are placed by propagation.
            if torch_plans.style(style, None, mesh) is None:
                used.add(pattern)
        elif not isinstance(style, _Style):
            raise TypeError(f"plan[{pattern!r}] is {style!r}; use ColwiseParallel(), "
                            f"RowwiseParallel(), SequenceParallel() or VocabParallel() (tdx's or "
                            f"torch.distributed.tensor.parallel's)")
    for name in params:
        module, _, leaf = name.rpartition(".")
        for pattern, style in plan.items():
            if not fnmatch.fnmatchcase(module, pattern):
                continue
            if torch_plans.is_torch_style(style):
                owner = None
                if model is not None:
                    try:
                        owner = model.get_submodule(module)
                    except AttributeError:
                        pass
                style = torch_plans.style(style, owner, mesh)
                if style is None:
                    continue
            if leaf not in style.placements:
                continue
            axis = mesh.axis(style.mesh_axis)
            placements = [Replicate()] * mesh.ndim
            if isinstance(style, SequenceParallel):
                sequence_parallel.append((name, axis, style.seq_dim))
            else:
                placements[axis] = style.placements[leaf]
                _annotate(prog, name, mesh, placements, checked=True)
                placed[name] = placements
            used.add(pattern)
            break
    unused = [p for p in plan if p not in used]
    if unused:
        raise ValueError(f"plan patterns {unused} match no module with parameters; module "
                         f"names are like {sorted({n.rpartition('.')[0] for n in params})[:5]}")
    # The program runs on the mesh even where nothing is split (a step whose
    # only input is its parameters, replicated on every rank).
    prog._module.declare_mesh(mesh.name, list(mesh.shape), list(mesh.mesh_dim_names))
    dp_axis = mesh.axis(data_parallel) if data_parallel is not None else None
    for name, axis, seq_dim in sequence_parallel:
        placements = [Replicate()] * mesh.ndim
        placements[axis] = Shard(seq_dim)
        if dp_axis is not None:
            placements[dp_axis] = Shard(0)
        prog._module.declare_mesh(mesh.name, list(mesh.shape), list(mesh.mesh_dim_names))
        prog._module.annotate_uses(name, mesh.name,
                                   "[" + ", ".join(str(p) for p in placements) + "]")
    if getattr(prog, "generation", None) is not None:
        # A generation program's key/value cache: batch over dp, heads over tp.
        from .kv_cache import cache_placements
        prog._cache_placements = (mesh, cache_placements(prog, mesh, placed, data_parallel))
        for name, placements in prog._cache_placements[1].items():
            _annotate(prog, name, mesh, placements, checked=True)
    if zero:
        _place_zero(prog, mesh, mesh.axis(data_parallel), zero, placed)
    if data_parallel is not None:
        _place_batch(prog, mesh, mesh.axis(data_parallel))
        prog._module.set_batch_norm(data_parallel, batch_norm)
    if memory_budget is not None:
        prog._module.set_memory_budget(memory_budget)
    if fold:
        prog._module.declare_mesh(mesh.name, list(mesh.shape), list(mesh.mesh_dim_names))
        prog._module.set_mesh_ranks(mesh.name, [1 if a in fold else s for a, s in
                                                zip(mesh.mesh_dim_names, mesh.shape)])
    return prog
