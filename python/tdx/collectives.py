"""Collectives the user writes, as torch ops a trace records.

``torch.ops.tdx.all_reduce``, ``all_gather``, ``reduce_scatter``,
``all_to_all``, ``broadcast``, ``permute`` and ``rank`` are torch operators
with fake kernels and autograd formulas (the adjoint table below), so
``tdx.trace`` and ``tdx.trace_train_step`` record them, and their
derivatives, like any op. ``tdx-manual-program`` (passes/ManualProgram.cpp)
then turns each into the dialect's collective over the communicator's mesh
axes. Inside a trace, :mod:`tdx.mpi`'s calls record these ops; outside one
they run eagerly on MPI (``tdx.mpi``'s own code).

====================  =====================================================
op                    adjoint
====================  =====================================================
all_reduce sum / avg  all_reduce sum / avg of the gradient
all_reduce max / min  the summed gradient to the ranks holding the extreme,
                      split evenly among ties
all_gather            reduce_scatter sum
reduce_scatter sum    all_gather (avg: divided by the group's size)
all_to_all            all_to_all with split and concat swapped
ragged_all_to_all     ragged_all_to_all with the input's and output's
                      offsets and sizes swapped
broadcast (root)      all_reduce sum, kept on the root (zeros elsewhere)
permute (pairs)       permute by the reversed pairs
====================  =====================================================

Every op takes ``axes`` (the communicator's mesh axes, comma-joined),
``group`` (its size, for the fake kernels' shapes) and ``site`` (the
user's ``file:line``, which becomes the collective's location, so
compile-time errors name it).
"""

import inspect
import os

import torch

from .errors import CaptureError

_LIB = torch.library.Library("tdx", "FRAGMENT")  # deferred.py defines tdx::trunc_normal_
_COMMON = "str axes, int group, str site"
_LIB.define(f"all_reduce(Tensor x, str reduce, {_COMMON}) -> Tensor")
_LIB.define(f"all_gather(Tensor x, int dim, {_COMMON}) -> Tensor")
_LIB.define(f"reduce_scatter(Tensor x, str reduce, int dim, {_COMMON}) -> Tensor")
_LIB.define(f"all_to_all(Tensor x, int split_dim, int concat_dim, {_COMMON}) -> Tensor")
_LIB.define(f"ragged_all_to_all(Tensor x, Tensor input_offsets, Tensor send_sizes, "
            f"Tensor output_offsets, Tensor recv_sizes, int rows, {_COMMON}) -> Tensor")
_LIB.define(f"broadcast(Tensor x, int root, {_COMMON}) -> Tensor")
_LIB.define(f"permute(Tensor x, int[] pairs, {_COMMON}) -> Tensor")
_LIB.define(f"rank(Tensor like, {_COMMON}) -> Tensor")

_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ragged_all_to_all", "broadcast",
        "permute", "rank")


def _eager(name):
    def run(*args):
        raise CaptureError(f"torch.ops.tdx.{name} runs inside a program tdx traces and compiles "
                           f"(tdx.trace / tdx.trace_train_step); in an eager SPMD job call "
                           f"tdx.mpi's collectives")
    return run


for _name in _OPS:
    _LIB.impl(_name, _eager(_name), "CompositeExplicitAutograd")


def _dim(x, dim, what):
    if not -x.dim() <= dim < max(x.dim(), 1):
        raise CaptureError(f"{what}: dim {dim} is outside a {x.dim()}-D tensor")
    return dim % max(x.dim(), 1)


def _split(n, group, what, site):
    if n % group:
        raise CaptureError(f"{what} at {site}: {n} entries do not split evenly over {group} "
                           f"ranks; a compiled program's ranks hold equal shares (pad the "
                           f"tensor, or run the uneven call eagerly with tdx.mpi)")
    return n // group


@torch.library.register_fake("tdx::all_reduce")
def _(x, reduce, axes, group, site):
    return torch.empty_like(x)


@torch.library.register_fake("tdx::all_gather")
def _(x, dim, axes, group, site):
    shape = list(x.shape)
    shape[_dim(x, dim, "all_gather")] *= group
    return x.new_empty(shape)


@torch.library.register_fake("tdx::reduce_scatter")
def _(x, reduce, dim, axes, group, site):
    shape = list(x.shape)
    d = _dim(x, dim, "reduce_scatter")
    shape[d] = _split(shape[d], group, "reduce_scatter", site)
    return x.new_empty(shape)


