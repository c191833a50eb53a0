"""The op-by-op end-to-end suite (cases in e2e_cases.py): every case is
traced alone (it must produce its op), then all cases run together as one
program on each backend, case by case against eager PyTorch:

- reference: the reference executor on the dp2-partitioned program;
- cpu: the CPU model binary on 1 rank;
- cpu-dp2: the CPU binary on 2 ranks, each case's first input split on
  its dim 0 (the sharding passes place the rest);
- cuda-compile: the CUDA emission of the 1-rank program, compiled by nvcc
  (there is no GPU here).

The run prints each backend's count and the expected-failure table."""

import functools
import os
import re
import shutil

import pytest
import torch

import tdx
from e2e_cases import BACKEND, CASES, NOT_CAPTURED, STRUCTURAL, XFAIL
from test_partition_numerics import run_partitioned

NAMES = sorted(CASES)


class Suite(torch.nn.Module):
    """Cases in one forward, inputs and outputs concatenated in case order:
    `table[name]` is a case (its `inputs`, and called on them its outputs
    as a tuple); test_opinfo.py's cases run this way too."""

    def __init__(self, names, table=CASES):
        super().__init__()
        self.names, self.table = names, table
        self.register_buffer("unused", torch.zeros(1))

    def forward(self, *xs):
        out, i = [], 0
        for name in self.names:
            case = self.table[name]
            out.extend(case(*xs[i:i + len(case.inputs)]))
            i += len(case.inputs)
        return tuple(out)


def eager_outputs(names):
    return {name: CASES[name](*CASES[name].inputs) for name in names}


def flat_inputs(names):
    return [x for name in names for x in CASES[name].inputs]


def split(outputs, names, eager):
    out, i = {}, 0
    for name in names:
        n = len(eager[name])
        out[name] = tuple(outputs[i:i + n])
        i += n
    return out


def compare(got, want):
    """None when every output matches eager (1e-5 relative for floats,
    exact otherwise), else what differs."""
    for k, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k}: {g.dtype}{list(g.shape)} instead of {w.dtype}{list(w.shape)}"
        if w.is_floating_point():
            err = ((g - w).norm() / w.norm().clamp_min(1e-30)).item()
            if not err < 1e-5:
                return f"output {k}: relative error {err:.3g}"
        elif not torch.equal(g, w):
            return f"output {k}: differs from eager"
    return None


@functools.lru_cache(maxsize=None)
def program(names, dp):
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(Suite, names), *flat_inputs(names))
    if dp:
        # Each case's first input split on its dim 0, the others replicated.
        mesh, i = tdx.init_device_mesh("cpu", (2,), ("dp",)), 0
        for name in names:
            prog.annotate(f"input:{i}", mesh, [tdx.Shard(0)])
            i += len(CASES[name].inputs)
    return prog


def run_backend(backend, names):
    """case -> None (passed) or the failure, for every case in `names`."""
    eager = eager_outputs(names)
    try:
        if backend == "cuda-compile":
            tdx.compile(program(names, False), target="cuda")
            return {n: None for n in names}
        if backend == "reference":
            prog = tdx.Program(program(names, True).mlir)
            got = run_partitioned(prog, {}, flat_inputs(names))
        else:
            exe = tdx.compile(program(names, backend == "cpu-dp2"))
            got = exe.run(*flat_inputs(names))
    except Exception as e:  # the whole program failed: find the cases at fault
        if len(names) > 1:
            out = {}
            for n in names:
                out.update(run_backend(backend, (n,)))
            return out
        return {names[0]: f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"}
    return {n: compare(g, eager[n]) for n, (g) in split(got, names, eager).items()}


@functools.lru_cache(maxsize=None)
def results(backend):
    if backend == "cuda-compile" and not shutil.which("nvcc") and \
            not os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("no nvcc on this machine")
    return run_backend(backend, tuple(NAMES))


def dialect_ops():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "dialect.md")
    return sorted(set(re.findall(r"^### `(tdx\.\w+)`", open(path).read(), re.M)))


def test_every_dialect_op_has_a_case():
    missing = [op for op in dialect_ops()
               if op not in CASES and op not in NOT_CAPTURED and op not in STRUCTURAL
               and op not in BACKEND]
    assert not missing, (f"tdx ops without an e2e case: {missing}; add one to "
                         f"test/python/e2e_cases.py (or say in NOT_CAPTURED why none can exist)")
    stale = [op for op in list(NOT_CAPTURED) + list(STRUCTURAL) + list(BACKEND)
             if op not in dialect_ops()]
    assert not stale, f"e2e_cases.py names ops the dialect no longer has: {stale}"


def test_every_compute_op_has_a_sharding_rule():
    # The registry as the dialect registers it (ODS): an op that computes
    # needs a sharding rule, or propagation cannot place it.
    ops = dict(tdx._C.dialect_ops())
    assert set(ops) == set(dialect_ops()), "docs/dialect.md and the registered ops differ"
    missing = [op for op, has_rule in ops.items()
               if not has_rule and op not in STRUCTURAL and op not in BACKEND
               and op != "tdx.aten"]
    assert not missing, (f"tdx ops without a sharding rule: {missing}; declare it with "
                         f"Tdx_HasShardingRule and write it in dialects/ShardingRules.cpp")


@pytest.mark.parametrize("name", NAMES)
def test_case_captures_its_op(name):
    case = CASES[name]
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(Suite, (name,)), *case.inputs)
    # What the backends see: tdx-compile canonicalizes first (it folds
    # matmul + bias into tdx.linear).
    forward = prog.run_pipeline("canonicalize").mlir.split("func.func @forward", 1)[1]
    if name.startswith("tdx."):
        assert re.search(rf"\b{re.escape(name)}\b", forward), f"{name} is not in:\n{forward}"
    assert "tdx.aten" not in forward, f"{name} leaves a generic op:\n{forward}"


@pytest.mark.parametrize("backend", sorted(XFAIL))
@pytest.mark.parametrize("name", NAMES)
def test_case_on_backend(name, backend, request):
    failure = results(backend)[name]
    # For the summary table (conftest.py), which reads it from the report
    # wherever reports arrive.
    request.node.user_properties.append(("e2e", (backend, name, failure or "pass")))
    why = XFAIL[backend].get(name)
    if why:
        assert failure, f"{name} passes on {backend} but is in XFAIL[{backend!r}]: remove it"
        pytest.xfail(why)
    assert failure is None, f"{name} on {backend}: {failure}"
