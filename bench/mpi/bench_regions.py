"""A manual region beside tdx's own plan: one MLP block written as
tensor parallelism by hand (tdx.local_map, one funcol.all_reduce over tp)
and the same block placed by tdx from a plan (ColwiseParallel /
RowwiseParallel), both in a training step on a dp2 x tp2 mesh, from the
runner; and torch eager on one process. ms per step and bytes each rank
sends per step (the comm report), side by side with the ratios.

    . build/env.sh && "$TDX_PYTHON" bench/mpi/bench_regions.py [--steps 20] [--rounds 3]
"""

import os
import sys

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import arguments, ms_per_step, setup  # noqa: E402

setup()
args = arguments(__doc__, steps=20, rounds=3, hidden="1024", batch="64")
import tdx  # noqa: E402
from tdx import Replicate, Shard  # noqa: E402

MESH = tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp"))
D, H, B = 256, int(args.hidden), int(args.batch)


def body(x, w1, b1, w2):
    h = F.gelu(x @ w1.t() + b1)
    return funcol.all_reduce(h @ w2.t(), "sum", (MESH, "tp"))


class Block(torch.nn.Module):
    def __init__(self, manual):
        super().__init__()
        self.up = torch.nn.Linear(D, H)
        self.down = torch.nn.Linear(H, D, bias=False)
        self.head = torch.nn.Linear(D, 8)
        self.manual = manual

    def forward(self, x):
        if self.manual:
            h = tdx.local_map(body, out_placements=(Shard(0), Replicate()),
                              in_placements=((Shard(0), Replicate()), (Replicate(), Shard(0)),
                                             (Replicate(), Shard(0)), (Replicate(), Shard(1))),
                              mesh=MESH)(x, self.up.weight, self.up.bias, self.down.weight)
        else:
            h = self.down(F.gelu(self.up(x)))
        return self.head(torch.tanh(h))


def loss_fn(model, x, y):
    return F.mse_loss(model(x), y)


def data(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(B, D, generator=g), torch.randn(B, 8, generator=g)) for _ in range(n)]


def eager(batches):
    torch.manual_seed(0)
    model = Block(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        opt.zero_grad()
        loss_fn(model, *batch).backward()
        opt.step()
    return ms_per_step(step, batches), 0


def compiled(manual, batches):
    torch.manual_seed(0)
    deferred = tdx.deferred_init(lambda: Block(manual))
    prog = tdx.trace_train_step(deferred, torch.optim.SGD(deferred.parameters(), lr=0.01),
                                loss_fn, *batches[0])
    plan = {} if manual else {"up": tdx.ColwiseParallel(), "down": tdx.RowwiseParallel()}
    tdx.parallelize(prog, MESH, plan, data_parallel="dp")
    sent = sum(r["bytes"] for r in prog.comm_report())
    exe = tdx.compile(prog)
    torch.manual_seed(0)
    weights = {k: v.detach() for k, v in Block(False).state_dict().items()}
    with exe.start(params=weights, threads=1) as runner:
        return ms_per_step(lambda batch: runner.train_step(*batch).item(), batches), sent


batches = data(args.steps + 1)
rows = {"torch eager (1 process)": [], "tdx plan (Colwise/Rowwise)": [],
        "tdx region (local_map)": []}
for _ in range(args.rounds):
    rows["torch eager (1 process)"].append(eager(batches))
    rows["tdx plan (Colwise/Rowwise)"].append(compiled(False, batches))
    rows["tdx region (local_map)"].append(compiled(True, batches))
best = {k: min(v) for k, v in rows.items()}
print(f"MLP block {D}->{H}->{D}, batch {B}, SGD, dp2 x tp2, best of {args.rounds} rounds "
      f"of {args.steps} steps")
print(f"{'':30} {'ms/step':>9} {'bytes/step':>11}")
for k, (ms, sent) in best.items():
    print(f"{k:30} {ms:9.3f} {sent:11d}")
region, plan, torch_ms = best["tdx region (local_map)"], best["tdx plan (Colwise/Rowwise)"], \
    best["torch eager (1 process)"]
print(f"region / plan: time {region[0] / plan[0]:.2f}x, bytes {region[1] / max(plan[1], 1):.2f}x;"
      f" region / torch eager: time {region[0] / torch_ms[0]:.2f}x")
