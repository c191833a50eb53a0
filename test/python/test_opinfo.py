"""PyTorch's OpInfo samples through tdx (cases in opinfo_cases.py), against
eager, in four stages:

- forward: every op's first float32 sample, traced into one program with
  all the others, compiled once and run on 1 rank;
- forward-dp2: the same on 2 ranks, each op's first input (unless 0-D)
  split on its dim 0 (the sharding passes place the rest);
- backward: the sample's first floating tensor a parameter, one SGD step
  of a training step (tdx.trace_train_step) on sum(out * ramp), against
  autograd's gradient, all ops in one step on 1 rank;
- backward-dp2: that step with data_parallel="dp" on 2 ranks.

An op fails at its first stage that fails: tracing it alone, checking the
program it is in (tdx-compile --check, bisected to the ops at fault),
compiling and running (bisected the same way), or comparing. The run
prints each stage's counts, the time it took, and every failure with its
reason (conftest.py); an op that fails must be in XFAIL with why, and an op
in XFAIL that passes fails the test."""

import functools
import time

import pytest
import torch

import tdx
from opinfo_cases import STAGES, UNDEFINED_VALUES, XFAIL, cases
from test_e2e_ops import Suite

CASES, LEFT_OUT = cases()
BY_NAME = {c.name: c for c in CASES}
# Stage -> seconds it took (conftest.py prints them).
TIMES = {}


def _first_line(e):
    """The line of an exception that says what failed: a located error, a
    rank's "tdx:" message, or its last line."""
    lines = str(e).strip().splitlines() or [repr(e)]
    said = [line for line in lines if "error:" in line or line.lstrip().startswith("tdx")]
    return f"{type(e).__name__}: {(said or lines[-1:])[0].strip()[:300]}"


def invalid_ir(failure):
    """Whether a failure is an op that a tdx pass made and that fails its
    verifier (MLIR's "failed to verify", tdx's "does not verify" and "raising
    the captured aten ops failed")."""
    return any(s in failure for s in ("failed to verify", "does not verify",
                                      "raising the captured aten ops failed"))


def _compare(got, want, shape_only=False, tolerance=1e-5):
    """None when the outputs match eager's (`tolerance` relative on the
    finite values of floats and of both parts of complex numbers, the same
    non-finite values where eager has them, integers exactly), else what
    differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs instead of {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k}: {g.dtype}{list(g.shape)} instead of {w.dtype}{list(w.shape)}"
        if shape_only:
            continue
        if w.is_complex():  # both parts, as floats
            g, w = torch.view_as_real(g.resolve_conj()), torch.view_as_real(w.resolve_conj())
        if w.is_floating_point():
            finite = torch.isfinite(w)
            if not torch.equal(finite, torch.isfinite(g)) or \
                    not torch.equal(g[~finite].isnan(), w[~finite].isnan()) or \
                    not torch.equal(g[~finite & ~w.isnan()], w[~finite & ~w.isnan()]):
                return f"output {k}: non-finite values differ from eager's"
            a, b = g[finite].double(), w[finite].double()
            err = ((a - b).norm() / b.norm().clamp_min(1e-30)).item() if b.numel() else 0.0
            if not err < tolerance:
                return f"output {k}: relative error {err:.3g}"
        elif not torch.equal(g, w):
            return f"output {k}: differs from eager"
    return None


class Backward(torch.nn.Module):
    """Each case's parameter (its first floating input) as `p<k>`."""

    def __init__(self, names):
        super().__init__()
        self.names = names
        for k, name in enumerate(names):
            case = BY_NAME[name]
            self.register_parameter(f"p{k}", torch.nn.Parameter(
                torch.empty_like(case.inputs[case.param])))


def _others(case):
    return [x for i, x in enumerate(case.inputs) if i != case.param]


def _backward_loss(model, *xs):
    total, i = None, 0
    for k, name in enumerate(model.names):
        case = BY_NAME[name]
        others = list(xs[i:i + len(case.inputs) - 1])
        i += len(case.inputs) - 1
        inputs = others[:case.param] + [getattr(model, f"p{k}")] + others[case.param:]
        loss = case.loss(*inputs)
        total = loss if total is None else total + loss
    return total


LR = 0.5


def _eager_step(case):
    """The parameter after one SGD step (lr LR) on the case's loss, by
    autograd; None when the op has no backward here."""
    p = case.inputs[case.param].clone().requires_grad_()
    inputs = list(case.inputs)
    inputs[case.param] = p
    loss = case.loss(*inputs)
    if loss is None or not loss.requires_grad:
        return None
    grad, = torch.autograd.grad(loss, p, allow_unused=True)
    return (p - LR * grad).detach() if grad is not None else p.detach()


@functools.lru_cache(maxsize=None)
def _eager(stage_kind, name):
    case = BY_NAME[name]
    if stage_kind == "forward":
        return case(*case.inputs)
    try:
        return _eager_step(case)
    except Exception as e:
        return f"eager's backward fails: {_first_line(e)}"


