"""An SPMD training script, as a user writes one: every rank runs it under
``mpirun -np N python3 spmd_script.py ...`` (or ``python3 -m tdx.run``),
compiles the step with an evaluation entry, starts a runner bound to the
MPI world and drives it from its own loop with a cosine schedule,
evaluating after every step. test_spmd.py runs it and checks rank 0's
losses, evaluations and final state against eager's loop.

    spmd_script.py MODEL MESH OUT [--local]

MODEL: mlp (SGD with momentum), gpt2 (tp2 Megatron plan, 2 micro-batches
per step) or resnet18 (torchvision's, test_runner.resnet18_step, evaluated
on a held-out batch); MESH: 1, dp2 or tp2; --local: each rank passes its
own rows."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tdx  # noqa: E402
from test_sharding import GPT2_PLAN  # noqa: E402
from test_training import GPT2, OPTIMIZERS, batches, full_state, lm_loss, mlp, mlp_loss  # noqa: E402

model, mesh, out = sys.argv[1:4]
local = "--local" in sys.argv
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
if model == "resnet18":
    # test_runner's ResNet-18 program; evaluation on a held-out batch.
    from test_runner import resnet18_case, resnet18_step  # noqa: E402
    exe, eager, _ = resnet18_step(mesh)
    _, _, data, held_out = resnet18_case()
    start = {k: v.clone() for k, v in eager.state_dict().items()}
    first = 3e-5
else:
    build, loss_fn = {"mlp": (mlp, mlp_loss), "gpt2": (GPT2, lm_loss)}[model]
    k = 2 if model == "gpt2" else 1
    data = batches(model)[:6]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    prog = tdx.trace_train_step(deferred, OPTIMIZERS["momentum"](deferred.parameters()), loss_fn,
                                *data[0], hyperparameters=("lr",), accumulation_steps=k)
    # Evaluation on the current weights: the loss of the first micro-batch.
    rows = data[0][0].shape[0] // k
    prog.add_entry("evaluate", loss_fn, data[0][0][:rows], data[0][1][:rows])
    if mesh != "1":
        axis = mesh[:2]
        dmesh = tdx.init_device_mesh("cpu", (2,), (axis,))
        if axis == "dp":
            tdx.parallelize(prog, dmesh, {}, data_parallel="dp")
        else:
            tdx.parallelize(prog, dmesh, GPT2_PLAN)
    exe = tdx.compile(prog)
    held_out = None
    torch.manual_seed(0)
    start = {n: v.detach().clone() for n, v in full_state(build()).items()}
    first = 0.05

# The schedule, as a user's loop has it: a torch scheduler on its optimizer.
sched_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=first)
schedule = torch.optim.lr_scheduler.CosineAnnealingLR(sched_opt, T_max=len(data))
losses, lrs, evals = [], [], []
with exe.start(params=start, local=local) as runner:
    assert runner.spmd
    for x, y in data:
        if local:  # this rank's rows: a DistributedSampler's share
            rows = x.shape[0] // 2
            x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        lrs.append(schedule.get_last_lr()[0])
        losses.append(runner.train_step(x, y, lr=schedule.get_last_lr()).item())
        if not local:
            evals.append(runner.evaluate(*(held_out or (x[:rows], y[:rows]))).item())
        sched_opt.step()
        schedule.step()
    state = runner.state_dict()
    steps = runner.steps
if rank == 0:
    torch.save({"losses": losses, "lrs": lrs, "evals": evals, "state": state, "steps": steps},
               out)
print(json.dumps({"rank": rank, "from_cache": exe.from_cache,
                  "library_from_cache": exe.library_from_cache}), flush=True)
