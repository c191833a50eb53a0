"""The key/value cache of a generation program (tdx.trace_generate): the
model's submodule of cache buffers, where a mesh stores them, and their
bytes per rank (docs/serving.md)."""

import math

import torch

from . import _C
from .placements import Replicate, Shard

# The buffers of the cache live on this submodule of the model (not
# persistent: a state dict does not hold them).
HOLDER = "tdx_kv_cache"


def cache_holder(model, shapes, recording):
    """The model's submodule of cache buffers, ``keys_i``/``values_i``
    shaped as `shapes` (one (keys shape, values shape, dtype) per layer)
    and a position counter ``length_i`` each, deferred buffers made once
    (a second trace of the model with the same shapes reuses them)."""
    holder = getattr(model, HOLDER, None)
    want = [s for k, v, _ in shapes for s in (k, v)]
    if holder is None or [tuple(b.shape) for n, b in holder.named_buffers()
                          if not n.startswith("length")] != want:
        def make():
            h = torch.nn.Module()
            for i, (k, v, dtype) in enumerate(shapes):
                h.register_buffer(f"keys_{i}", torch.zeros(k, dtype=dtype), persistent=False)
                h.register_buffer(f"values_{i}", torch.zeros(v, dtype=dtype), persistent=False)
                # The layer's position counter (HF's cumulative_length).
                h.register_buffer(f"length_{i}", torch.zeros((), dtype=torch.int64),
                                  persistent=False)
            setattr(model, HOLDER, h)
        _C.deferred_init_into(recording, make)
        holder = getattr(model, HOLDER)
    return holder


# The projections whose output heads are the cache's heads.
_KEY_PROJECTIONS = ("k_proj.weight", "key.weight", "wk.weight", "k.weight")


def cache_placements(prog, mesh, placed, data_parallel):
    """Where the key/value cache of a generation program is stored on
    `mesh`: its batch split over the data-parallel axis, its heads over the
    axis that splits the key projections by rows (a colwise tp plan: each
    rank caches only its heads); whole elsewhere. `placed` holds the
    plan's weight placements."""
    heads_axes = {a for name, placements in placed.items() if name.endswith(_KEY_PROJECTIONS)
                  for a, p in enumerate(placements) if isinstance(p, Shard) and p.dim == 0}
    dp = mesh.axis(data_parallel) if data_parallel is not None else None
    out = {}
    for name, shape, _, is_buffer, _ in prog._module.state():
        if not name.startswith(HOLDER + ".") or len(shape) != 4:
            continue
        placements = [Replicate()] * mesh.ndim
        if dp is not None and shape[0] % mesh.shape[dp] == 0:
            placements[dp] = Shard(0)
        for a in heads_axes:
            if a != dp and shape[1] % mesh.shape[a] == 0:
                placements[a] = Shard(1)
        out[name] = placements
    return out


def cache_bytes(prog):
    """The bytes of the key/value cache one rank of `prog` holds: each
    cache buffer's bytes over the ranks of the axes that split it."""
    mesh, placements = getattr(prog, "_cache_placements", (None, {}))
    total = 0
    for name, (shape, dtype) in prog.parameters().items():
        if not name.startswith(HOLDER + "."):
            continue
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        for axis, p in enumerate(placements.get(name, ())):
            if isinstance(p, Shard):
                size //= mesh.shape[axis]
        total += size
    return total