@torch.library.register_fake("tdx::all_to_all")
def _(x, split_dim, concat_dim, axes, group, site):
    shape = list(x.shape)
    s, c = _dim(x, split_dim, "all_to_all"), _dim(x, concat_dim, "all_to_all")
    shape[s] = _split(shape[s], group, "all_to_all", site)
    shape[c] *= group
    return x.new_empty(shape)


@torch.library.register_fake("tdx::ragged_all_to_all")
def _(x, input_offsets, send_sizes, output_offsets, recv_sizes, rows, axes, group, site):
    for name, t in (("input_offsets", input_offsets), ("send_sizes", send_sizes),
                    ("output_offsets", output_offsets), ("recv_sizes", recv_sizes)):
        if t.dtype != torch.int64 or tuple(t.shape) != (group,):
            raise CaptureError(f"ragged_all_to_all at {site}: {name} is {t.dtype} "
                               f"{tuple(t.shape)}; give an int64 tensor of {group} entries, one "
                               f"per rank of the group")
    if x.dim() < 1 or rows < 0:
        raise CaptureError(f"ragged_all_to_all at {site}: it moves rows (dim 0) of a tensor into "
                           f"{rows} rows; give a tensor of at least 1 dim and rows >= 0")
    return x.new_empty((rows, *x.shape[1:]))


@torch.library.register_fake("tdx::broadcast")
def _(x, root, axes, group, site):
    return torch.empty_like(x)


@torch.library.register_fake("tdx::permute")
def _(x, pairs, axes, group, site):
    return torch.empty_like(x)


@torch.library.register_fake("tdx::rank")
def _(like, axes, group, site):
    return like.new_empty((), dtype=torch.int64)


# -- the adjoints ---------------------------------------------------------

def _ops():
    return torch.ops.tdx


def _save_all_reduce(ctx, inputs, output):
    x, reduce, axes, group, site = inputs
    ctx.args = (reduce, axes, group, site)
    if reduce in ("max", "min"):
        ctx.save_for_backward(x, output)


def _all_reduce_backward(ctx, g):
    reduce, axes, group, site = ctx.args
    back = site + " (backward)"
    if reduce in ("sum", "avg"):
        return _ops().all_reduce(g, reduce, axes, group, back), None, None, None, None
    x, y = ctx.saved_tensors
    summed = _ops().all_reduce(g, "sum", axes, group, back)
    hit = (x == y).to(g.dtype)
    ties = _ops().all_reduce(hit, "sum", axes, group, back)
    return summed * hit / ties, None, None, None, None


def _save_args(ctx, inputs, output):
    ctx.args = inputs[1:]


def _all_gather_backward(ctx, g):
    dim, axes, group, site = ctx.args
    return _ops().reduce_scatter(g, "sum", dim, axes, group, site + " (backward)"), \
        None, None, None, None


def _reduce_scatter_backward(ctx, g):
    reduce, dim, axes, group, site = ctx.args
    if reduce not in ("sum", "avg"):
        raise CaptureError(f"reduce_scatter at {site}: a {reduce} reduce-scatter has no "
                           f"gradient in tdx; reduce with sum or avg")
    out = _ops().all_gather(g, dim, axes, group, site + " (backward)")
    return (out / group if reduce == "avg" else out), None, None, None, None, None


def _all_to_all_backward(ctx, g):
    split_dim, concat_dim, axes, group, site = ctx.args
    return _ops().all_to_all(g, concat_dim, split_dim, axes, group, site + " (backward)"), \
        None, None, None, None, None


def _save_ragged(ctx, inputs, output):
    x, input_offsets, send_sizes, output_offsets, recv_sizes, rows, axes, group, site = inputs
    ctx.save_for_backward(input_offsets, send_sizes, output_offsets, recv_sizes)
    ctx.args = (x.shape[0], axes, group, site)


def _ragged_all_to_all_backward(ctx, g):
    input_offsets, send_sizes, output_offsets, recv_sizes = ctx.saved_tensors
    rows, axes, group, site = ctx.args
    back = _ops().ragged_all_to_all(g, output_offsets, recv_sizes, input_offsets, send_sizes,
                                    rows, axes, group, site + " (backward)")
    return (back,) + (None,) * 8


