"""torch's own collectives inside a trace.

While ``tdx.trace`` / ``tdx.trace_train_step`` record, the functions of
``torch.distributed._functional_collectives`` (``all_reduce``,
``all_gather_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single``,
``permute_tensor``, ``broadcast``, ``wait_tensor`` and the ``_autograd``
variants) and of ``torch.distributed.nn.functional`` (``all_reduce``,
``broadcast``, ``all_gather``, ``all_to_all_single``) record the ``tdx::``
collectives of :mod:`tdx.collectives`, so model code written for torch's
collectives compiles unchanged. No process group is needed: the group is
a ``DeviceMesh`` (tdx's or torch's; 1-D, or ``(mesh, axis)``), or a list of
every rank of a 1-D mesh.

Gradients follow torch's differentiable forms (the ``_autograd`` variants,
``torch.distributed.nn.functional``): all_reduce sum <-> all_reduce sum,
all_gather <-> reduce_scatter, all_to_all <-> all_to_all reversed. torch's
plain functional collectives have no derivative (their backward raises);
tdx records the same adjoint for them. Outside a trace nothing changes:
torch's functions run on torch's process groups.
"""

import contextlib

import torch

from . import collectives as _c
from .errors import CaptureError

_REDUCE = {"sum": "sum", "avg": "avg", "max": "max", "min": "min"}


def _group(group, call, site):
    """(mesh name, mesh shape, mesh axes, group axes) of a torch group."""
    import torch.distributed as dist
    mesh, axis = group, None
    if isinstance(group, tuple) and len(group) == 2:
        mesh, axis = group
    names = getattr(mesh, "mesh_dim_names", None)
    ranks = getattr(mesh, "mesh", None)
    if names is not None or ranks is not None:
        shape = tuple(ranks.shape) if isinstance(ranks, torch.Tensor) else tuple(mesh.shape)
        names = tuple(names or (f"dim{i}" for i in range(len(shape))))
        if axis is None:
            if len(shape) != 1:
                raise CaptureError(f"{call} at {site}: the group is a {len(shape)}-D mesh; give "
                                   f"the axis, (mesh, \"axis\") or mesh[\"axis\"]")
            axis = names[0]
        if isinstance(axis, int):
            axis = names[axis]
        if axis not in names:
            raise CaptureError(f"{call} at {site}: the mesh has no axis {axis!r} (its axes: "
                               f"{names})")
        return getattr(mesh, "name", "mesh"), shape, names, (axis,)
    if isinstance(group, (list, tuple)) and all(isinstance(r, int) for r in group):
        if list(group) != list(range(len(group))):
            raise CaptureError(f"{call} at {site}: the group {list(group)} is some of the "
                               f"ranks; inside a traced program name them as a mesh axis "
                               f"(a DeviceMesh, or (mesh, axis))")
        return _world(len(group))
    if group is None or (dist.is_available() and dist.is_initialized()
                         and group is dist.group.WORLD):
        if not (dist.is_available() and dist.is_initialized()):
            raise CaptureError(f"{call} at {site}: the default group is torch.distributed's "
                               f"world, which is not initialized here; give group= a "
                               f"DeviceMesh (tdx.init_device_mesh) or a list of the ranks")
        return _world(dist.get_world_size())
    raise CaptureError(f"{call} at {site}: tdx takes the group as a DeviceMesh, (mesh, axis) "
                       f"or a list of every rank, not {type(group).__name__}")


def _world(n):
    """Every rank: the trace's 1-D mesh when it has one of n ranks."""
    rec = _c.recording()
    if rec.mesh is not None and len(rec.mesh[1]) == 1 and rec.mesh[1][0] == n:
        return rec.mesh[0], rec.mesh[1], rec.mesh[2], rec.mesh[2]
    return "world", (n,), ("world",), ("world",)


def _args(group, call):
    site = _c.site()
    name, shape, axes, group_axes = _group(group, call, site)
    _c.recording().use(name, shape, axes, site)
    size = 1
    for a in group_axes:
        size *= shape[axes.index(a)]
    return ",".join(group_axes), size, site


def _reduce(op, call):
    name = str(getattr(op, "name", op)).lower()
    name = name.rsplit(".", 1)[-1]
    if name not in _REDUCE:
        raise CaptureError(f"{call}: tdx reduces with sum, avg, max or min, not {op!r}")
    return _REDUCE[name]


def _even(sizes, call, site):
    if sizes is not None and len(set(sizes)) > 1:
        raise CaptureError(f"{call} at {site}: split sizes {list(sizes)} are uneven; a compiled "
                           f"program moves equal shares (pad to the largest)")


def all_reduce(self, reduceOp, group, tag=""):
    return torch.ops.tdx.all_reduce(self, _reduce(reduceOp, "all_reduce"),
                                    *_args(group, "all_reduce"))


def all_gather_tensor(self, gather_dim, group, tag=""):
    return torch.ops.tdx.all_gather(self, gather_dim, *_args(group, "all_gather_tensor"))


def reduce_scatter_tensor(self, reduceOp, scatter_dim, group, tag=""):
    return torch.ops.tdx.reduce_scatter(self, _reduce(reduceOp, "reduce_scatter_tensor"),
                                        scatter_dim, *_args(group, "reduce_scatter_tensor"))


