"""``tdx.ContextParallel``: a plan's attention with its sequence split over a
mesh axis, with no code of the user's (docs/mpi.md, "Context
parallelism").

The modules a ``ContextParallel`` entry names have each causal
``F.scaled_dot_product_attention`` they call (themselves or their
submodules) recorded as a manual region (tdx.local_map): queries, keys and
values split along the sequence (dim 2) over the axis and along the batch
over the data-parallel axis; each rank all-gathers the keys and values over
the axis and attends its own block of queries to them with the causal mask
at the queries' global positions (the context parallelism of Llama 3's
training). The gradients are the all-gather's adjoint, a reduce-scatter of
the keys' and values'. The program around the regions is placed by
propagation as any other. The step is recorded again for it, as
``mixed_precision`` records it (a freshly traced step is needed).
"""

import contextlib
import functools

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from .errors import CaptureError
from .placements import Replicate, Shard
from .plans import _Style


class ContextParallel(_Style):
    """Attention split along the sequence over ``mesh_axis``: for the plan's
    attention modules (``{"layers.*.attention": tdx.ContextParallel()}``),
    every ``F.scaled_dot_product_attention`` they call runs on each rank's
    block of the sequence, the keys and values all-gathered over the axis.
    Causal or full attention, without ``attn_mask`` or dropout; the
    sequence must split evenly over the axis."""

    placements = {}

    def __init__(self, mesh_axis="cp"):
        super().__init__(mesh_axis)


def _attend(q, k, v, mesh, axis, causal, scale):
    """This rank's block of queries over every rank's keys and values
    (per-shard code, inside the region)."""
    k = funcol.all_gather_tensor(k, 2, (mesh, axis))
    v = funcol.all_gather_tensor(v, 2, (mesh, axis))
    if k.shape[1] != q.shape[1]:   # grouped-query attention (enable_gqa)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        block = q.shape[-2]
        q_pos = mesh.get_local_rank(axis) * block + torch.arange(block)
        future = torch.arange(k.shape[-2])[None, :] > q_pos[:, None]
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, -1) @ v


class _Routing:
    """While a trace records: SDPA calls made inside the matched modules
    become the context-parallel region."""

    def __init__(self, modules, mesh, axis, batch_axis):
        self.modules, self.mesh, self.axis = modules, mesh, axis
        self.placements = tuple(
            Shard(2) if a == axis else Shard(0) if a == batch_axis else Replicate()
            for a in mesh.mesh_dim_names)
        self.depth = 0

    def sdpa(self, original, query, key, value, attn_mask=None, dropout_p=0.0,
             is_causal=False, scale=None, enable_gqa=False, **kwargs):
        if self.depth == 0:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, **kwargs)
        from .collectives import site
        if attn_mask is not None or dropout_p or kwargs:
            raise CaptureError(
                f"ContextParallel at {site()}: scaled_dot_product_attention with "
                f"{'an attn_mask' if attn_mask is not None else 'dropout' if dropout_p else kwargs}"
                f" is not split over the sequence yet; give is_causal=True (or no mask) and "
                f"dropout_p=0, or leave this module out of the plan's ContextParallel")
        from .regions import local_map
        body = functools.partial(_attend, mesh=self.mesh, axis=self.axis, causal=is_causal,
                                 scale=scale)
        p = self.placements
        return local_map(body, out_placements=(p,), in_placements=(p, p, p),
                         mesh=self.mesh)(query, key, value)

    @contextlib.contextmanager
    def active(self):
        def enter(*_):
            self.depth += 1

        def leave(*_):
            self.depth -= 1
        hooks = [h for m in self.modules for h in (m.register_forward_pre_hook(enter),
                                                    m.register_forward_hook(leave))]
        original = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = functools.partial(self.sdpa, original)
        try:
            yield
        finally:
            F.scaled_dot_product_attention = original
            for h in hooks:
                h.remove()


def apply(prog, mesh, styles, data_parallel):
    """Records `prog` again with the attention of the modules `styles`
    (pattern -> ContextParallel) split over their axis."""
    from .regions import recorded_as_regions
    for s in styles.values():
        mesh.axis(s.mesh_axis)
        if s.mesh_axis == data_parallel:
            raise ValueError(f"ContextParallel splits the sequence over {s.mesh_axis!r}, which "
                             f"is the data-parallel axis too; give them different mesh axes")

    def routing(modules, axis):
        return _Routing([m for _, m in modules], mesh, axis, data_parallel)
    axis = recorded_as_regions(
        prog, "ContextParallel", styles, routing,
        lambda model: f"module names are like {[n for n, _ in model.named_modules() if n][:5]}")
    if not prog._module.has_manual_regions():
        raise ValueError(f"the modules {list(styles)} the plan's ContextParallel names call "
                         f"no torch.nn.functional.scaled_dot_product_attention in the step; "
                         f"name the attention modules")
    prog.context_parallel = axis
