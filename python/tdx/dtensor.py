"""A runner's state as torch DTensors (``runner.state_dict(dtensor=True)``
under SPMD): every rank's own shard of each tensor, on torch's
``DeviceMesh`` of the program's mesh over the job's gloo process group, so
code that expects DTensors (``torch.distributed.checkpoint``,
``full_tensor()``, torchtitan's checkpointer) takes what tdx trained.

The process group: torch.distributed's default one when the script has
made it (over the same processes, rank for rank), else a gloo group this
module makes over the runner's ranks, meeting through a file in the
ranks' shared directory (no address or port to choose).

A tdx layout maps placement for placement: ``Shard(d)`` on a mesh axis is
DTensor's ``Shard(d)`` on that mesh dimension (both split as torch.chunk
does, nested in mesh order), ``Replicate()`` is ``Replicate()``. A
pipeline program's per-stage state has no DTensor placement: refused.
"""

import os
import re

import torch

from .errors import InputError

_PLACEMENT = re.compile(r"Shard\((-?\d+)\)|Replicate\(\)|Partial|Stage\(")


def placements(layout, axes):
    """DTensor placements of tdx layout text (``"[Shard(0), Replicate()]"``,
    ``"[]"`` for replicated) on a mesh of `axes` axes."""
    from torch.distributed.tensor import Replicate, Shard
    found = []
    for m in _PLACEMENT.finditer(layout):
        if m.group(0).startswith("Shard"):
            found.append(Shard(int(m.group(1))))
        elif m.group(0).startswith("Replicate"):
            found.append(Replicate())
        else:
            raise InputError(f"state_dict(dtensor=True): layout {layout} has no DTensor "
                             f"placement (a pipeline stage's or a partial value); use "
                             f"state_dict() for full tensors")
    return found + [Replicate()] * (axes - len(found))


def _local(tensor, mesh_shape, coords, places):
    """The box of `tensor` that mesh coordinates `coords` hold under
    `places`: each Shard(d) takes its torch.chunk of what is left, in mesh
    order."""
    from torch.distributed.tensor import Shard
    for size, coord, p in zip(mesh_shape, coords, places):
        if isinstance(p, Shard):
            chunks = torch.chunk(tensor, size, dim=p.dim)
            tensor = chunks[coord] if coord < len(chunks) else \
                tensor.narrow(p.dim, tensor.shape[p.dim], 0)
    return tensor.contiguous()


def device_mesh(signature, rank, meeting_dir):
    """torch's DeviceMesh of the program's mesh (its axes' names), made on
    the default process group, made first (gloo) where there is none."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    shape = [int(s) for s in signature["mesh"]] or [1]
    world = 1
    for s in shape:
        world *= s
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                init_method="file://" + os.path.join(meeting_dir, "torch-pg"))
    elif dist.get_world_size() != world:
        raise InputError(f"state_dict(dtensor=True): torch.distributed's process group has "
                         f"{dist.get_world_size()} ranks but the program's mesh {shape} has "
                         f"{world}")
    axes = tuple(signature.get("axes") or [f"axis{i}" for i in range(len(shape))])
    return init_device_mesh("cpu", tuple(shape), mesh_dim_names=axes)


def to_dtensors(state, signature, tied, mesh, rank):
    """Each global tensor of `state` as a DTensor of this rank's shard; a
    tied name (`tied`: name -> the one it shares) is the same DTensor."""
    from torch.distributed.tensor import DTensor
    layouts = {p["name"]: p["layout"] for p in signature["params"]}
    shape = list(mesh.shape)
    coords = []
    for s in reversed(shape):
        coords.append(rank % s)
        rank //= s
    coords.reverse()
    out = {}
    for name, t in state.items():
        if tied.get(name) in out:
            out[name] = out[tied[name]]
            continue
        places = placements(layouts.get(tied.get(name, name), "[]"), len(shape))
        local = _local(t, shape, coords, places)
        out[name] = DTensor.from_local(local, mesh, places, run_check=False, shape=t.shape,
                                       stride=t.stride())
    return out