def all_to_all_single(self, output_split_sizes, input_split_sizes, group, tag=""):
    axes, size, site = _args(group, "all_to_all_single")
    _even(output_split_sizes, "all_to_all_single", site)
    _even(input_split_sizes, "all_to_all_single", site)
    return torch.ops.tdx.all_to_all(self, 0, 0, axes, size, site)


def permute_tensor(self, src_dst, group, tag=""):
    axes, size, site = _args(group, "permute_tensor")
    if sorted(src_dst) != list(range(size)):
        raise CaptureError(f"permute_tensor at {site}: src_dst {list(src_dst)} is not a "
                           f"permutation of the group's {size} ranks")
    pairs = [p for r, d in enumerate(src_dst) for p in (r, d)]
    return torch.ops.tdx.permute(self, pairs, axes, size, site)


def broadcast(self, src, group, tag=""):
    return torch.ops.tdx.broadcast(self, src, *_args(group, "broadcast"))


def wait_tensor(tensor):
    return tensor


def _nn_all_reduce(tensor, op=None, group=None):
    return torch.ops.tdx.all_reduce(tensor, "sum" if op is None else _reduce(op, "all_reduce"),
                                    *_args(group, "all_reduce"))


def _nn_broadcast(tensor, src, group=None):
    return torch.ops.tdx.broadcast(tensor, src, *_args(group, "broadcast"))


def _nn_all_gather(tensor, group=None):
    axes, size, site = _args(group, "all_gather")
    gathered = torch.ops.tdx.all_gather(tensor.unsqueeze(0), 0, axes, size, site)
    return tuple(gathered.unbind(0))


def _nn_all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                          group=None):
    axes, size, site = _args(group, "all_to_all_single")
    _even(output_split_sizes, "all_to_all_single", site)
    _even(input_split_sizes, "all_to_all_single", site)
    return torch.ops.tdx.all_to_all(input, 0, 0, axes, size, site)


def ragged_all_to_all(input, input_offsets, send_sizes, output_offsets, recv_sizes,
                      output_rows, group):
    """An all-to-all of rows whose counts are values (XLA's
    ``ragged_all_to_all``), for a region's code (``tdx.local_map``): this
    rank sends rows ``input[input_offsets[j]:input_offsets[j] +
    send_sizes[j]]`` to rank ``j`` of `group` and gets back an
    ``(output_rows, *input.shape[1:])`` tensor holding the
    ``recv_sizes[i]`` rows rank ``i`` sent at ``output_offsets[i]`` (this
    rank's own offsets, as MPI_Alltoallv's), zeros elsewhere. The four are
    int64 tensors of one entry per rank, computed in the program: nothing
    is read on the host to trace it, and only the rows sent move. Rank
    ``i``'s ``recv_sizes[j]`` must equal rank ``j``'s ``send_sizes[i]``
    (exchange them first with ``all_to_all_single``); the runtime checks
    that and every range. Differentiable: the gradient goes back by the
    same op with the offsets and sizes swapped."""
    if _c.recording() is None:
        raise CaptureError("tdx.ragged_all_to_all runs inside a program tdx traces "
                           "(tdx.trace / tdx.trace_train_step), in a tdx.local_map region; "
                           "eagerly, use torch.distributed.all_to_all_single with split sizes")
    axes, size, site = _args(group, "ragged_all_to_all")
    return torch.ops.tdx.ragged_all_to_all(input, input_offsets, send_sizes, output_offsets,
                                           recv_sizes, int(output_rows), axes, size, site)


_FUNCOL = {
    "all_reduce": all_reduce, "all_gather_tensor": all_gather_tensor,
    "all_gather_tensor_autograd": all_gather_tensor,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "reduce_scatter_tensor_autograd": reduce_scatter_tensor,
    "all_to_all_single": all_to_all_single, "all_to_all_single_autograd": all_to_all_single,
    "permute_tensor": permute_tensor, "broadcast": broadcast, "wait_tensor": wait_tensor,
}
_NN = {"all_reduce": _nn_all_reduce, "broadcast": _nn_broadcast, "all_gather": _nn_all_gather,
       "all_to_all_single": _nn_all_to_all_single}


@contextlib.contextmanager
def recorded():
    """While a trace records: torch's collectives record tdx's."""
    try:
        import torch.distributed._functional_collectives as funcol
        import torch.distributed.nn.functional as nnf
    except ImportError:      # a torch built without distributed
        yield
        return
    from . import regions
    tables = [(funcol, _FUNCOL), (nnf, _NN)]
    try:    # torch's local_map called inside the trace makes tdx's region
        import torch.distributed.tensor.experimental as exp
        import torch.distributed.tensor.experimental._func_map as func_map
        tables += [(exp, {"local_map": regions.local_map}),
                   (func_map, {"local_map": regions.local_map,
                               "_local_map_wrapped":
                                   regions.torch_wrapped(func_map._local_map_wrapped)})]
    except ImportError:
        pass
    saved = [(m, k, getattr(m, k)) for m, table in tables for k in table if hasattr(m, k)]
    for m, table in tables:
        for k, fn in table.items():
            if hasattr(m, k):
                setattr(m, k, fn)
    try:
        yield
    finally:
        for m, k, fn in saved:
            setattr(m, k, fn)


@contextlib.contextmanager
def record():
    """Around a trace: the user collectives it records."""
    rec = _c.Recording()
    _c._RECORDING.append(rec)
    try:
        with recorded():
            yield rec
    finally:
        _c._RECORDING.pop()
