"""A data- and tensor-parallel training job as an SPMD script, for
test_cluster.py: GPT-2 on a 2x2 mesh (dp x tp, the Megatron plan), 3 SGD
steps from eager's start, run by ``python3 -m tdx.run`` on one host or
across hosts. Rank 0 writes the losses and the final state to OUT; every
rank prints its rank and host. With STORE (a networked tensor store), the
trained parameters are published there as key "gpt2".

    hosts_script.py OUT [STORE]"""

import json
import os
import socket
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tdx  # noqa: E402
from test_sharding import GPT2_PLAN  # noqa: E402
from test_training import GPT2, OPTIMIZERS, batches, full_state, lm_loss  # noqa: E402

out = sys.argv[1]
data = batches("gpt2")[:3]
torch.manual_seed(0)
deferred = tdx.deferred_init(GPT2)
prog = tdx.trace_train_step(deferred, OPTIMIZERS["momentum"](deferred.parameters()), lm_loss,
                            *data[0])
tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp")), GPT2_PLAN,
                data_parallel="dp")
exe = tdx.compile(prog)
torch.manual_seed(0)
start = {n: v.detach().clone() for n, v in full_state(GPT2()).items()}
with exe.start(params=start) as runner:
    losses = [runner.train_step(x, y).item() for x, y in data]
    state = runner.state_dict(optimizer=True)
    if len(sys.argv) > 2:
        runner.publish(sys.argv[2], "gpt2")
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
if rank == 0:
    torch.save({"losses": losses, "state": state}, out)
print(json.dumps({"rank": rank, "host": socket.gethostname()}), flush=True)
