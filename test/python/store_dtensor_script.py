"""A plain torch job (gloo, no tdx program) putting DTensors in tdx.store
and getting them back under other placements, TorchStore's resharding test
through tdx.store's TorchStore API:

    python3 -m tdx.run -n N store_dtensor_script.py PORT STORE put|get

``put`` stores, on N ranks, the cases of CASES whose put mesh has N ranks;
``get`` reads, on N ranks, those whose get mesh has N, each rank checking
its box bitwise against the global tensor, and prints one JSON line per
rank."""

import json
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

import tdx.store as ts

port, store, role = sys.argv[1:4]
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
n = int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
ts.initialize(store)

# key: (global shape, put mesh, put placements, get mesh, get placements)
CASES = {
    "rows-to-cols": ((256, 192), (4,), [Shard(0)], (2,), [Shard(1)]),
    "cols-to-grid": ((16, 12), (2,), [Shard(1)], (2, 2), [Shard(0), Shard(1)]),
    "replicated-rows-to-replicate": ((8, 6), (2, 2), [Replicate(), Shard(0)], (4,),
                                     [Replicate()]),
    "grid-to-transposed-grid": ((8, 12), (2, 2), [Shard(0), Shard(1)], (2, 2),
                                [Shard(1), Shard(0)]),
    "uneven-rows-to-cols": ((7, 5), (4,), [Shard(0)], (2,), [Shard(1)]),
    "partial-to-rows": ((6, 4), (2,), ["partial"], (4,), [Shard(0)]),
}


def whole(key, shape):
    g = torch.Generator().manual_seed(sum(map(ord, key)))
    return torch.randn(shape, generator=g)


def like(mesh, placements, shape, dtype=torch.float32):
    size, _ = compute_local_shape_and_global_offset(torch.Size(shape), mesh, placements)
    return DTensor.from_local(torch.full(size, float("nan"), dtype=dtype), mesh, placements,
                              shape=torch.Size(shape), stride=torch.empty(shape).stride())


def model_state(seed, mesh, placements):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(12, 8, generator=g)
    return {"model": {"w": distribute_tensor(w, mesh, placements),
                      "b": torch.randn(8, generator=g)},
            "step": seed, "groups": [{"lr": 0.01 * seed, "betas": (0.9, 0.95)}]}


report = {"rank": rank, "checked": []}
if role == "put":
    for key, (shape, pmesh, pplace, _, _) in CASES.items():
        if math.prod(pmesh) != n:
            continue
        mesh = init_device_mesh("cpu", pmesh)
        if pplace == ["partial"]:
            # A Partial DTensor: each rank holds a term; the store holds the sum.
            from torch.distributed.tensor import Partial
            part = whole(key, shape) / n
            value = DTensor.from_local(part, mesh, [Partial()])
        else:
            value = distribute_tensor(whole(key, shape), mesh, pplace)
        report["checked"].append((key, ts.put(key, value)))
    if n == 2:
        mesh = init_device_mesh("cpu", (2,))
        report["checked"].append(("state", ts.put_state_dict(model_state(3, mesh, [Shard(0)]),
                                                             "state")))
else:
    for key, (shape, _, _, gmesh, gplace) in CASES.items():
        if math.prod(gmesh) != n:
            continue
        mesh = init_device_mesh("cpu", gmesh)
        got = ts.get(key, like=like(mesh, gplace, shape))
        size, offset = compute_local_shape_and_global_offset(torch.Size(shape), mesh, gplace)
        want = whole(key, shape)[tuple(slice(o, o + s) for o, s in zip(offset, size))]
        assert isinstance(got, DTensor) and got.placements == tuple(gplace), got
        assert torch.equal(got.to_local(), want), (key, got.to_local(), want)
        report["checked"].append(key)
    if n == 4:
        # The state dict into a user's, in place, under other placements.
        mesh = init_device_mesh("cpu", (2, 2))
        user = model_state(0, mesh, [Shard(1), Replicate()])
        w = user["model"]["w"]
        w_local = w.to_local()
        b = user["model"]["b"]
        out = ts.get_state_dict("state", user)
        want = model_state(3, init_device_mesh("cpu", (4,)), [Replicate()])
        assert out is user and user["model"]["w"] is w
        assert w.to_local().data_ptr() == w_local.data_ptr()
        assert torch.equal(w_local, want["model"]["w"].to_local()[:, (rank // 2) * 4:][:, :4])
        assert user["model"]["b"] is b and torch.equal(b, want["model"]["b"])
        assert user["step"] == 3 and user["groups"] == [{"lr": 0.03, "betas": (0.9, 0.95)}]
        report["checked"].append("state")
print(json.dumps(report), flush=True)
dist.destroy_process_group()
