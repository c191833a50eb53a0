"""A model written with torch's functional collectives, trained eagerly on
gloo and compiled by tdx from the same code, in one job:

    python3 -m tdx.run -n N funcol_script.py PORT GROUP OUT

GROUP: ``mesh`` (torch's DeviceMesh) or ``ranks`` (a list of every rank).
Each rank has its own rows; the block all-gathers them, reduce-scatters
the hidden activations, swaps them with an all-to-all and permutes the
result around the ring; the loss is all-reduced with
``torch.distributed.nn.functional``. 3 SGD steps each way; rank 0 writes
the losses and the largest parameter difference to OUT."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.nn.functional as dist_nn

import tdx

port, kind, out = sys.argv[1:4]
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
n = int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
if kind == "mesh":
    from torch.distributed.device_mesh import init_device_mesh
    group = init_device_mesh("cpu", (n,), mesh_dim_names=("dp",))
else:
    group = list(range(n))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(6, 4 * n)
        self.down = torch.nn.Linear(4 * n, 6)

    def forward(self, x):
        h = funcol.all_gather_tensor_autograd(x, 0, group)            # every rank's rows
        h = torch.tanh(self.up(h))
        h = funcol.reduce_scatter_tensor_autograd(h, "sum", 0, group)  # back to this rank's
        h = funcol.all_to_all_single_autograd(h, None, None, group)
        h = funcol.wait_tensor(h)
        return self.down(h)


def loss_fn(model, x, y):
    local = ((model(x) - y) ** 2).mean()
    return dist_nn.all_reduce(local) / n          # the default group: every rank


g = torch.Generator().manual_seed(rank)
batches = [(torch.randn(2 * n, 6, generator=g), torch.randn(2 * n, 6, generator=g))
           for _ in range(3)]
torch.manual_seed(0)
eager = Block()
start = {k: v.detach().clone() for k, v in eager.state_dict().items()}

model = tdx.deferred_init(Block)
prog = tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.2), loss_fn,
                            *batches[0])
exe = tdx.compile(prog)

opt = torch.optim.SGD(eager.parameters(), lr=0.2)
eager_losses, compiled_losses = [], []
for x, y in batches:
    opt.zero_grad()
    loss = loss_fn(eager, x, y)
    loss.backward()
    opt.step()
    eager_losses.append(loss.item())
with exe.start(params=start, local=True) as runner:
    for x, y in batches:
        compiled_losses.append(runner.train_step(x, y).item())
    state = runner.state_dict()
report = prog.comm_report() if rank == 0 else None
dist.destroy_process_group()
if rank == 0:
    with open(out, "w") as f:
        json.dump({"eager": eager_losses, "compiled": compiled_losses,
                   "param_error": max((state[k] - v).abs().max().item()
                                      for k, v in eager.state_dict().items()),
                   "collectives": sorted({c["kind"] for c in report})}, f)
