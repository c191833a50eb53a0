"""tdx.mpi's calls compiled, against the same calls run eagerly in the same
job. Every rank runs it under ``python3 -m tdx.run -n N``:

    mpi_compiled_script.py CASES OUT

For each case (comma-separated names of CASES below, or ``all``), a
one-parameter model ``p`` (float64, the same on every rank) and this rank's
inputs ``x`` (shifts the value, so MAX/MIN/PROD have no ties) and ``w`` (a
random output gradient) give the loss ``weighted(CALL(p + x), w)``. Eagerly
its gradient comes from ``loss.backward()`` on tdx.mpi; compiled, from one
step of ``tdx.trace_train_step`` with SGD at lr 1 (``p - p'``), read back on
every rank by an added entry that all-gathers ``p'``. Then ``closed`` runs
mpi4torch's closed-form cases (w = 1, x = 0; ``ring10m`` its ring test at its
10M doubles) and ``linreg`` trains a linear
model whose loss two Allreduces make global, 4 steps, compiled vs eager.
Rank 0 writes {case: {...}} to OUT as JSON."""

import json
import sys

import torch

import tdx
import tdx.mpi as mpi4torch

comm = mpi4torch.COMM_WORLD
n, rank = comm.size, comm.rank
ROWS = 2 * n

CASES = {
    "allreduce_sum": lambda v: comm.Allreduce(v, mpi4torch.MPI_SUM),
    "allreduce_max": lambda v: comm.Allreduce(v, mpi4torch.MPI_MAX),
    "allreduce_min": lambda v: comm.Allreduce(v, mpi4torch.MPI_MIN),
    "allreduce_prod": lambda v: comm.Allreduce(v, mpi4torch.MPI_PROD),
    "bcast": lambda v: comm.Bcast_(v, n - 1),
    "reduce": lambda v: comm.Reduce_(v, mpi4torch.MPI_SUM, 0),
    "gather": lambda v: comm.Gather(v, 1, 0),
    "allgather": lambda v: comm.Allgather(v, 0),
    "scatter": lambda v: comm.Scatter(v, 0, ROWS // n, n - 1),
    "alltoall": lambda v: comm.Alltoall(v, 1, 0, ROWS // n),
    "ring": lambda v: ring(v),
}


def ring(v):
    """mpi4torch's non-blocking ring test: each rank sends to the next,
    receives from the previous, and scales what it got by its rank."""
    req = comm.Isend(v, (comm.rank + 1) % comm.size, 0)
    req2 = comm.Irecv(mpi4torch.JoinDummies(torch.empty_like(v), [req.dummy]),
                      (comm.rank + comm.size - 1) % comm.size, 0)
    res = comm.Wait(mpi4torch.JoinDummiesHandle(req, [req2.dummy]))
    res2 = comm.Wait(mpi4torch.JoinDummiesHandle(req2, [res]))
    return res2 * comm.rank


class One(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64))


def compiled_grad(call, p0, x, w):
    """The gradient of (call(p + x) * w).sum() on every rank, compiled."""
    def loss_fn(m, x, w):
        return weighted(call(m.p + x), w)
    model = tdx.deferred_init(One, p0.shape)
    prog = tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=1.0), loss_fn, x, w)
    prog.add_entry("gathered", lambda m, x: comm.Allgather(m.p.unsqueeze(0), 0), x)
    exe = tdx.compile(prog)
    with exe.start(params={"p": p0}, local=True) as runner:
        loss = runner.train_step(x, w)
        after = runner.gathered(x)
    return loss.item(), p0.unsqueeze(0) - after


def eager_grad(call, p0, x, w):
    p = p0.clone().requires_grad_()
    loss = weighted(call(p + x), w)
    loss.backward()
    return loss.item(), comm.Allgather(p.grad.unsqueeze(0), 0)


def weighted(out, w):
    """The sum of `out` weighted by the first entries of `w` (which is as
    large as the largest result, n times the input)."""
    return (out.reshape(-1) * w.reshape(-1)[:out.numel()]).sum()


def data(seed, shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


out = {}
names = list(CASES) if sys.argv[1] == "all" else sys.argv[1].split(",")
for name in names:
    if name == "closed":
        shape = (ROWS, 3)
        p0, x, w = data(1, shape), torch.zeros(shape, dtype=torch.float64), \
            torch.ones((n * ROWS, 3), dtype=torch.float64)
        got = {}
        for case in ("allreduce_sum", "bcast", "ring"):
            got[case] = compiled_grad(CASES[case], p0, x, w)[1][:, 0, 0].tolist()
        out["closed"] = got
        continue
    if name == "ring10m":
        # mpi4torch's test at its size: 10M doubles around the ring.
        big = 10_000_000
        p0 = torch.zeros(big, dtype=torch.float64)   # p - p' is then the gradient exactly
        grad = compiled_grad(CASES["ring"], p0, torch.zeros(big, dtype=torch.float64),
                             torch.ones(big, dtype=torch.float64))[1]
        want = torch.tensor([(r + 1) % n for r in range(n)], dtype=torch.float64)
        out["ring10m"] = {"max_error": (grad - want[:, None]).abs().max().item(),
                          "elements": grad[0].numel()}
        continue
    if name == "linreg":
        # mpi4torch's linear regression, in the shape of a training step: each
        # rank's points, a global mean squared error from two Allreduces.
        def loss_fn(m, xs, ys):
            sq = comm.Allreduce(((m.lin(xs) - ys) ** 2).sum(), mpi4torch.MPI_SUM)
            count = comm.Allreduce(torch.tensor(float(xs.shape[0]), dtype=torch.float64),
                                   mpi4torch.MPI_SUM)
            return sq / count

        class Lin(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(3, 1, dtype=torch.float64)
        xs, ys = data(10 + rank, (8, 3)), data(20 + rank, (8, 1))
        torch.manual_seed(0)
        eager = Lin()
        start = {k: v.detach().clone() for k, v in eager.state_dict().items()}
        model = tdx.deferred_init(Lin)
        prog = tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn,
                                    xs, ys)
        exe = tdx.compile(prog)
        opt = torch.optim.SGD(eager.parameters(), lr=0.1)
        compiled_losses, eager_losses = [], []
        with exe.start(params=start, local=True) as runner:
            for _ in range(4):
                compiled_losses.append(runner.train_step(xs, ys).item())
                opt.zero_grad()
                loss = loss_fn(eager, xs, ys)
                loss.backward()
                opt.step()
                eager_losses.append(loss.item())
            state = runner.state_dict()
        out["linreg"] = {"compiled": compiled_losses, "eager": eager_losses,
                         "param_error": max((state[k] - v).abs().max().item()
                                            for k, v in eager.state_dict().items())}
        continue
    shape = (ROWS, 3)
    p0 = data(1, shape)
    x, w = data(100 + rank, shape) * 0.5, data(200 + rank, (n * ROWS, 3))
    c_loss, c_grad = compiled_grad(CASES[name], p0, x, w)
    e_loss, e_grad = eager_grad(CASES[name], p0, x, w)
    out[name] = {"loss": [c_loss, e_loss], "grad_error": (c_grad - e_grad).abs().max().item(),
                 "grad_scale": e_grad.abs().max().item()}
if rank == 0:
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
