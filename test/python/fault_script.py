"""A data-parallel training job that saves a checkpoint after every step,
for test_cluster.py's faults: the MLP on dp2, SGD with momentum, step k
on batch k mod 4, from CKPT when it holds a checkpoint (on any host count:
it reshards), else from eager's start. Each step's rank 0 prints
{"step": k, "loss": L}; the ranks' collectives end in TIMEOUT seconds
when a peer is lost, stuck or cut off; every rank waits PACE seconds
after each step (default 0), so that a fault lands mid-run.

    fault_script.py CKPT STEPS TIMEOUT [PACE]"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tdx  # noqa: E402
from test_training import OPTIMIZERS, batches, full_state, mlp, mlp_loss  # noqa: E402

ckpt, steps, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
pace = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
data = batches("mlp")[:4]
torch.manual_seed(0)
deferred = tdx.deferred_init(mlp)
prog = tdx.trace_train_step(deferred, OPTIMIZERS["momentum"](deferred.parameters()), mlp_loss,
                            *data[0])
tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
exe = tdx.compile(prog)
torch.manual_seed(0)
start = {n: v.detach().clone() for n, v in full_state(mlp()).items()}
resume = os.path.exists(os.path.join(ckpt, "LATEST"))
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
with exe.start(params=ckpt if resume else start, timeout=timeout) as runner:
    for k in range(runner.steps, steps):
        x, y = data[k % len(data)]
        loss = runner.train_step(x, y).item()
        runner.save(ckpt, keep=2)
        if rank == 0:
            print(json.dumps({"step": k + 1, "loss": loss}), flush=True)
        time.sleep(pace)
