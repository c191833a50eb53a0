"""User-written communication three ways in one SPMD job: tdx.mpi eagerly,
the same calls compiled (tdx.trace / tdx.trace_train_step of tdx.mpi, run
from the runner), and torch.distributed on gloo; ms per step and bytes each
rank sends, side by side with the ratios.

    python3 bench/mpi/bench_mpi.py [--ranks 2] [--steps 30] [--rounds 3]

(launches itself under python3 -m tdx.run). Workloads:
  linreg   mpi4torch's linear-regression loss (Allreduce of the
           parameters and of the loss) and its backward, 10000 points
  ring     a hand-written ring all-reduce of 1M float32 (N-1 Isend/Irecv
           steps passing the tensor around, written once for every rank)
  library  the library's all-reduce of the same tensor (Allreduce /
           dist.all_reduce)
Compiled, linreg is a training step (SGD at lr 0, so every step is the
same) and ring and library are a traced forward of the same function; each
call passes its inputs to the model binary. tdx.mpi's bytes are its
runtime's count: payloads plus its check that every rank made the same call
(one all-gather of 128 bytes a rank per collective; messages carry 24 bytes
of header, not counted); the compiled program's are its comm report's
(payloads of the collectives it runs, no checks: they ran at trace time);
gloo's are the calls' payloads.
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import arguments, setup  # noqa: E402

setup()
args = arguments(__doc__, steps=30, rounds=3, ranks="2")

if "OMPI_COMM_WORLD_RANK" not in os.environ:
    store = f"/tmp/tdx-bench-mpi-{os.getpid()}"
    done = subprocess.run([sys.executable, "-m", "tdx.run", "-n", args.ranks, __file__,
                           "--steps", str(args.steps), "--rounds", str(args.rounds),
                           "--ranks", args.ranks], env=dict(os.environ, TDX_BENCH_STORE=store))
    if os.path.exists(store):
        os.remove(store)
    sys.exit(done.returncode)

import warnings  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.nn.functional as dnn  # noqa: E402

import tdx  # noqa: E402
import tdx.mpi as mpi4torch  # noqa: E402

torch.set_num_threads(1)
warnings.filterwarnings("ignore", category=FutureWarning)   # torch.distributed.nn's notice
rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"file://{os.environ['TDX_BENCH_STORE']}",
                        rank=rank, world_size=size)
comm = mpi4torch.COMM_WORLD

torch.manual_seed(0)
share = 10000 // size
x = 2.0 * torch.rand(10000, dtype=torch.double)[rank * share:(rank + 1) * share]
y = (-2.0 * x + 1.0) * x + 0.1
c0 = torch.arange(3, dtype=torch.double)


def quadratic(inp, c):
    return (c[2] * inp + c[1]) * inp + c[0]


def linreg_tdx():
    c = c0.clone().requires_grad_()
    p = comm.Allreduce(c, mpi4torch.MPI_SUM) / size
    loss = comm.Allreduce(torch.sum(torch.square(y - quadratic(x, p))), mpi4torch.MPI_SUM)
    loss.backward()
    return c.grad


def linreg_gloo():
    c = c0.clone().requires_grad_()
    p = dnn.all_reduce(c) / size
    loss = dnn.all_reduce(torch.sum(torch.square(y - quadratic(x, p))))
    loss.backward()
    return c.grad


BIG = torch.randn(1 << 20)


def ring(send, recv, wait, right, left):
    """A ring all-reduce as one program for every rank: N-1 steps, each
    passing the last value received to the right and adding the one from
    the left (no chunk indexed by this rank, so it compiles as written)."""
    acc, msg = BIG.clone(), BIG
    for step in range(size - 1):
        s = send(msg, right, step)
        got = recv(torch.empty_like(msg), left, step)
        wait(s)
        msg = wait(got)
        acc = acc + msg
    return acc


def ring_tdx():
    return ring(comm.Isend, comm.Irecv,
                lambda h: comm.Wait(h) if isinstance(h, mpi4torch.WaitHandle) else h,
                (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size)


def ring_gloo():
    def send(t, peer, tag):
        return dist.isend(t.contiguous(), peer, tag=tag)

    def recv(t, peer, tag):
        return (dist.irecv(t, peer, tag=tag), t)

    def wait(h):
        if isinstance(h, tuple):
            h[0].wait()
            return h[1]
        h.wait()
    return ring(send, recv, wait, (rank + 1) % size, (rank - 1) % size)


def library_tdx():
    return comm.Allreduce(BIG, mpi4torch.MPI_SUM)


def library_gloo():
    t = BIG.clone()
    dist.all_reduce(t)
    return t


# -- the same calls compiled --------------------------------------------------

class Quadratic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Parameter(torch.zeros(3, dtype=torch.double))


def linreg_loss(model, x, y):
    p = comm.Allreduce(model.c, mpi4torch.MPI_SUM) / size
    return comm.Allreduce(torch.sum(torch.square(y - quadratic(x, p))), mpi4torch.MPI_SUM)


class Traced(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.register_buffer("unused", torch.zeros(1))   # tdx.trace takes a model with state

    def forward(self, x):
        return self.fn(x)


def ring_of(x):
    global BIG
    saved, BIG = BIG, x
    try:
        return ring_tdx()
    finally:
        BIG = saved


def compiled(kind):
    """(a runner's call, the compiled program's bytes a rank sends per step)."""
    if kind == "linreg":
        model = tdx.deferred_init(Quadratic)
        prog = tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.0),
                                    linreg_loss, x, y)
        inputs, params = (x, y), {"c": c0}
    else:
        fn = ring_of if kind == "ring" else lambda t: comm.Allreduce(t, mpi4torch.MPI_SUM)
        prog = tdx.trace(tdx.deferred_init(Traced, fn), BIG)
        inputs, params = (BIG,), {}
    sent = sum(c["bytes"] for c in prog.comm_report())
    runner = tdx.compile(prog).start(params=params, local=True)
    return (lambda: runner(*inputs)), runner, sent


ring_bytes = (size - 1) * BIG.numel() * 4
WORKLOADS = {
    "linreg": (linreg_tdx, linreg_gloo, 2 * 8 + 3 * 8 * 2),   # fwd 3+1 doubles, bwd the same
    "ring": (ring_tdx, ring_gloo, ring_bytes),
    "library": (library_tdx, library_gloo, None),
}


def timed(f):
    best = float("inf")
    for _ in range(args.rounds):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            f()
        best = min(best, (time.perf_counter() - start) / args.steps * 1e3)
    return best


rows = []
for name, (mine, peer, gloo_bytes) in WORKLOADS.items():
    assert torch.allclose(mine(), peer(), rtol=1e-5, atol=1e-5), name   # same numbers
    sent = comm.bytes_sent
    mine()
    tdx_bytes = comm.bytes_sent - sent
    step, runner, compiled_bytes = compiled(name)
    if name != "linreg":
        assert torch.allclose(step(), peer(), rtol=1e-5, atol=1e-5), name
    rows.append((name, timed(mine), timed(step), timed(peer), tdx_bytes, compiled_bytes,
                 gloo_bytes))
    runner.close()

if rank == 0:
    print(f"user-written communication, {size} ranks, best of {args.rounds} x {args.steps} "
          f"steps: tdx.mpi eager, the same calls compiled, torch.distributed on gloo")
    print(f"{'workload':9} {'eager ms':>9} {'compiled':>9} {'gloo ms':>8} {'eager/gloo':>11} "
          f"{'comp/gloo':>10} {'comp/eager':>11} {'B eager':>9} {'B comp':>9} {'B gloo':>9}")
    for name, a, c, b, tb, cb, gb in rows:
        print(f"{name:9} {a:9.3f} {c:9.3f} {b:8.3f} {a / b:11.2f} {c / b:10.2f} {c / a:11.2f} "
              f"{tb:9d} {cb:9d} {gb if gb is not None else '-':>9}")
    print(json.dumps({"bench": "mpi", "ranks": size,
                      "rows": [dict(zip(("workload", "eager_ms", "compiled_ms", "gloo_ms",
                                         "eager_bytes", "compiled_bytes", "gloo_bytes"), r))
                               for r in rows]}))
dist.destroy_process_group()
