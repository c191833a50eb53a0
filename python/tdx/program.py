"""tdx.Program: a captured model as an MLIR module in the tdx dialect."""

import math
import os

import torch

from . import _C
from .errors import CaptureError
from .precision import computing_in

__all__ = ["Program", "capture", "trace"]

# The IR's element types by MLIR spelling (include/tdx/StateFormat/DTypes.def).
_DTYPES = {ir: dtype for ir, dtype, *_ in _C.dtypes()}


class Program:
    """An MLIR module in the tdx dialect: parameters and buffers with their
    init programs and, when traced, ``func.func @forward``.

    ``str(prog)`` and ``prog.mlir`` give the text, which ``tdx-opt`` parses.
    """

    def __init__(self, mlir):
        # Parsed once; passes and placements edit the parsed module.
        self._module = _C.Module.parse(mlir)
        # A training step's hyperparameter inputs (the last inputs, in
        # order): name -> traced value (tdx.trace_train_step).
        self.hyperparameters = {}

    @property
    def mlir(self):
        return self._module.print()

    def __str__(self):
        return self.mlir

    def copy(self):
        """An independent copy of the program."""
        prog = Program.__new__(Program)
        # What the Python side knows of it (hyperparameters, accumulation
        # steps, the model and how to record it again, a pipeline) goes along.
        for key, value in vars(self).items():
            if key != "_module":
                setattr(prog, key, value)
        prog._module = self._module.clone()
        prog.hyperparameters = dict(getattr(self, "hyperparameters", {}))
        return prog

    def __repr__(self):
        return f"tdx.Program({len(self.parameters())} parameters and buffers)"

    @property
    def entries(self):
        """The program's functions: its main entry (``forward`` or
        ``train_step``) first, then those :meth:`add_entry` added."""
        return list(self._module.entries())

    def add_entry(self, name, fn, *example_inputs, _writes=False):
        """Traces ``fn(model, *example_inputs)`` under ``torch.no_grad()``
        into this program as the function `name`, on the model the program
        was traced from: it reads the same parameters and buffers (the state
        the main entry trains) and writes none. Evaluation, logits or
        generation then run on the current weights, on the same placements,
        with no copy: ``runner.evaluate(x, y)``.

        Add entries before :func:`tdx.parallelize`, which places them with
        the main entry: the main entry decides the state's placements, and
        the others read the state where it is (data parallelism splits their
        batch too)."""
        from .deferred import _python_guards, model_code_tracing
        model = getattr(self, "_model", None)
        if model is None:
            raise CaptureError(f"add_entry('{name}'): the program does not know its model; "
                               f"add entries to a program tdx.trace or tdx.trace_train_step "
                               f"made in this process")
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"add_entry: the entry's name must be a Python identifier (it "
                             f"becomes a method of the runner), got {name!r}")
        if not callable(fn):
            raise TypeError(f"add_entry('{name}'): fn must be callable as fn(model, *inputs)")
        entries, recording = _checked_entries(model, "add_entry")
        inputs = _fake_inputs(example_inputs, "example input", "add_entry")
        from . import torch_collectives
        log = _C.Trace()
        before = len(recording)
        with torch.no_grad(), _python_guards(fake_cuda=True), _C.TraceMode(log), \
                torch_collectives.record() as comms, model_code_tracing():
            out = fn(model, *inputs)
        if comms.mesh is not None:
            comms.finish()
            if comms.mesh_op() not in self.mlir:
                raise CaptureError(f"add_entry('{name}'): fn calls tdx.mpi over mesh "
                                   f"{comms.mesh}, which is not the mesh of the program's "
                                   f"main entry's communicators (an entry with user "
                                   f"communication joins a program whose main entry has it)")
        if len(recording) != before:
            raise CaptureError(f"add_entry('{name}'): fn changed the model's state (a batch "
                               f"norm in training mode updates its running statistics); an "
                               f"entry only reads it: call model.eval() in fn")
        outputs = _flatten(out, f"the outputs of {name}")
        # Writes are recorded (write_state) so that one is refused, not dropped.
        self._module.add_entry(recording.to_mlir(entries, log, inputs, outputs, function=name,
                                                 write_state=True,
                                                 non_persistent=_non_persistent(model)), name,
                               writes=_writes)
        return self

    def save(self, path):
        """Writes the MLIR text to ``path``."""
        with open(path, "w") as f:
            f.write(self.mlir)

    def check(self, target="cpu"):
        """Whether the program compiles, without compiling it: runs what
        ``tdx.compile`` runs up to the emitted source (``tdx-compile
        --check``: placing, partitioning, the backend passes, the emitter)
        in seconds, and raises :class:`tdx.TdxError` with the located
        errors where that fails. Returns the program."""
        from .compile import _check
        _check(self.mlir, target)
        return self

    @classmethod
    def load(cls, path):
        """Reads and verifies a program saved with ``save`` (or any tdx IR)."""
        if not os.path.exists(path):
            raise FileNotFoundError(f"no tdx program at {path!r}")
        with open(path) as f:
            return cls(f.read())

    def run_pipeline(self, pipeline):
        """Runs an MLIR pass pipeline on the program, in place, and returns it:
        ``prog.run_pipeline("tdx-propagate-sharding,tdx-partition")``. A
        pipeline that fails raises CaptureError and leaves the program as it
        was."""
        self._module.run_pipeline(pipeline)
        return self

    def annotate(self, name, mesh, placements):
        """Places a parameter or buffer (by qualified name) or the i-th forward
        input (``"input:<i>"``) on ``mesh`` with one placement per mesh axis:
        ``prog.annotate("fc.weight", mesh, [tdx.Replicate(), tdx.Shard(0)])``."""
        from .sharding import _annotate
        return _annotate(self, name, mesh, placements)

    def propagate(self, *, bandwidth=None, latency=None, flops=None, memory=None):
        """Runs tdx-propagate-sharding: every value gets a placement. The cost
        model takes bytes/s and seconds per mesh axis, device FLOP/s and the
        seconds charged per byte a rank holds of a result (``memory``,
        default 1e-10; 0 leaves memory out)."""
        from .sharding import _propagate
        return _propagate(self, bandwidth=bandwidth, latency=latency, flops=flops, memory=memory)

    def partition(self):
        """Inserts the collectives and rewrites the program per rank
        (propagating first if that has not run)."""
        from .sharding import _partition
        return _partition(self)

    def comm_report(self):
        """The collectives of one forward step: a list of dicts with ``kind``,
        ``mesh_axes``, ``bytes`` (per rank), ``dtype`` (the element type it
        moves: "f32", "bf16", ...), ``group_size``, ``seconds`` (by the cost
        model) and ``location``.
        The program itself is not changed."""
        from .sharding import _comm_report
        return _comm_report(self)

    def memory_report(self):
        """The bytes one rank holds for the step, known before it is compiled
        (its most loaded rank where shards are uneven; of a pipeline, the
        rank whose step peaks highest): a dict with
        ``parameters`` (parameters and buffers stored), ``optimizer``
        (optimizer state stored), ``inputs`` (the batch), ``gradients``
        (each trained parameter's gradient as the update reads it),
        ``activations`` (the rest of the step's working memory at its peak)
        and ``peak`` (parameters + optimizer + inputs + working memory, the
        most bytes of the step's own tensors alive at once as the compiled
        step's memory plan has them); ``working``; ``largest``: the states
        and tensors that hold the most, as ``{"name", "bytes"}``;
        ``recomputed``: what the compiler runs again to fit a
        ``memory_budget`` (``ops``, ``bytes``, ``seconds`` by the cost
        model, ``kinds``); and ``budget`` when there is one. The program
        itself is not changed; ``tdx-opt --tdx-memory-report`` prints the
        same. A generation program's report has ``kv_cache`` too: the bytes
        of the key/value cache one rank holds."""
        from .sharding import _memory_report
        report = _memory_report(self)
        if getattr(self, "generation", None) is not None:
            from .kv_cache import cache_bytes
            report["kv_cache"] = cache_bytes(self)
        return report

    def pipeline_report(self):
        """A pipelined program's stages and schedule as the compiler made
        them (``parallelize(..., pipeline=...)``; a partitioned copy): a
        dict with ``axis``, ``schedule``, ``ranks``, ``microbatches``,
        ``stages_per_rank``, ``stages`` (each stage's layer names, stage c
        on rank c % ranks), ``layer_seconds`` and ``stage_seconds`` (forward
        seconds by the cost model), ``timeline`` (the tasks as the cost
        model times them: ``rank``, ``phase`` "F", "B" or "W", ``stage``,
        ``microbatch``, ``start``, ``end``), ``end``, ``busy`` and
        ``bubble`` per rank (idle over busy time) and ``ideal_bubble``
        ((p-1)/(v m)). ``tdx-opt --tdx-pipeline-report`` prints the same;
        a program without a pipeline raises TdxError."""
        from .sharding import _pipeline_report
        return _pipeline_report(self)

    def parameters(self):
        """Qualified name -> (shape, dtype) of every parameter and buffer."""
        return {name: (tuple(shape), _DTYPES.get(dtype, dtype))
                for name, shape, dtype, _, _ in self._module.state()}

    @property
    def mesh(self):
        """The program's mesh as a :class:`tdx.DeviceMesh`, None without one."""
        from .sharding import init_device_mesh
        meshes = self._module.meshes()
        if not meshes:
            return None
        if len(meshes) > 1:
            raise CaptureError(f"the program declares {len(meshes)} meshes "
                               f"({', '.join(m[0] for m in meshes)}); a program runs on one")
        name, shape, axes, _ = meshes[0]
        mesh = init_device_mesh("cpu", shape, axes)
        mesh.name = name
        return mesh

    @property
    def world_size(self):
        """Processes that run the program: the devices of its mesh (1 without
        one), less its folded axes (``tdx.parallelize(..., fold=...)``)."""
        if self.mesh is None:  # (which also refuses a second mesh)
            return 1
        return math.prod(self._module.meshes()[0][3])

    @property
    def is_partitioned(self):
        """Whether the program is per-rank (tdx-partition has run)."""
        return self._module.is_partitioned()


