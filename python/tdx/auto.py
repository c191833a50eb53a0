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
PIPELINE_AXES = ("pp", "pipe", "pipeline")
EXPERT_AXES = ("ep", "expert")
# The cost model's default seconds per byte a rank holds
# (tdx/Sharding/Layout.h's CostModel::secondsPerByteHeld).
SECONDS_PER_BYTE_HELD = 1e-10


def _linear_pairs(prog):
    """{"column": [weight names], "row": [...], "norm": [...], "in_out":
    [...]}: what tdx-linear-pairs finds in the program's forward ("in_out":
    the weights stored (in, out), Hugging Face's Conv1D)."""
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
    # A weight stored (in, out) (Hugging Face's Conv1D) splits the other dim.
    in_out = {module(n) for n in pairs.get("in_out", [])}
    kinds = {m: k + ("-in-out" if m in in_out else "") for m, k in kinds.items()}
    styles = {"column": lambda: ColwiseParallel(axis), "row": lambda: RowwiseParallel(axis),
              "column-in-out": lambda: ColwiseParallel(axis, in_out=True),
              "row-in-out": lambda: RowwiseParallel(axis, in_out=True),
              "norm": lambda: SequenceParallel(axis)}
    megatron = {p: styles[k]() for p, k in _patterns(prog, kinds).items()}
    norms = {module(n): "norm" for n in pairs["norm"]}
    if not norms:
        return [megatron]
    sequence = dict(megatron, **{p: styles[k]() for p, k in _patterns(prog, norms).items()})
    return [megatron, sequence]


def _expert_plans(prog, axis):
    """[{pattern: ExpertParallel(axis)}] for the model's experts modules
    (Hugging Face's grouped_mm experts, one decision for every layer's);
    [] when it has none."""
    from .expert_parallel import ExpertParallel, is_experts_module
    model = getattr(prog, "_model", None)
    if model is None:
        return []
    kinds = {name: "experts" for name, m in model.named_modules() if is_experts_module(m)}
    if not kinds:
        return []
    return [{p: ExpertParallel(axis) for p in _patterns(prog, kinds)}]


def _pipeline_candidates(prog, axis, ranks):
    """The pipelines to score on `ranks` ranks of `axis`: 1F1B and (two
    stages per rank) interleaved 1F1B, with the step's micro-batches when it
    was traced with some, else p, 2p or 4p of them where the batch splits
    so."""
    from .sharding import Pipeline
    k = getattr(prog, "accumulation_steps", 1)
    if k > 1:
        counts = [k]
    else:
        head = re.search(r"func\.func @train_step\(%\w+: tensor<(\d+)x", prog.mlir)
        batch = int(head.group(1)) if head else 1
        counts = [m for m in (ranks, 2 * ranks, 4 * ranks) if batch % m == 0] or [1]
    candidates = [Pipeline(axis, microbatches=m, schedule="1f1b") for m in counts]
    candidates += [Pipeline(axis, microbatches=m, schedule="interleaved-1f1b", stages_per_rank=2)
                   for m in counts if m % ranks == 0]
    return candidates


