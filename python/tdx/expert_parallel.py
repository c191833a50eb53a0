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
import math
import types

import torch
import torch.distributed._functional_collectives as funcol

from .errors import CaptureError
from .placements import Replicate, Shard
from .plans import _Style


class ExpertParallel(_Style):
    """Routed experts split over ``mesh_axis``: for the plan's experts
    modules (``{"model.layers.*.mlp.experts": tdx.ExpertParallel()}``),
    each rank holds ``num_experts / ep`` experts and the tokens go to their
    experts' ranks and back by ragged all-to-alls that move the routed rows
    only. The experts must divide evenly over the axis.

    ``capacity_factor=None`` (the default) is dropless: the receive buffer
    holds the most that can arrive. A number ``c > 0`` caps each expert at
    ``ceil(c * tokens * top_k / num_experts)`` of a rank's (token, expert)
    pairs, in token order (Megatron's and GShard's capacity); the pairs past
    it are dropped (they add nothing to the token's output), and the step
    counts them per expert, summed over the ranks, in each experts module's
    non-persistent buffer ``dropped_tokens`` (read with
    :meth:`dropped_tokens`)."""

    placements = {}

    def __init__(self, mesh_axis="ep", *, capacity_factor=None):
        super().__init__(mesh_axis)
        if capacity_factor is not None and not (
                isinstance(capacity_factor, (int, float)) and not isinstance(capacity_factor, bool)
                and capacity_factor > 0 and math.isfinite(capacity_factor)):
            raise ValueError(f"ExpertParallel: capacity_factor must be a number > 0 (each "
                             f"expert takes capacity_factor times its even share of the "
                             f"tokens), or None for dropless; got {capacity_factor!r}")
        self.capacity_factor = capacity_factor

    @staticmethod
    def dropped_tokens(runner):
        """{experts module name: int64 tensor (num_experts,)}: the (token,
        expert) pairs each expert dropped in the runner's last forward, over
        every rank (plans with ``capacity_factor``)."""
        suffix = ".dropped_tokens"
        return {k[:-len(suffix)]: v for k, v in runner.state_dict(optimizer=True).items()
                if k.endswith(suffix)}


_WEIGHTS = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias",
            "down_proj_bias")


def _weight_names(module):
    """The stacked expert weights `module` has, of _WEIGHTS."""
    return [a for a in _WEIGHTS if isinstance(getattr(module, a, None), torch.Tensor)]


class _Shard:
    """An experts module seen with this rank's experts: `overrides` (its
    local weights, their count), the rest (activation, gate limits, norms)
    the module's own."""

    def __init__(self, module, overrides):
        self.__dict__.update(overrides)
        self._module = module

    def __getattr__(self, name):
        return getattr(self.__dict__["_module"], name)


def capacity(capacity_factor, tokens, top_k, num_experts):
    """The pairs one rank may send each expert: ``capacity_factor`` times
    its even share, rounded up."""
    return math.ceil(capacity_factor * tokens * top_k / num_experts)


def _dispatch(x, index, weight, *experts, module, layer, names, mesh, axis, token_axes,
              capacity_factor):
    """Per-shard code: this rank's tokens `x` (T, H) with their top-k
    `index` and `weight` (T, k), and its experts' weights `experts` (named
    `names`): the experts' output for its tokens (T, H) and the pairs each
    expert dropped, over the ranks of `token_axes` (E,). `layer` is the
    experts module's name, for the run-time check of the router's ids."""
    from .torch_collectives import ragged_all_to_all
    n = mesh.size(mesh.axis(axis))
    local = experts[0].shape[0]
    tokens, k = index.shape
    pairs = tokens * k
    flat = index.reshape(-1)
    # An id outside the experts would send its row to no rank (or another
    # layer's rows): the step stops there instead, naming the layer.
    torch._assert_async(((flat >= 0) & (flat < local * n)).all(),
                        f"ExpertParallel: the router of {layer} ({type(module).__name__}) "
                        f"picked an expert id outside [0, {local * n}); its top-k indices must "
                        f"name one of the layer's {local * n} experts")
    dest = torch.div(flat, local, rounding_mode="floor")
    to_rank = torch.nn.functional.one_hot(dest, n)                  # (pairs, n)
    per_rank = to_rank.sum(0)
    if capacity_factor is None:
        room = tokens * min(k, local)          # the most one rank can be sent
        sent = per_rank
        order = torch.sort(dest, stable=True).indices
    else:
        cap = capacity(capacity_factor, tokens, k, local * n)
        room = local * cap
        to_expert = torch.nn.functional.one_hot(flat, local * n)    # (pairs, E)
        place = (to_expert.cumsum(0) * to_expert).sum(-1) - 1       # among its expert's pairs
        kept = (place < cap).to(torch.int64)
        dropped = (to_expert.sum(0) - cap).clamp(min=0)
        sent = (to_rank * kept[:, None]).sum(0)
        # By destination, the kept pairs first (in token order).
        order = torch.sort(dest * 2 + (1 - kept), stable=True).indices
    group = (mesh, axis)
    offsets = per_rank.cumsum(0) - per_rank
    received = funcol.all_to_all_single(sent, None, None, group)
    slots = torch.arange(n) * room
    rows = n * room

    def there(t):
        return ragged_all_to_all(t, offsets, sent, slots, received, rows, group)

    got = there(x[torch.div(order, k, rounding_mode="floor")])
    # Rows nobody sent are zero: ids go shifted by one, so a zero is the
    # padding, transformers' expert-parallel sentinel (`local`) here.
    got_expert = there(torch.remainder(flat, local)[order] + 1)
    got_expert = torch.where(got_expert == 0, local, got_expert - 1)
    got_weight = there(weight.reshape(-1)[order])
    shard = _Shard(module, dict(zip(names, experts), num_experts=local,
                                _is_expert_parallel=True))
    shard._apply_gate = types.MethodType(type(module)._apply_gate, shard)
    from transformers.integrations.moe import grouped_mm_experts_forward
    out = grouped_mm_experts_forward(shard, got, got_expert[:, None], got_weight[:, None])
    back = ragged_all_to_all(out, slots, received, offsets, sent, pairs, group)
    mine = back.new_zeros(back.shape).index_copy(0, order, back)
    y = mine.reshape(tokens, k, -1).sum(1).to(x.dtype)
    if capacity_factor is None:
        return y
    for a in token_axes:
        dropped = funcol.all_reduce(dropped, "sum", (mesh, a))
    return y, dropped