def _broadcast_backward(ctx, g):
    root, axes, group, site = ctx.args
    back = site + " (backward)"
    summed = _ops().all_reduce(g, "sum", axes, group, back)
    mine = _ops().rank(g, axes, group, back) == root
    return torch.where(mine, summed, torch.zeros_like(summed)), None, None, None, None


def _permute_backward(ctx, g):
    pairs, axes, group, site = ctx.args
    back = [p for i in range(0, len(pairs), 2) for p in (pairs[i + 1], pairs[i])]
    return _ops().permute(g, back, axes, group, site + " (backward)"), None, None, None, None


torch.library.register_autograd("tdx::all_reduce", _all_reduce_backward,
                                setup_context=_save_all_reduce)
torch.library.register_autograd("tdx::all_gather", _all_gather_backward,
                                setup_context=_save_args)
torch.library.register_autograd("tdx::reduce_scatter", _reduce_scatter_backward,
                                setup_context=_save_args)
torch.library.register_autograd("tdx::all_to_all", _all_to_all_backward,
                                setup_context=_save_args)
torch.library.register_autograd("tdx::ragged_all_to_all", _ragged_all_to_all_backward,
                                setup_context=_save_ragged)
torch.library.register_autograd("tdx::broadcast", _broadcast_backward,
                                setup_context=_save_args)
torch.library.register_autograd("tdx::permute", _permute_backward, setup_context=_save_args)


# -- recording --------------------------------------------------------------

class Recording:
    """What one trace's user collectives need: the mesh their communicators
    share and the messages posted but not yet matched."""

    def __init__(self):
        self.mesh = None          # (name, shape, axes)
        self.mesh_site = None
        self.sends = []           # posted Isends not yet received
        self.recvs = []

    def use(self, name, shape, axes, site):
        mesh = (name, tuple(shape), tuple(axes))
        if self.mesh is None:
            self.mesh, self.mesh_site = mesh, site
        elif self.mesh != mesh:
            raise CaptureError(
                f"the communicator at {site} is over mesh {mesh[0]} {mesh[1]} {mesh[2]}, but the "
                f"one at {self.mesh_site} over {self.mesh[0]} {self.mesh[1]} {self.mesh[2]}; "
                f"one traced program's communicators share one mesh (make them with "
                f"tdx.mpi.comm(mesh, axis) of one DeviceMesh)")

    def finish(self):
        for s in self.sends:
            if not s.matched:
                raise CaptureError(f"Isend at {s.site} (tag {s.tag}) is never received: no "
                                   f"Irecv/Recv with that tag is waited for in the traced "
                                   f"program; its peer would wait forever")
        for r in self.recvs:
            if not r.matched:
                raise CaptureError(f"Irecv at {r.site} (tag {r.tag}) is never waited for; "
                                   f"Wait on its handle (or drop it)")

    def mesh_op(self):
        name, shape, axes = self.mesh
        return (f"tdx.mesh @{name} shape = [{', '.join(map(str, shape))}] axes = "
                f"[{', '.join(chr(34) + a + chr(34) for a in axes)}]")


_RECORDING = []


def recording():
    """The innermost trace's :class:`Recording`, or None outside a trace."""
    return _RECORDING[-1] if _RECORDING else None


def with_mesh(text, rec):
    """The traced module `text` with the mesh of `rec`'s communicators
    declared (when the trace recorded user collectives): tdx.compile then
    runs tdx-manual-program on it instead of propagation and partitioning."""
    if rec.mesh is None:
        return text
    rec.finish()
    if f"tdx.mesh @{rec.mesh[0]} " in text:   # a manual region declared it
        return text
    head, _, rest = text.partition("\n")
    return f"{head}\n  {rec.mesh_op()}\n{rest}"


def is_manual(prog):
    """Whether `prog`'s communication is the user's (tdx::... calls)."""
    return prog._module.has_user_collectives()


def lowered(prog):
    """`prog`'s per-rank program when its communication is the user's
    (tdx-manual-program on a copy), else `prog`."""
    if not is_manual(prog) or prog.is_partitioned:
        return prog
    out = prog.copy()
    out.run_pipeline("tdx-manual-program")
    return out


def site():
    """The user's source line (the first frame outside tdx and torch)."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = inspect.currentframe()
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(here + os.sep) and f"{os.sep}torch{os.sep}" not in path:
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"
