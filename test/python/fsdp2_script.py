"""FSDP2 (``fully_shard``) training test_training's MLP on gloo ranks, as a
user's script does, with its checkpoint in torch.distributed.checkpoint
(DCP): run under ``python -m torch.distributed.run --standalone
--nproc_per_node 2 fsdp2_script.py MODE FOLDER LOSSES``.

MODE ``save``: from the MLP's seeded start, trains steps 0 and 1 and saves
``{"model": ..., "optim": ...}`` (get_model_state_dict /
get_optimizer_state_dict) to FOLDER. MODE ``load``: loads FOLDER into the
same layout and trains steps 2 and 3. Rank 0 writes the losses (the
global batch's mean) to LOSSES as JSON. Each rank takes its half of each
batch; FSDP2 averages the gradients, so a step is eager's on the whole
batch."""

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict, set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from test_dcp import adamw
from test_training import batches, mlp, mlp_loss


def main(mode, folder, out):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = mlp()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = adamw(model.parameters())
    data = batches("mlp")
    steps = range(0, 2) if mode == "save" else range(2, 4)
    if mode == "load":
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        # tdx's folders hold no optim.param_groups (a program keeps its
        # hyperparameters): the optimizer keeps its own.
        dcp.load(state, checkpoint_id=folder,
                 planner=DefaultLoadPlanner(allow_partial_load=True))
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    losses = []
    for k in steps:
        x, y = data[k]
        part = x.shape[0] // world
        opt.zero_grad()
        loss = mlp_loss(model, x[rank * part:(rank + 1) * part], y[rank * part:(rank + 1) * part])
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    if mode == "save":
        dcp.save({"model": get_model_state_dict(model),
                  "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=folder)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