class _Routing:
    def __init__(self, modules, names, mesh, axis, batch_axis):
        self.modules, self.mesh, self.axis = [m for m, _ in modules], mesh, axis
        self.names = names
        self.capacity = {id(m): style.capacity_factor for m, style in modules}
        self.token_axes = [a for a in mesh.mesh_dim_names if a in (axis, batch_axis)]
        self.tokens = tuple(Shard(0) if a in self.token_axes else Replicate()
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
        names = _weight_names(module)
        capacity_factor = self.capacity[id(module)]
        body = functools.partial(_dispatch, module=module, layer=self.names[id(module)],
                                 names=names, mesh=self.mesh,
                                 axis=self.axis, token_axes=self.token_axes,
                                 capacity_factor=capacity_factor)
        t, e = self.tokens, self.experts
        every = (Replicate(),) * len(t)
        out = local_map(body, out_placements=(t,) if capacity_factor is None else (t, every),
                        in_placements=(t, t, t) + (e,) * len(names),
                        mesh=self.mesh)(hidden_states, top_k_index, top_k_weights,
                                        *(getattr(module, a) for a in names))
        if capacity_factor is None:
            return out
        y, dropped = out
        with torch.no_grad():
            module.dropped_tokens.copy_(dropped)
        return y

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


def is_experts_module(m):
    """Whether `m` is a Hugging Face experts module with the grouped_mm
    implementation (stacked expert weights, ``forward(hidden, top_k_index,
    top_k_weights)``), which ExpertParallel splits."""
    return (hasattr(m, "num_experts") and bool(_weight_names(m)) and
            getattr(getattr(m, "config", None), "_experts_implementation",
                    "grouped_mm") == "grouped_mm")


def apply(prog, mesh, styles, data_parallel):
    """Records `prog` again with the experts of the modules `styles`
    (pattern -> ExpertParallel) split over their axis. Returns the routed
    experts' weights with their placements ({name: [Shard(0) on the axis,
    Replicate elsewhere]}), for parallelize to place as a plan's."""
    from .regions import recorded_as_regions
    for s in styles.values():
        mesh.axis(s.mesh_axis)

    def routing(modules, axis):
        for pattern, m in modules:
            if not is_experts_module(m):
                raise ValueError(f"plan pattern {pattern!r} (ExpertParallel) names "
                                 f"{type(m).__name__}, which is not a Hugging Face experts "
                                 f"module with the grouped_mm implementation")
        found = [(m, styles[pattern]) for pattern, m in modules]
        counted = [m for m, style in found if style.capacity_factor is not None
                   and "dropped_tokens" not in m._buffers]
        if counted:     # the counts are state of the program, made as deferred zeros
            from . import _C
            recording = _C.recording_of(next(prog._model.parameters()))
            _C.deferred_init_into(recording, lambda: [
                m.register_buffer("dropped_tokens", torch.zeros(m.num_experts, dtype=torch.int64),
                                  persistent=False) for m in counted])
        names = {id(m): name for name, m in prog._model.named_modules()}
        made = _Routing(found, names, mesh, axis, data_parallel)
        for m, _ in found:
            weights.update({f"{names[id(m)]}.{a}": list(made.experts) for a in _weight_names(m)})
        return made

    weights = {}
    prog.expert_parallel = recorded_as_regions(
        prog, "ExpertParallel", styles, routing,
        lambda model: f"experts modules are named like "
                      f"{[n for n, _ in model.named_modules() if n.endswith('experts')][:3]}")
    return weights
