"""``tdx.ExpertParallel``: a Mixture of Experts' routed experts split over a
mesh axis, the tokens dispatched to the experts' ranks and back (issue 55).

The experts modules an ``ExpertParallel`` entry names (Hugging Face's
``*Experts`` with their default ``grouped_mm`` implementation) are recorded
as a manual region over the axis: the tokens, their top-k expert indices
and routing weights split along the tokens (as data parallelism splits
them, over the data-parallel axis too), the stacked expert weights
``Shard(0)`` (each rank holds ``num_experts / ep`` of them). Inside, each
rank sends each (token, expert) pair to the rank holding the expert with
one all-to-all of a static buffer sized for the worst case that can arrive
(``tokens * min(top_k, local experts)`` rows from each rank: dropless),
runs its experts on what arrived (transformers' own grouped_mm experts
forward, the padding rows masked as its expert-parallel sentinels), sends
the results back with a second all-to-all and sums each token's top-k. The
step is recorded again for it, as ``ContextParallel`` and
``mixed_precision`` record it.
"""

import contextlib
import functools
import types

import torch
import torch.distributed._functional_collectives as funcol

from .errors import CaptureError
from .sharding import Replicate, Shard, _Style


class ExpertParallel(_Style):
    """Routed experts split over ``mesh_axis``: for the plan's experts
    modules (``{"model.layers.*.mlp.experts": tdx.ExpertParallel()}``),
    each rank holds ``num_experts / ep`` experts and the tokens go to their
    experts' ranks and back (dropless). The experts must divide evenly."""

    placements = {}

    def __init__(self, mesh_axis="ep"):
        super().__init__(mesh_axis)


_WEIGHTS = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias",
            "down_proj_bias")


class _Shard:
    """An experts module seen with this rank's experts: `overrides` (its
    local weights, their count), the rest (activation, gate limits, norms)
    the module's own."""

    def __init__(self, module, overrides):
        self.__dict__.update(overrides)
        self._module = module

    def __getattr__(self, name):
        return getattr(self.__dict__["_module"], name)


def _dispatch(x, index, weight, *experts, module, names, mesh, axis):
    """Per-shard code: this rank's tokens `x` (T, H) with their top-k
    `index` and `weight` (T, k), and its experts' weights `experts` (named
    `names`): the experts' output for its tokens (T, H)."""
    n = mesh.size(mesh.axis(axis))
    local = experts[0].shape[0]
    tokens, k = index.shape
    pairs = tokens * k
    room = tokens * min(k, local)              # the most one rank can be sent
    flat = index.reshape(-1)
    dest = torch.div(flat, local, rounding_mode="floor")
    onehot = torch.nn.functional.one_hot(dest, n)
    slot = (onehot.cumsum(0) * onehot).sum(-1) - 1   # the pair's place in its chunk
    where = dest * room + slot
    token = torch.div(torch.arange(pairs), k, rounding_mode="floor")
    rows = n * room
    send = x.new_zeros(rows, x.shape[-1]).index_put((where,), x[token])
    send_expert = torch.full((rows,), local, dtype=torch.int64).index_put(
        (where,), torch.remainder(flat, local))
    send_weight = weight.new_zeros(rows).index_put((where,), weight.reshape(-1))
    group = (mesh, axis)
    got = funcol.all_to_all_single(send, None, None, group)
    got_expert = funcol.all_to_all_single(send_expert, None, None, group)
    got_weight = funcol.all_to_all_single(send_weight, None, None, group)
    # Transformers' own experts forward over this rank's experts: a row
    # whose expert id is `local` (the padding) is its expert-parallel
    # sentinel, masked in and out.
    shard = _Shard(module, dict(zip(names, experts), num_experts=local,
                                _is_expert_parallel=True))
    shard._apply_gate = types.MethodType(type(module)._apply_gate, shard)
    from transformers.integrations.moe import grouped_mm_experts_forward
    out = grouped_mm_experts_forward(shard, got, got_expert[:, None], got_weight[:, None])
    back = funcol.all_to_all_single(out, None, None, group)
    return back[where].reshape(tokens, k, -1).sum(1).to(x.dtype)


class _Routing:
    def __init__(self, modules, mesh, axis, batch_axis):
        self.modules, self.mesh, self.axis = modules, mesh, axis
        self.tokens = tuple(Shard(0) if a in (axis, batch_axis) else Replicate()
                            for a in mesh.mesh_dim_names)
        self.experts = tuple(Shard(0) if a == axis else Replicate()
                             for a in mesh.mesh_dim_names)

    def forward(self, module, hidden_states, top_k_index, top_k_weights):
        from .regions import local_map
        n = self.mesh.size(self.mesh.axis(self.axis))
        if module.num_experts % n:
            raise CaptureError(f"ExpertParallel: {type(module).__name__} has "
                               f"{module.num_experts} experts, which do not split evenly over "
                               f"the {n} ranks of {self.axis!r}; give an ep size that divides "
                               f"them")
        names = [a for a in _WEIGHTS if isinstance(getattr(module, a, None), torch.Tensor)]
        body = lambda x, i, w, *e: _dispatch(  # noqa: E731
            x, i, w, *e, module=module, names=names, mesh=self.mesh, axis=self.axis)
        t, e = self.tokens, self.experts
        return local_map(body, out_placements=(t,), in_placements=(t, t, t) + (e,) * len(names),
                         mesh=self.mesh)(hidden_states, top_k_index, top_k_weights,
                                         *(getattr(module, a) for a in names))

    @contextlib.contextmanager
    def active(self):
        saved = [(m, m.__dict__.get("forward")) for m in self.modules]
        for m in self.modules:
            m.forward = functools.partial(self.forward, m)
        try:
            yield
        finally:
            for m, f in saved:
                if f is None:
                    del m.forward
                else:
                    m.forward = f


def apply(prog, mesh, styles, data_parallel):
    """Records `prog` again with the experts of the modules `styles`
    (pattern -> ExpertParallel) split over their axis."""
    from .regions import recorded_as_regions
    for s in styles.values():
        mesh.axis(s.mesh_axis)

    def routing(modules, axis):
        for pattern, m in modules:
            if getattr(getattr(m, "config", None), "_experts_implementation",
                       "grouped_mm") != "grouped_mm" or not hasattr(m, "num_experts"):
                raise ValueError(f"plan pattern {pattern!r} (ExpertParallel) names "
                                 f"{type(m).__name__}, which is not a Hugging Face experts "
                                 f"module with the grouped_mm implementation")
        return _Routing([m for _, m in modules], mesh, axis, data_parallel)
    prog.expert_parallel = recorded_as_regions(
        prog, "ExpertParallel", styles, routing,
        lambda model: f"experts modules are named like "
                      f"{[n for n, _ in model.named_modules() if n.endswith('experts')][:3]}")
