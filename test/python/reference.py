"""A reference with a measured error, for tests whose problem is ill-conditioned.

Batch norm in training mode over a few samples (a micro-batch of 2, a 1x1
feature map), or Adam's update g / (sqrt(v) + eps) on a gradient that is
zero but for rounding (GPT-2's attention key bias: softmax ignores a shift
of the keys), turn the last bits of float32 rounding into differences far
above float32's epsilon: eager PyTorch's own float32 run is then not a
reference to hold tdx to at a fixed tolerance (any summation order, eager's
own on another CPU, moves it). Such tests judge tdx against eager in
float64 (the same model, weights, batches and optimizer, every float tensor
in float64), whose rounding is 2^29 times finer.

How far from float64 a valid float32 computation lands is measured, not
taken from one sample: eager's float32 loop also runs under the other
summation orders eager itself has (ORDERS: ATen's thread counts 1 and 2,
which split reductions into other chunks; oneDNN on and off, which computes
convolutions and their gradients with other kernels; each batch's samples
as given and reversed, which sums every reduction over the batch in another
order; 8 orders in all). tdx, one
more float32 summation order, must land within `factor` (2) times the
farthest of them, plus a small floor:

- a well-conditioned tensor or loss (float32's spread a few epsilons of its
  size, relative) is thereby held to a few epsilons: tight;
- an ill-conditioned one (a momentum buffer of a gradient that is rounding
  noise) gets a bound its own spread sets, on the CPU the test runs on.

The other orders run only where tdx is not already within `factor` times
the as-written run's distance (that bound is the smaller one, so the
verdict is the same, and a well-conditioned test pays nothing).

    fp32, fp64 = eager_runs(model, optimizer, loop, data)
    assert_losses_near_float64(losses, fp32, fp64)
    assert_state_near_float64(state, fp32, fp64)
"""

import contextlib
import copy
import os
import sys
import warnings

import torch

FACTOR = 2.0
# Floors, relative to the float64 value: a few float32 epsilons for a loss
# (eager's own distance can be 0 by chance at a step), and for a tensor's
# norm.
LOSS_FLOOR = 1e-6
STATE_FLOOR = 1e-6
# ATen's threads for eager's reference runs where a test pins them (1, as
# each rank of a 2-rank tdx job runs); `scripts/test.sh portable` runs such
# tests again with TDX_TEST_THREADS=2.
EAGER_THREADS = int(os.environ.get("TDX_TEST_THREADS", "1"))
# Eager's own float32 summation orders: (ATen threads, oneDNN enabled,
# each batch's samples reversed).
ORDERS = [(threads, mkldnn, reverse) for threads in (1, 2) for mkldnn in (True, False)
          for reverse in (False, True)]


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


