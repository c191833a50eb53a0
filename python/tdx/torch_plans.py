"""torch's own mesh, placements and tensor-parallel plan styles, taken where
tdx takes its own.

A user's torchtitan-style plan (``torch.distributed.tensor.parallel``'s
``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``,
``PrepareModuleInput``) and torch's ``DeviceMesh`` (an SPMD script's, or one
made in a single process over torch's fake process group) go to
:func:`tdx.parallelize` unchanged; torch's ``Shard``/``Replicate``/
``Partial`` go wherever tdx takes placements. Each is converted here, in one
place, to tdx's equivalent."""

import torch

from . import placements as _p
from . import plans as _plans


def _torch_types():
    """torch's DeviceMesh, placement and plan-style classes, or None where
    this torch lacks torch.distributed."""
    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import Partial, Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                       PrepareModuleOutput, RowwiseParallel,
                                                       SequenceParallel)
    except ImportError:  # a torch built without distributed
        return None
    return dict(DeviceMesh=DeviceMesh, Shard=Shard, Replicate=Replicate, Partial=Partial,
                ColwiseParallel=ColwiseParallel, RowwiseParallel=RowwiseParallel,
                SequenceParallel=SequenceParallel, PrepareModuleInput=PrepareModuleInput,
                PrepareModuleOutput=PrepareModuleOutput)


def mesh(m):
    """tdx's DeviceMesh for `m` (tdx's own, or torch's DeviceMesh)."""
    if isinstance(m, _p.DeviceMesh):
        return m
    types = _torch_types()
    if types is None or not isinstance(m, types["DeviceMesh"]):
        raise TypeError(f"expected a tdx.DeviceMesh or torch's DeviceMesh, got {type(m).__name__}")
    ranks = m.mesh
    if not torch.equal(ranks, torch.arange(ranks.numel()).reshape(ranks.shape)):
        raise ValueError(f"torch's DeviceMesh over ranks {ranks.tolist()} is a part of a larger "
                         f"mesh; give tdx the whole (root) mesh, e.g. world_mesh rather than "
                         f"world_mesh['tp']: plan styles use its 'tp' axis")
    return _p.DeviceMesh(m.device_type, ranks, m.mesh_dim_names)


def placement(p):
    """tdx's placement for `p` (tdx's own, or torch.distributed.tensor's)."""
    if isinstance(p, (_p.Shard, _p.Replicate, _p.Partial)):
        return p
    types = _torch_types()
    if types is not None:
        if isinstance(p, types["Shard"]):
            return _p.Shard(p.dim)
        if isinstance(p, types["Replicate"]):
            return _p.Replicate()
        if isinstance(p, types["Partial"]):
            return _p.Partial(p.reduce_op)
    raise TypeError(f"placements are tdx.Shard, tdx.Replicate or tdx.Partial (or torch."
                    f"distributed.tensor's), got {p!r}")


def is_torch_style(style):
    types = _torch_types()
    if types is None:
        return False
    from torch.distributed.tensor.parallel import ParallelStyle
    return isinstance(style, ParallelStyle)


def _axis(m):
    if "tp" in m.mesh_dim_names:
        return "tp"
    if m.ndim == 1:
        return m.mesh_dim_names[0]
    raise ValueError(f"torch's plan styles carry no mesh axis: tdx applies them over the mesh "
                     f"axis named 'tp', and this mesh's axes are {list(m.mesh_dim_names)}; name "
                     f"the tensor-parallel axis 'tp' (mesh_dim_names)")


class _Placed(_plans._Style):
    """A plan entry whose parameters get fixed placements on one axis (what
    torch's ColwiseParallel means for an Embedding: its weight Shard(1))."""

    def __init__(self, mesh_axis, placements):
        super().__init__(mesh_axis)
        self.placements = placements


def style(s, module, m):
    """tdx's style for torch's plan style `s` on `module` (the nn.Module the
    pattern names, or None when it matches several kinds), over mesh `m`;
    None for styles tdx has no use for (PrepareModuleInput/Output: tdx
    places activations by propagation, which inserts the redistributions
    the placed parameters ask for)."""
    types = _torch_types()
    if isinstance(s, (types["PrepareModuleInput"], types["PrepareModuleOutput"])):
        return None
    axis = _axis(m)
    embedding = isinstance(module, torch.nn.Embedding)
    if isinstance(s, types["SequenceParallel"]):
        return _plans.SequenceParallel(axis, seq_dim=getattr(s, "sequence_sharding", (_p.Shard(1),))[0].dim)
    if isinstance(s, types["ColwiseParallel"]):
        return _Placed(axis, {"weight": _p.Shard(1)}) if embedding else _plans.ColwiseParallel(axis)
    if isinstance(s, types["RowwiseParallel"]):
        return _plans.VocabParallel(axis) if embedding else _plans.RowwiseParallel(axis)
    raise TypeError(f"{type(s).__name__} is a torch plan style tdx does not take; use "
                    f"ColwiseParallel, RowwiseParallel, SequenceParallel or PrepareModuleInput")


def recorded_plan(apply, model, *args, **kwargs):
    """The tensor-parallel plan that ``apply(model, *args, **kwargs)`` gives
    through torch's ``parallelize_module`` (torchtitan's ``apply_tp``, or a
    user's own function), as one plan dict ``{qualified module name: torch
    style}`` for :func:`tdx.parallelize`, recorded instead of applied: the
    model is not changed and no process group is needed (the mesh ``apply``
    is given is only passed along). Every ``parallelize_module`` call on
    `model` or one of its submodules is recorded, its plan keys prefixed
    with that submodule's name; a style given for a whole module (not a
    dict) is recorded under the module's own name."""
    import sys

    from torch.distributed.tensor.parallel import api

    original = api.parallelize_module
    names = {id(m): n for n, m in model.named_modules()}
    plan = {}

    def record(module, device_mesh=None, parallelize_plan=None, **_):
        if id(module) not in names:
            raise ValueError(f"recorded_plan: parallelize_module was called on a "
                             f"{type(module).__name__} that is not a submodule of the model "
                             f"given; pass the model apply() parallelizes")
        prefix = names[id(module)]
        entries = parallelize_plan if isinstance(parallelize_plan, dict) else \
            {"": parallelize_plan}
        for key, style in entries.items():
            name = ".".join(p for p in (prefix, key) if p)
            if not name:
                raise ValueError("recorded_plan: a style for the whole model has no module "
                                 "name to place; give styles for its submodules")
            plan[name] = style
        return module

    # Modules that imported the function by name (torchtitan's do) hold
    # their own reference: each is pointed at the recorder for the call.
    # (Their own dicts only: a module's __getattr__ may import or warn.)
    holders = [m for m in list(sys.modules.values())
               if getattr(m, "__dict__", {}).get("parallelize_module") is original]
    for m in holders:
        m.parallelize_module = record
    try:
        apply(model, *args, **kwargs)
    finally:
        for m in holders:
            m.parallelize_module = original
    return plan
