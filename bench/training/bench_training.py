"""A whole training step (forward, backward, AdamW update) of one GPT-style
model, tdx next to its peers, in one run:

  - torch eager with torch.optim.AdamW, one process (the oracle and the
    1-rank baseline);
  - torch.nn.parallel.DistributedDataParallel on torch.distributed's gloo
    backend, 2 processes, each on half the batch (the data-parallel peer);
  - the tdx binary of tdx.trace_train_step (tdx.compile) under mpirun on 1
    rank and data parallel on 2 ranks (one gradient all_reduce each, as DDP).

Every process uses one ATen thread (2 cores here). A step time is the mean of
--steps steps after one warm-up step, best of --rounds rounds that alternate
between the three. Losses of the last round are checked against eager's.

    . build/env.sh && /usr/bin/python3 bench/training/bench_training.py [--steps 10]
"""

import argparse
import os
import sys
import time

os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import tdx  # noqa: E402
from gpt_2x2 import GPT  # noqa: E402

CONFIG = dict(vocab=512, d=128, heads=4, layers=4, context=64)
BATCH, SEQ = 8, 64


def model():
    torch.manual_seed(0)
    return GPT(**CONFIG)


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=False)


def loss_fn(m, ids, targets):
    logits = m(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, CONFIG["vocab"], (BATCH, SEQ), generator=g),
             torch.randint(0, CONFIG["vocab"], (BATCH, SEQ), generator=g)) for _ in range(n)]


def eager(data):
    torch.set_num_threads(1)
    m = model()
    opt = optimizer(m.parameters())
    losses, t0 = [], None
    for k, batch in enumerate(data):
        if k == 1:
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(m, *batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return (time.perf_counter() - t0) * 1e3 / (len(data) - 1), losses


def ddp_worker(rank, world, data, port, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    m = torch.nn.parallel.DistributedDataParallel(model())
    opt = optimizer(m.parameters())
    t0 = None
    for k, (ids, targets) in enumerate(data):
        if k == 1:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(m, ids.chunk(world)[rank], targets.chunk(world)[rank]).backward()
        opt.step()
    dist.barrier()
    if rank == 0:
        out.put((time.perf_counter() - t0) * 1e3 / (len(data) - 1))
    dist.destroy_process_group()


def ddp(data, world, port):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(ddp_worker, args=(world, data, port, out), nprocs=world, join=True)
    return out.get()


def compile_tdx(world):
    torch.manual_seed(0)
    deferred = tdx.deferred_init(lambda: GPT(**CONFIG))
    prog = tdx.trace_train_step(deferred, optimizer(deferred.parameters()), loss_fn,
                                *batches(1)[0])
    if world > 1:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (world,), ("dp",)), {},
                        data_parallel="dp")
    t0 = time.perf_counter()
    exe = tdx.compile(prog)
    return exe, time.perf_counter() - t0


def run_tdx(exe, data, weights):
    losses, _ = exe.train(data, params=weights, verbose=True)
    return exe.last_step_ms(), losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = batches(args.steps + 1)
    weights = {k: v.detach() for k, v in model().state_dict().items()}
    exes = {w: compile_tdx(w) for w in (1, 2)}
    best = {}
    port = 29600
    for _ in range(args.rounds):
        e_ms, want = eager(data)
        best["eager"] = min(best.get("eager", e_ms), e_ms)
        for world, (exe, _) in exes.items():
            ms, got = run_tdx(exe, data, weights)
            best[f"tdx{world}"] = min(best.get(f"tdx{world}", ms), ms)
            worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
            assert worst < 1e-4, f"tdx on {world} rank(s): loss off eager's by {worst:.2e}"
        port += 1
        g_ms = ddp(data, 2, port)
        best["ddp2"] = min(best.get("ddp2", g_ms), g_ms)
    print(f"GPT {CONFIG}, batch {BATCH}x{SEQ}, AdamW, {args.steps} steps x best of "
          f"{args.rounds} rounds, 1 ATen thread per process")
    print(f"tdx compile: {exes[1][1]:.1f} s (1 rank), {exes[2][1]:.1f} s (dp2)")
    print(f"{'ranks':>5} | {'tdx ms':>8} | {'peer':>12} {'peer ms':>8} | {'peer/tdx':>8}")
    print(f"{1:>5} | {best['tdx1']:>8.2f} | {'torch eager':>12} {best['eager']:>8.2f} | "
          f"{best['eager'] / best['tdx1']:>8.2f}")
    print(f"{2:>5} | {best['tdx2']:>8.2f} | {'DDP gloo':>12} {best['ddp2']:>8.2f} | "
          f"{best['ddp2'] / best['tdx2']:>8.2f}")


if __name__ == "__main__":
    main()