@contextlib.contextmanager
def summation_order(threads, mkldnn):
    """Eager under `threads` ATen threads, with oneDNN on or off (an
    order's reversed batches are reorder()'s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # flags() sets oneDNN's TF32 choice too (to its default, with a
        # warning that this torch has no Intel GPU); it is the one way in
        # once torch's test utilities disabled setting the flags directly.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "TF32 acceleration on top of oneDNN")
            with torch.backends.mkldnn.flags(enabled=mkldnn,
                                             deterministic=torch.backends.mkldnn.deterministic):
                yield
    finally:
        torch.set_num_threads(before)


def reorder(batch, blocks=1):
    """`batch` (a tuple of tensors and other values) with its samples in
    reverse order within each of `blocks` equal parts of dim 0 (the
    micro-batches or ranks a loop splits it into, so that each keeps its
    samples): the same step in exact arithmetic, with every sum over the
    batch (a loss's mean, batch norm's statistics, a weight's gradient)
    taken in another order."""
    size = next(t.size(0) for t in batch if torch.is_tensor(t) and t.dim() > 0)
    index = torch.arange(size).view(blocks, -1).flip(1).reshape(-1)
    return tuple(t[index] if torch.is_tensor(t) and t.dim() > 0 and t.size(0) == size else t
                 for t in batch)


class Run:
    """One eager run: the model after its steps, its optimizer, the per-step
    losses (Python floats) and its summation order. A float32 run made by
    eager_runs also knows how to make its siblings under the other orders
    (orders(), made on first use)."""

    def __init__(self, model, optimizer, losses, order, others=None, state=None):
        self.model, self.optimizer, self.losses, self.order = model, optimizer, losses, order
        self._others, self._made, self._state = others, None, state

    def state(self):
        """Parameters, buffers and optimizer state by the names tdx's state
        has ("optimizer.<parameter>.<key>" for the optimizer's)."""
        if self._state is not None:
            return self._state
        out = dict(self.model.named_parameters())
        out.update(self.model.named_buffers())
        names = {id(p): n for n, p in self.model.named_parameters()}
        for p, entries in self.optimizer.state.items():
            for key, t in entries.items():
                if torch.is_tensor(t) and t.dim() > 0:
                    out[f"optimizer.{names[id(p)]}.{key}"] = t
        return {n: t.detach() for n, t in out.items()}

    def orders(self):
        """This run and eager's same loop under every other order of
        ORDERS: the measured spread of float32 on this problem."""
        if self._made is None:
            self._made = [self] + (self._others() if self._others else [])
        return self._made


@contextlib.contextmanager
def grouped_mm_in(dtype):
    """Hugging Face's MoE experts in `dtype`: torch's grouped_mm has no
    float64 kernel, so the float64 reference takes transformers' own
    fallback (a matmul per expert over the same sorted rows, exact)."""
    moe = sys.modules.get("transformers.integrations.moe")
    choice = getattr(moe, "_can_use_grouped_mm", None)
    if choice is None or dtype != torch.float64:
        yield
        return
    moe._can_use_grouped_mm = lambda *args, **kwargs: False
    try:
        yield
    finally:
        moe._can_use_grouped_mm = choice


def eager_runs(model, make_optimizer, loop, data, blocks=1):
    """Eager's loop in float32 on `model` (as built, untouched before) and
    in float64 on an exact float64 copy of it, each with its own optimizer
    from make_optimizer(parameters). loop(model, optimizer, data) runs the
    steps and returns the losses; the float64 run gets `data` with its
    floating-point tensors in float64. Returns (fp32, fp64) Runs; fp32's
    orders() runs the same loop again in float32 under the other
    summation orders, from the same weights and random state. `blocks`:
    the parts the loop splits each batch into (its micro-batches), whose
    samples a reversed order keeps together."""
    start, wide, rng = copy.deepcopy(model), in_float64(model), torch.get_rng_state()
    here = (torch.get_num_threads(), torch.backends.mkldnn.enabled, False)

    def run(m, dtype, order, others=None):
        optimizer = make_optimizer(m.parameters())
        batches = [batch_in(dtype, reorder(b, blocks) if order[2] else b) for b in data]
        with grouped_mm_in(dtype):
            losses = loop(m, optimizer, batches)
        return Run(m, optimizer, [float(x) for x in losses], order, others)

    def others():
        made = []
        for order in other_orders(here)[1:]:
            torch.set_rng_state(rng)
            with summation_order(*order[:2]):
                made.append(run(copy.deepcopy(start), torch.float32, order))
        return made

    return run(model, torch.float32, here, others), run(wide, torch.float64, here)


def peer_runs(runs):
    """A peer's float32 runs of one loop under several summation orders
    (DDP's, in its own processes), as [(order, losses, state dict)], the
    order it runs as written first: a Run whose orders() are them."""
    made = [Run(None, None, losses, order, state=state) for order, losses, state in runs]
    made[0]._others = lambda: made[1:]
    return made[0]


def other_orders(here):
    """ORDERS with the order `here` (threads, oneDNN enabled, reversed)
    first."""
    return [here] + [o for o in ORDERS if o != here]


def _losses_of(run):
    return run.losses if isinstance(run, Run) else run


def _orders_of(run):
    """The float32 samples of a reference: a Run's orders, or the one run
    given as plain losses or a state dict (a peer such as DDP's)."""
    return run.orders() if isinstance(run, Run) else [run]


def assert_losses_near_float64(got, fp32, fp64, what="loss", factor=FACTOR, floor=LOSS_FLOOR):
    """Each step's loss `got` (tdx's) within factor x float32's distance
    from float64 eager's loss, plus floor relative. fp32 and fp64 are Runs
    of eager_runs (or plain lists of losses, for a peer's single run).
    Float32's distance at a step is the largest of any of its summation
    orders' at that step or before (rounding's effect grows over a chaotic
    run; one order's distance at one step can pass near 0)."""
    ref = _losses_of(fp64)
    assert len(got) == len(_losses_of(fp32)) == len(ref), (len(got), len(_losses_of(fp32)),
                                                           len(ref))

    def first_failure(samples):
        scale = 0.0
        for k, (g, r) in enumerate(zip(got, ref)):
            scale = max([scale] + [abs(_losses_of(s)[k] - r) for s in samples])
            err, allowed = abs(g - r), factor * scale + floor * abs(r)
            if not err <= allowed:
                return (f"step {k}: {what} {g} is {err:.2e} ({err / abs(r):.1e} relative) from "
                        f"float64 eager's {r}; float32 eager's under {len(samples)} summation "
                        f"order(s) {[_losses_of(s)[k] for s in samples]} are up to {scale:.2e} "
                        f"from it (the largest so far); allowed {factor:g} x that + {floor:.0e} "
                        f"relative = {allowed:.2e}")
        return None

    if first_failure([_losses_of(fp32)]) is not None:
        failure = first_failure(_orders_of(fp32))
        assert failure is None, failure


def distances(got_state, fp32_state, fp64_state, names=None):
    """Per tensor name: (|got - fp64|, |fp32 - fp64|, |fp64|), Frobenius
    norms in float64."""
    out = {}
    for name in names if names is not None else fp64_state:
        ref = fp64_state[name].double()
        out[name] = ((got_state[name].double() - ref).norm().item(),
                     (fp32_state[name].double() - ref).norm().item(), ref.norm().item())
    return out


def _state_of(run):
    return run.state() if isinstance(run, Run) else run


def assert_state_near_float64(got_state, fp32, fp64, names=None, what="final state",
                              factor=FACTOR, floor=STATE_FLOOR):
    """Every tensor `names` (default: every one of fp64's state) of tdx's
    final state (or other tensors by name: `what` they are) within factor x
    float32's distance from float64 eager's (Frobenius norms), plus floor x
    the float64 tensor's norm. fp32 and fp64 are Runs of eager_runs (or
    state dicts, for a peer's single run); float32's distance is the
    largest of its summation orders'. A tensor's norm of distances is
    stable where a single loss's distance is not: no running scale.
    Integer tensors (num_batches_tracked) must be equal."""
    ref_state = _state_of(fp64)
    failures = []
    for name in names if names is not None else ref_state:
        ref = ref_state[name]
        if not ref.is_floating_point():
            if not torch.equal(got_state[name].to(ref.dtype), ref):
                failures.append(f"{name}: {got_state[name]} vs {ref}")
            continue
        [(err, eager_err, size)] = distances(got_state, _state_of(fp32), ref_state,
                                             [name]).values()
        if err <= factor * eager_err + floor * size:
            continue
        spread = [distances(got_state, _state_of(s), ref_state, [name])[name][1]
                  for s in _orders_of(fp32)]
        allowed = factor * max(spread) + floor * size
        # What the bound came from, in the test's output (pytest -rP).
        print(f"reference: {name}: {err:.2e} from float64 eager's, float32's {len(spread)} "
              f"orders {min(spread):.2e} to {max(spread):.2e}, allowed {allowed:.2e}")
        if not err <= allowed:
            failures.append(
                f"{name}: {err:.2e} ({err / max(size, 1e-30):.1e} relative) from float64 eager's; "
                f"float32 eager's under {len(spread)} summation order(s) "
                f"{', '.join(f'{d:.2e}' for d in spread)} (up to "
                f"{max(spread) / max(size, 1e-30):.1e} relative); allowed {allowed:.2e}")
    assert not failures, f"{what} off float64 eager's by more than float32's spread " \
                         f"{factor:g} x + {floor:.0e}:\n  " + "\n  ".join(failures)
