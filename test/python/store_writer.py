"""The writer of test_store_network.py's concurrent-readers test, an SPMD
script (``python3 -m tdx.run -n 2``): an MLP trained data-parallel, one
step per version, published with ``runner.publish(store, "w", keep=1)``
(each rank puts its shards on its host's volume; every older version is
dropped once a newer one commits). After each publish rank 0 waits until
every reader has seen a new state, so that every version is read while
the next one is written; at the end it writes the SHA-1 of every tensor
of every version to FOLDER/written.json and makes FOLDER/done.

    store_writer.py STORE FOLDER VERSIONS READERS"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tdx  # noqa: E402
from store_reader import hashes  # noqa: E402

store, folder, versions, readers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 256))


torch.manual_seed(0)
deferred = tdx.deferred_init(mlp)
prog = tdx.trace_train_step(deferred, torch.optim.SGD(deferred.parameters(), lr=0.1),
                            lambda m, x: m(x).square().mean(), torch.randn(8, 256))
tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
exe = tdx.compile(prog)
torch.manual_seed(0)
start = {k: v.detach().clone() for k, v in mlp().state_dict().items()}
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
written = []
with exe.start(params=start) as runner:
    for v in range(versions):
        runner.train_step(torch.randn(8, 256, generator=torch.Generator().manual_seed(v)))
        runner.publish(store, "w", keep=1)
        written.append(hashes(runner.state_dict()))
        if rank == 0:
            deadline = time.monotonic() + 120
            while not all(os.path.exists(os.path.join(folder, f"reader-{r}-saw-{v + 1}"))
                          for r in range(readers)):
                if time.monotonic() > deadline:
                    sys.exit(f"store_writer: the readers did not see version {v} in 120 s")
                time.sleep(0.02)
if rank == 0:
    with open(os.path.join(folder, "written.json"), "w") as f:
        json.dump(written, f)
    open(os.path.join(folder, "done"), "w").close()
