"""tdx.mpi (mpi4torch's API) eagerly, in SPMD jobs of 2, 3 and 4 ranks: the
closed forms of mpi4torch's own tests, every call's gradient against finite
differences of the whole job's function, the checks that name the ranks'
source lines, and mpi4torch's linear-regression recipe against one
process's eager fit. The cases are in mpi_script.py."""

import os

import pytest
import torch

from test_spmd import tdx_run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "mpi_script.py")
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "mpi_linear_regression.py")


def spmd(nprocs, script, *args, timeout=300):
    return tdx_run("-n", str(nprocs), script, *args, timeout=timeout,
                   env={"TDX_COLLECTIVE_TIMEOUT": "60"})


def case_names():
    names = []
    with open(SCRIPT) as f:
        previous = ""
        for line in f:
            if previous.strip() == "@case" and line.startswith("def "):
                names.append(line[4:line.index("(")])
            previous = line
    return names


@pytest.fixture(scope="module", params=[2, 3, 4])
def job(request):
    done, lines = spmd(request.param, SCRIPT)
    return request.param, done, lines


@pytest.mark.parametrize("name", case_names())
def test_case_on_every_rank(job, name):
    nprocs, done, lines = job
    results = {r["rank"]: r for r in lines if r.get("case") == name}
    assert sorted(results) == list(range(nprocs)), \
        f"ranks that reported {name}: {sorted(results)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for rank, r in sorted(results.items()):
        assert r["ok"], f"{name} on rank {rank} of {nprocs}:\n{r['detail']}"
    assert done.returncode == 0, done.stderr[-3000:]


def test_gradients_match_finite_differences_of_the_whole_job(job):
    nprocs, _, lines = job
    errors = [r["detail"] for r in lines if r.get("case") == "gradcheck_every_call" and r["ok"]]
    assert len(errors) == nprocs
    calls = set(errors[0])
    assert {"Allgather", "Scatter", "Alltoall", "Allreduce PROD", "Isend/Irecv/Wait"} <= calls
    worst = max(max(e.values()) for e in errors)
    print(f"tdx.mpi gradcheck on {nprocs} ranks: {len(calls)} calls, worst |analytic - "
          f"numeric| {worst:.2e}")
    assert worst < 1e-6


def test_a_mismatch_raises_the_same_error_on_every_rank(job):
    nprocs, _, lines = job
    texts = {r["rank"]: r["detail"] for r in lines
             if r.get("case") == "collectives_out_of_order_name_both_lines"}
    explained = {t[t.index("(rank 0"):] for t in texts.values()}
    assert len(explained) == 1, texts


def eager_fit():
    """The example's fit in one process, on every point."""
    torch.manual_seed(42)
    x = 2.0 * torch.rand(10000, dtype=torch.double)

    def quadratic(inp, c):
        return (c[2] * inp + c[1]) * inp + c[0]

    y = quadratic(x, torch.tensor([0.1, 1.0, -2.0], dtype=torch.double))
    c = torch.arange(3, dtype=torch.double).requires_grad_()
    optimizer = torch.optim.LBFGS([c], lr=1)

    def closure():
        optimizer.zero_grad()
        loss = torch.sum(torch.square(y - quadratic(x, c)))
        loss.backward()
        return loss
    optimizer.step(closure)
    return c.detach()


@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpi4torch_linear_regression(nprocs):
    done, lines = spmd(nprocs, EXAMPLE)
    assert done.returncode == 0, done.stderr[-3000:]
    (out,) = lines
    got = torch.tensor(out["coefficients"], dtype=torch.double)
    eager = eager_fit()
    # The ranks sum the loss in another order than one process: float64's
    # rounding, a few ulps per LBFGS step.
    assert torch.allclose(got, eager, rtol=1e-9, atol=1e-9), (got, eager)
    assert torch.allclose(got, torch.tensor([0.1, 1.0, -2.0], dtype=torch.double), atol=1e-5)