def _named_state(module, kind, prefix=""):
    """Every (qualified name, tensor) of one kind, shared ones under each name."""
    for name, t in getattr(module, kind).items():
        if t is not None:
            yield prefix + name, t
    for name, child in module._modules.items():
        if child is not None:
            yield from _named_state(child, kind, prefix + name + ".")


def _state_entries(module):
    """(name, tensor, is_buffer, tied_to): parameters then buffers, in
    named_parameters order; a tensor seen before is tied to its first name."""
    entries, owner = [], {}
    for kind, is_buffer in (("_parameters", False), ("_buffers", True)):
        for name, t in _named_state(module, kind):
            entries.append((name, t, is_buffer, owner.get(id(t), "")))
            owner.setdefault(id(t), name)
    return entries


def _non_persistent(module):
    """The qualified names of the buffers registered with persistent=False
    (state of the program, not of ``module.state_dict()``)."""
    return [f"{prefix}{'.' if prefix else ''}{name}"
            for prefix, m in module.named_modules(remove_duplicate=False)
            for name in sorted(m._non_persistent_buffers_set) if name in m._buffers]


def _checked_entries(module, what):
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{what} takes an nn.Module, got {type(module).__name__}")
    entries = _state_entries(module)
    for name, t, _, tied in entries:
        if not tied and not _C.is_deferred(t):
            raise CaptureError(
                f"{name} is not deferred: {what} needs a module built with "
                f"tdx.deferred_init (and not yet materialized)")
    recording = _C.recording_of(entries[0][1]) if entries else None
    if recording is None:
        raise CaptureError(f"the module has no deferred parameters or buffers to {what}")
    return entries, recording