def _program(stage, names):
    """The stage's program of the ops `names` (traced, placed)."""
    mesh = tdx.init_device_mesh("cpu", (2,), ("dp",)) if stage.endswith("dp2") else None
    torch.manual_seed(0)
    if stage.startswith("forward"):
        inputs = [x for n in names for x in BY_NAME[n].inputs]
        prog = tdx.trace(tdx.deferred_init(Suite, names, BY_NAME), *inputs)
        if mesh:  # each op's first input split on dim 0 (as test_e2e_ops does)
            i = 0
            for n in names:
                if BY_NAME[n].inputs[0].dim() >= 1:
                    prog.annotate(f"input:{i}", mesh, [tdx.Shard(0)])
                i += len(BY_NAME[n].inputs)
        return prog, inputs
    model = tdx.deferred_init(Backward, names)
    inputs = [x for n in names for x in _others(BY_NAME[n])]
    prog = tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=LR),
                                _backward_loss, *inputs)
    if mesh:
        tdx.parallelize(prog, mesh, {}, data_parallel="dp")
    return prog, inputs


def _run(stage, names):
    """Compiles and runs the stage's program of `names`: name -> None or the
    failure; raises when the program as a whole fails."""
    prog, inputs = _program(stage, names)
    # -O0: the backward's one program of 460 ops' steps compiles in 53 s
    # instead of 145 s at -O2.
    exe = tdx.compile(prog, progress=False, opt_level=0)
    nprocs = 2 if stage.endswith("dp2") else 1
    if stage.startswith("forward"):
        got, i, out = exe.run(*inputs, nprocs=nprocs), 0, {}
        for name in names:
            want = _eager("forward", name)
            out[name] = _compare(got[i:i + len(want)], want, name in UNDEFINED_VALUES)
            i += len(want)
        return out
    start = {f"p{k}": BY_NAME[n].inputs[BY_NAME[n].param] for k, n in enumerate(names)}
    _, state = exe.train([tuple(inputs)], params=start, nprocs=nprocs)
    # Parameters after the step within 1e-4, as the training tests compare.
    return {n: _compare((state[f"p{k}"],), (_eager("backward", n),), n in UNDEFINED_VALUES, 1e-4)
            for k, n in enumerate(names)}


def _bisect(attempt, names, step):
    """attempt(names) on all of them; where it raises, on halves, down to
    the ops at fault, whose failure is then "<step>: <the exception>"."""
    try:
        return attempt(names)
    except Exception as e:
        if len(names) == 1:
            return {names[0]: f"{step}: {_first_line(e)}"}
        half = len(names) // 2
        return {**_bisect(attempt, names[:half], step), **_bisect(attempt, names[half:], step)}


@functools.lru_cache(maxsize=None)
def results(stage):
    """op -> None (matches eager) or "<step>: failure", for every case the
    stage takes."""
    start = time.monotonic()
    kind = "forward" if stage.startswith("forward") else "backward"
    out, names = {}, []
    for case in CASES:
        if kind == "backward":
            want = _eager("backward", case.name) if case.param is not None else None
            if want is None or isinstance(want, str):
                continue  # no backward to check
        try:
            _program(stage, (case.name,))
        except Exception as e:
            out[case.name] = f"trace: {_first_line(e)}"
            continue
        names.append(case.name)

    def check(batch):
        _program(stage, batch)[0].check()
        return {}
    failed = _bisect(check, tuple(names), "check")
    out.update(failed)
    names = tuple(n for n in names if n not in failed)

    def run(batch):
        return {n: why and f"compare: {why}" for n, why in _run(stage, batch).items()}
    # The ops expected to fail run alone (one that fails at run time would
    # otherwise take the batch down, and bisecting it costs compiles).
    alone = tuple(n for n in names if n in XFAIL[stage])
    out.update(_bisect(run, tuple(n for n in names if n not in alone), "compile or run"))
    for name in alone:
        out.update(_bisect(run, (name,), "compile or run"))
    TIMES[stage] = time.monotonic() - start
    return out


# The dp2 stages compile as much again (about 40 s and 110 s here): they
# run with TDX_SLOW=1, which keeps the default suite within its budget.
@pytest.mark.parametrize("stage", [pytest.param(s, marks=pytest.mark.slow) if s.endswith("dp2")
                                   else s for s in STAGES])
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_opinfo(name, stage, request):
    got = results(stage)
    if name not in got:
        pytest.skip(f"{name} has no backward here (no floating input, or no differentiable "
                    f"output)")
    failure = got[name]
    request.node.user_properties.append(("opinfo", (stage, name, failure or "pass",
                                                    TIMES.get(stage))))
    why = XFAIL[stage].get(name)
    if why:
        assert failure, f"{name} passes {stage} but is in XFAIL[{stage!r}]: remove it"
        # Expected failures are refusals with a message; never wrong numbers,
        # and never an op a pass made that fails its verifier.
        assert not failure.startswith("compare:"), f"{name} on {stage}: wrong numbers: {failure}"
        assert not invalid_ir(failure), f"{name} on {stage}: a pass made invalid IR: {failure}"
        pytest.xfail(why)
    assert failure is None, f"{name} on {stage}: {failure}"
