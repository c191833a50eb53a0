"""tdx.mpi eagerly against torch.distributed on gloo, in one SPMD job: the
same user-written communication both ways, ms per step and bytes each rank
sends, side by side with the ratio.

    python3 bench/mpi/bench_mpi_eager.py [--ranks 2] [--steps 30] [--rounds 3]

(launches itself under python3 -m tdx.run). Workloads:
  linreg   mpi4torch's linear-regression loss (Allreduce of the
           parameters and of the loss) and its backward, 10000 points
  ring     a hand-written ring all-reduce of 1M float32 (Isend/Irecv of
           chunks: reduce-scatter then all-gather, 2(N-1) messages a rank)
  library  the library's all-reduce of the same tensor (Allreduce /
           dist.all_reduce)
tdx.mpi's bytes are its runtime's count: payloads plus its check that every
rank made the same call (one all-gather of 128 bytes a rank per collective;
messages carry 24 bytes of header, not counted); gloo's are the calls'
payloads. The compiled form of these calls (tdx.trace of tdx.mpi) is not
built yet: docs/mpi.md.
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


def ring(send, recv, wait):
    """The ring all-reduce every user writes: N-1 steps of reduce-scatter,
    N-1 of all-gather, each a send to the right and a receive from the left."""
    chunks = list(BIG.clone().chunk(size))
    right, left = (rank + 1) % size, (rank - 1) % size
    for step in range(2 * (size - 1)):
        out = (rank - step) % size
        into = (rank - step - 1) % size
        s = send(chunks[out], right, step)
        got = recv(torch.empty_like(chunks[into]), left, step)
        wait(s)
        got = wait(got)
        chunks[into] = chunks[into] + got if step < size - 1 else got
    return torch.cat(chunks)


def ring_tdx():
    return ring(comm.Isend, comm.Irecv,
                lambda h: comm.Wait(h) if isinstance(h, mpi4torch.WaitHandle) else h)


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
    return ring(send, recv, wait)


def library_tdx():
    return comm.Allreduce(BIG, mpi4torch.MPI_SUM)


def library_gloo():
    t = BIG.clone()
    dist.all_reduce(t)
    return t


ring_bytes = 2 * (size - 1) * BIG.numel() * 4 // size
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
    rows.append((name, timed(mine), timed(peer), tdx_bytes, gloo_bytes))

if rank == 0:
    print(f"tdx.mpi eager vs torch.distributed (gloo), {size} ranks, best of {args.rounds} x "
          f"{args.steps} steps")
    print(f"{'workload':10} {'tdx.mpi ms':>11} {'gloo ms':>9} {'ratio':>7} {'tdx B/rank':>11} "
          f"{'gloo B/rank':>12}")
    for name, a, b, tb, gb in rows:
        print(f"{name:10} {a:11.3f} {b:9.3f} {a / b:7.2f} {tb:11d} "
              f"{gb if gb is not None else '-':>12}")
    print(json.dumps({"bench": "mpi_eager", "ranks": size,
                      "rows": [dict(zip(("workload", "tdx_ms", "gloo_ms", "tdx_bytes",
                                         "gloo_bytes"), r)) for r in rows]}))
dist.destroy_process_group()