def capture(module):
    """The parameters and buffers of a deferred module, with their init
    programs, as a :class:`Program`. Random init ops become tdx's
    counter-based random ops with ``(seed, stream)``."""
    entries, recording = _checked_entries(module, "capture")
    return Program(recording.to_mlir(entries, non_persistent=_non_persistent(module)))


def _flatten(value, what):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flatten(v, what)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flatten(v, what)]
    hint = ""
    if type(value).__name__.endswith("Cache"):
        hint = (" (a Hugging Face model's key/value cache: trace it with use_cache=False, "
                "e.g. tdx.trace(model, ids, use_cache=False))")
    raise CaptureError(f"{what} must be tensors (or tuples, lists, dicts of them), "
                       f"got {type(value).__name__}{hint}")


def _fake_inputs(values, what, fn):
    """Fake tensors of the shapes and dtypes of `values` (tensors only)."""
    inputs = []
    for i, x in enumerate(values):
        if not isinstance(x, torch.Tensor):
            raise CaptureError(f"{what} #{i} is a {type(x).__name__}; {fn} takes tensors "
                               f"(constants belong in the module)")
        inputs.append(x if _C.is_fake(x) else _C.fake_like(x))
    return inputs


def _traced(module, fn, inputs, what, mixed_precision=None, function="forward",
            write_state=False):
    """(Program, log) of ``fn(module, *inputs)`` (fake inputs) recorded as
    ``func.func @<function>``; with `write_state` the state it writes in
    place is written back with ``tdx.assign`` (a generation step's cache)."""
    from .deferred import _python_guards, model_code_tracing
    entries, recording = _checked_entries(module, what)
    from . import collectives, torch_collectives
    log = _C.Trace()
    before = len(recording)
    with _python_guards(fake_cuda=True), _C.TraceMode(log), torch_collectives.record() as comms, \
            computing_in(module, mixed_precision), model_code_tracing():
        out = fn(module, *inputs)
    if len(recording) != before:
        raise CaptureError("the forward pass changed the module's deferred state")
    outputs = _flatten(out, "the forward's outputs")
    prog = Program(collectives.with_mesh(
        recording.to_mlir(entries, log, inputs, outputs, function=function,
                          write_state=write_state, non_persistent=_non_persistent(module)),
        comms))
    return prog, log


def trace(module, *example_inputs, _mixed_precision=None, **constants):
    """Like :func:`capture`, plus ``func.func @forward`` recorded from
    ``module(*example_inputs, **constants)`` on fake tensors (the inputs'
    values are never read; only shapes and dtypes matter). ``constants``
    are keyword arguments that are not tensors (``use_cache=False``,
    ``return_dict=False``), passed as they are and fixed in the program.
    Parameters are read by qualified name with ``tdx.param_ref``; shapes
    are global."""
    inputs = _fake_inputs(example_inputs, "example input", "trace")
    for name, value in constants.items():
        if isinstance(value, torch.Tensor):
            raise CaptureError(f"trace: keyword {name!r} is a tensor; tensors are example "
                               f"inputs, given by position (keywords are constants such as "
                               f"use_cache=False)")
    prog, log = _traced(module, lambda m, *xs: m(*xs, **constants), inputs, "trace",
                        _mixed_precision)
    prog.forward_op_names = log.op_names()
    prog._model = module
    prog._retrace = lambda policy: trace(module, *example_inputs, _mixed_precision=policy,
                                         **constants)
    return prog