def _comm_seconds(report):
    """The seconds a step's collectives take by the cost model
    (comm_report's ``seconds``: alpha-beta plus the cost of each call)."""
    return sum(c["seconds"] for c in report)


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
      its collectives' seconds (alpha-beta plus 25 us per call,
      ``comm_report()``), the seconds of what it recomputes to fit a
      budget, and its peak bytes per rank (``memory_report()``) at the
      price propagation charges for memory. Under ``memory_budget`` (bytes
      per rank) only
      candidates whose peak fits count (the compiler recomputes to fit,
      tdx-recompute); if none fits, the one with the lowest peak is kept
      (tdx.compile then refuses it, naming what holds the memory).
    - An axis named ``pp`` (or ``pipe``, ``pipeline``) of a training step
      is a pipeline (``tdx.Pipeline``): its stages are split by cost
      (tdx-split-stages); the schedule (1F1B, or interleaved 1F1B with two
      stages per rank) and the micro-batches (the step's accumulation
      steps, else p, 2p or 4p where the batch splits so) are chosen by the
      end of the schedule timed by the cost model, plus its messages.
    - An axis named ``ep`` (or ``expert``) splits a Mixture of Experts'
      routed experts (Hugging Face's grouped_mm experts modules) over it,
      ``tdx.ExpertParallel``, the tokens dispatched by ragged all-to-alls;
      it is a data-parallel axis for the rest of the model. On a mesh with
      no data-parallel axis the other candidate is the experts replicated
      and the batch split over that axis (plain data parallelism), and the
      cost model chooses: expert parallelism when the weights it stops
      holding and reducing outweigh its all-to-alls.
    - The pipeline is chosen first, then the ZeRO stage with Megatron's
      plan (and expert parallelism), then sequence parallelism at that
      stage. The choice is
      deterministic: candidates are scored in a fixed order and a tie keeps
      the first. The result has ``"pipeline"`` when the mesh has a
      pipeline axis."""
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
    stages = [a for a in mesh.mesh_dim_names if a in PIPELINE_AXES]
    experts = [a for a in mesh.mesh_dim_names if a in EXPERT_AXES]
    for axis in mesh.mesh_dim_names:
        if axis not in DATA_AXES + TENSOR_AXES + PIPELINE_AXES + EXPERT_AXES:
            raise ValueError(f"auto_parallelize: mesh axis {axis!r} is neither data parallel "
                             f"{DATA_AXES}, tensor parallel {TENSOR_AXES}, a pipeline "
                             f"{PIPELINE_AXES} nor expert parallel {EXPERT_AXES}; name it as "
                             f"one")
    if len(data) > 1 or len(tensor) > 1 or len(stages) > 1 or len(experts) > 1:
        raise ValueError(f"auto_parallelize takes at most one data-parallel, one "
                         f"tensor-parallel, one pipeline and one expert-parallel axis, got "
                         f"{list(mesh.mesh_dim_names)}")
    if stages and prog._module.entry() != "train_step":
        raise ValueError(f"auto_parallelize: mesh axis {stages[0]!r} is a pipeline, which "
                         f"splits a training step; trace one with tdx.trace_train_step")
    dp = data[0] if data else None
    plans = [{}]
    if tensor:
        plans = _tensor_parallel_plans(prog, tensor[0])
        if not plans:
            raise ValueError(f"auto_parallelize found no pair of linear layers to split over "
                             f"{tensor[0]!r} (a linear feeding another); give tdx.parallelize "
                             f"a plan, or use a mesh without a tensor-parallel axis")
    training = prog._module.entry() == "train_step"
    # (plan, data-parallel axis) candidates before ZeRO and sequence
    # parallelism: with an expert axis, the experts split over it; without
    # a data axis beside it, also that axis as plain data parallelism.
    bases = [(plans[0], dp)]
    if experts:
        ep_plans = _expert_plans(prog, experts[0])
        if not ep_plans:
            raise ValueError(f"auto_parallelize: mesh axis {experts[0]!r} splits a Mixture of "
                             f"Experts' experts, and this model has no experts module tdx "
                             f"splits (Hugging Face's grouped_mm experts); use a mesh without "
                             f"it, or give tdx.parallelize a plan")
        if stages:
            raise ValueError("auto_parallelize: a pipeline with expert parallelism is not "
                             "built yet; use a mesh with one of the two axes")
        bases = [(dict(plans[0], **ep_plans[0]), dp)] + ([(plans[0], experts[0])] if dp is None
                                                          else [])
    best, failed = None, []

    def score(plan, zero, pipeline=None, data_parallel=dp):
        """Places a copy with `plan`, `zero`, `pipeline` and
        `data_parallel` and keeps it if it beats the best so far: (over the
        budget, its cost)."""
        nonlocal best
        # One copy, partitioned once, for both reports (the comm report
        # reads it; the memory report plans it as tdx.compile does).
        try:
            work = parallelize(prog.copy(), mesh, plan, data_parallel=data_parallel, zero=zero,
                               memory_budget=memory_budget, pipeline=pipeline).partition()
            comm = _json_report(work, "tdx-comm-report")
            schedule = _json_report(work, "tdx-pipeline-report")["end"] if pipeline else 0.0
            work.run_pipeline("tdx-backend{check-budget=0}")
            memory = _json_report(work, "tdx-memory-report")
        except (TdxError, ValueError) as e:  # a candidate the compiler cannot place
            failed.append(f"{plan}, zero={zero}, pipeline={pipeline}: {e}")
            return
        seconds = (_comm_seconds(comm) + memory["recomputed"]["seconds"] +
                   SECONDS_PER_BYTE_HELD * memory["peak"] + schedule)
        fits = memory_budget is None or memory["peak"] <= memory_budget
        key = (not fits, seconds if fits else memory["peak"])
        if best is None or key < best[0]:
            best = (key, plan, zero, pipeline, data_parallel)

    # The pipeline, then the ZeRO stage with the first plan, then the other
    # plans at that stage: the choices barely interact, and each candidate
    # costs a whole placement.
    pipeline = None
    if stages:
        for candidate in _pipeline_candidates(prog, stages[0],
                                              mesh.shape[mesh.axis(stages[0])]):
            score(plans[0], 0, candidate)
        pipeline = best[3] if best else None
    for plan, data_parallel in bases:
        zeros = (0, 1, 3) if data_parallel is not None and training else (0,)
        for zero in zeros:
            if not (stages and zero == 0):  # scored with the pipelines
                score(plan, zero, pipeline, data_parallel)
    # Sequence parallelism on the base chosen (its experts split or not).
    split = {p: s for p, s in (best[1] if best else {}).items() if p not in plans[0]}
    for plan in plans[1:]:
        score(dict(plan, **split), best[2] if best else 0, pipeline, best[4] if best else dp)
    if best is None:
        raise TdxError("auto_parallelize could place no candidate plan:\n  " +
                       "\n  ".join(failed))
    chosen = {"plan": best[1], "data_parallel": best[4], "zero": best[2]}
    if stages:
        chosen["pipeline"] = best[3]
    parallelize(prog, mesh, memory_budget=memory_budget, **chosen)
    return chosen
