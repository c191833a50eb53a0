"""A reference with a known error, for tests whose problem is ill-conditioned.

Batch norm in training mode over a few samples (a micro-batch of 2, a 1x1
feature map), or Adam's update g / (sqrt(v) + eps) on a gradient that is
zero but for rounding (GPT-2's attention key bias: softmax ignores a shift
of the keys), turn the last bits of float32 rounding into differences far
above float32's epsilon: eager PyTorch's own float32 run is then not a
reference to hold tdx to at a fixed tolerance (any summation order, eager's
own, moves it). Such tests judge tdx against eager in float64 (the same
model, weights, batches and optimizer, every float tensor in float64), whose
rounding is 2^29 times finer, and allow tdx `factor` (2) times eager
float32's own distance from it, plus a small floor: tdx must be as good a
float32 computation of the step as eager's, not equal to it.

    fp32, fp64 = eager_runs(model, optimizer, loop, data)
    assert_losses_near_float64(losses, fp32.losses, fp64.losses)
    assert_state_near_float64(state, fp32.state(), fp64.state())
"""

import collections
import copy

import torch

FACTOR = 2.0
# Floors, relative to the float64 value: a few float32 epsilons for a loss
# (eager's own distance can be 0 by chance at a step), and for a tensor's
# norm.
LOSS_FLOOR = 1e-6
STATE_FLOOR = 1e-6


def in_float64(module):
    """A float64 copy of an eager model: its parameters and floating-point
    buffers (batch norm's running statistics) converted exactly, integer
    buffers (num_batches_tracked) as they are. The copy is taken before
    any step, so both runs start from the same values."""
    return copy.deepcopy(module).double()


def batch_in(dtype, batch):
    """A batch's floating-point tensors in `dtype`; integer ones (token ids,
    class targets) unchanged."""
    return tuple(t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t
                 for t in batch)


class Run(collections.namedtuple("Run", "model optimizer losses")):
    """One eager run: the model after its steps, its optimizer and the
    per-step losses (Python floats)."""

    def state(self):
        """Parameters, buffers and optimizer state by the names tdx's state
        has ("optimizer.<parameter>.<key>" for the optimizer's)."""
        out = dict(self.model.named_parameters())
        out.update(self.model.named_buffers())
        names = {id(p): n for n, p in self.model.named_parameters()}
        for p, entries in self.optimizer.state.items():
            for key, t in entries.items():
                if torch.is_tensor(t) and t.dim() > 0:
                    out[f"optimizer.{names[id(p)]}.{key}"] = t
        return {n: t.detach() for n, t in out.items()}


def eager_runs(model, make_optimizer, loop, data):
    """Eager's loop in float32 on `model` (as built, untouched before) and
    in float64 on an exact float64 copy of it, each with its own optimizer
    from make_optimizer(parameters). loop(model, optimizer, data) runs the
    steps and returns the losses; the float64 run gets `data` with its
    floating-point tensors in float64. Returns (fp32, fp64) Runs."""
    wide = in_float64(model)
    runs = []
    for m, dtype in ((model, torch.float32), (wide, torch.float64)):
        optimizer = make_optimizer(m.parameters())
        losses = loop(m, optimizer, [batch_in(dtype, b) for b in data])
        runs.append(Run(m, optimizer, [float(x) for x in losses]))
    return tuple(runs)


def assert_losses_near_float64(got, fp32, fp64, what="loss", factor=FACTOR, floor=LOSS_FLOOR):
    """Each step's loss `got` (tdx's) within factor x eager float32's
    distance from eager float64's loss, plus floor relative. Eager's
    distance at one step is one draw of its rounding (it can pass near 0);
    its scale up to that step is the largest distance of the steps so far
    (rounding's effect grows over a chaotic run)."""
    assert len(got) == len(fp32) == len(fp64), (len(got), len(fp32), len(fp64))
    scale = 0.0
    for k, (g, e, r) in enumerate(zip(got, fp32, fp64)):
        scale = max(scale, abs(e - r))
        err, allowed = abs(g - r), factor * scale + floor * abs(r)
        assert err <= allowed, (
            f"step {k}: {what} {g} is {err:.2e} ({err / abs(r):.1e} relative) from float64 "
            f"eager's {r}; float32 eager's {e} is {abs(e - r):.2e} from it (the largest so far "
            f"{scale:.2e}); allowed {factor:g} x that + {floor:.0e} relative = {allowed:.2e}")


def distances(got_state, fp32_state, fp64_state, names=None):
    """Per tensor name: (|got - fp64|, |fp32 - fp64|, |fp64|), Frobenius
    norms in float64."""
    out = {}
    for name in names if names is not None else fp64_state:
        ref = fp64_state[name].double()
        out[name] = ((got_state[name].double() - ref).norm().item(),
                     (fp32_state[name].double() - ref).norm().item(), ref.norm().item())
    return out


def assert_state_near_float64(got_state, fp32_state, fp64_state, names=None, what="final state",
                              factor=FACTOR, floor=STATE_FLOOR):
    """Every tensor `names` (default: every one of fp64_state) of tdx's
    final state (or other tensors by name: `what` they are) within factor x
    eager float32's distance from eager float64's (Frobenius norms), plus
    floor x the float64 tensor's norm. A tensor's norm of distances is
    stable where a single loss's distance is not: no running scale.
    Integer tensors (num_batches_tracked) must be equal."""
    failures = []
    for name in names if names is not None else fp64_state:
        ref = fp64_state[name]
        if not ref.is_floating_point():
            if not torch.equal(got_state[name].to(ref.dtype), ref):
                failures.append(f"{name}: {got_state[name]} vs {ref}")
            continue
        [(err, eager_err, size)] = distances(got_state, fp32_state, fp64_state, [name]).values()
        allowed = factor * eager_err + floor * size
        if not err <= allowed:
            failures.append(
                f"{name}: {err:.2e} ({err / max(size, 1e-30):.1e} relative) from float64 eager's; "
                f"float32 eager's {eager_err:.2e} ({eager_err / max(size, 1e-30):.1e}); allowed "
                f"{allowed:.2e}")
    assert not failures, f"{what} off float64 eager's by more than float32 eager's " \
                         f"{factor:g} x + {floor:.0e}:\n  " + "\n  ".join(failures)

