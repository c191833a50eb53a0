"""torch.distributed.checkpoint (DCP) folders, both ways: one torch wrote
(a model's and its AdamW's state, laid out {"model": ..., "optim":
{"state": ...}} as FSDP2 scripts save it) starts a tdx runner that trains on
as eager does; one tdx wrote (runner.save(dir, format="dcp")) loads into
torch with dcp.load and trains on the same. Bad folders are named.

The reference: eager's loop in float32 on the same weights; the MLP and
AdamW here are well-conditioned (eager float32 is within ~1e-7 of float64
on these losses), so losses agree within 1e-5."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

import tdx
from test_spmd import rerun_on_gloo_abort
from test_training import assert_losses_match, batches, eager_steps, mlp, mlp_loss

STEPS = 4


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=False)


@pytest.fixture(scope="module")
def exe():
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    return tdx.compile(tdx.trace_train_step(deferred, adamw(deferred.parameters()), mlp_loss,
                                            *batches("mlp")[0]), opt_level=0)


def torch_layout(model, opt):
    """{"model": ..., "optim": {"state": {name: {...}}}}: the optimizer's state
    by parameter name, as get_optimizer_state_dict gives it."""
    names = {p: n for n, p in model.named_parameters()}
    state = {names[p]: dict(s) for p, s in opt.state.items()}
    return {"model": model.state_dict(), "optim": {"state": state}}


def test_a_dcp_checkpoint_torch_wrote_starts_a_runner_that_trains_on(exe, tmp_path):
    data = batches("mlp")[:STEPS]
    torch.manual_seed(0)
    model = mlp()
    opt = adamw(model.parameters())
    eager_steps(model, opt, mlp_loss, data[:2])
    dcp.save(torch_layout(model, opt), checkpoint_id=tmp_path / "torch", no_dist=True)
    want = eager_steps(model, opt, mlp_loss, data[2:])  # eager continues
    with exe.start(params=tmp_path / "torch") as runner:
        got = [runner.train_step(x, y).item() for x, y in data[2:]]
    assert_losses_match(got, want)


def tdx_saves_dcp(exe, folder):
    """A runner of `exe` from the MLP's start: 2 steps, runner.save(folder,
    format="dcp") (a second save there refused), then the other steps;
    their losses."""
    data = batches("mlp")[:STEPS]
    torch.manual_seed(0)
    start = {k: v.detach().clone() for k, v in mlp().state_dict().items()}
    with exe.start(params=start) as runner:
        for x, y in data[:2]:
            runner.train_step(x, y)
        runner.save(folder, format="dcp")
        got = [runner.train_step(x, y).item() for x, y in data[2:]]
        with pytest.raises(tdx.CheckpointError, match="exists and is not empty"):
            runner.save(folder, format="dcp")
    return got


def test_a_dcp_checkpoint_tdx_wrote_loads_into_torch_and_trains_on(exe, tmp_path):
    data = batches("mlp")[:STEPS]
    got = tdx_saves_dcp(exe, tmp_path / "tdx")
    # torch reads it into its own model and optimizer (the layout above).
    model = mlp()
    opt = adamw(model.parameters())
    eager_steps(model, opt, mlp_loss, data[:1])  # makes the optimizer's state to load into
    layout = torch_layout(model, opt)
    dcp.load(layout, checkpoint_id=tmp_path / "tdx", no_dist=True)
    model.load_state_dict(layout["model"])
    names = {n: p for n, p in model.named_parameters()}
    for name, s in layout["optim"]["state"].items():
        opt.state[names[name]].update(s)
    assert_losses_match(eager_steps(model, opt, mlp_loss, data[2:]), got)


@pytest.fixture(scope="module")
def exe_tp2():
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    prog = tdx.trace_train_step(deferred, adamw(deferred.parameters()), mlp_loss,
                                *batches("mlp")[0])
    assert tdx.auto_parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)))["plan"]
    return tdx.compile(prog, opt_level=0)


def fsdp2(mode, folder, out):
    """fsdp2_script.py on 2 gloo ranks (torchrun); its losses."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", os.path.join(here, "fsdp2_script.py"), mode, os.fspath(folder), os.fspath(out)]
    done = rerun_on_gloo_abort(
        lambda: subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


def test_fsdp2s_dcp_checkpoint_starts_a_tdx_tp2_runner_that_trains_on(exe_tp2, tmp_path):
    # FSDP2 on 2 gloo ranks trains 2 steps and saves; tdx, its parameters
    # split over tp (another layout), reads the folder and trains on.
    data = batches("mlp")[:STEPS]
    torch.manual_seed(0)
    model = mlp()
    opt = adamw(model.parameters())
    want = eager_steps(model, opt, mlp_loss, data)
    assert_losses_match(fsdp2("save", tmp_path / "fsdp2", tmp_path / "fsdp2.json"), want[:2])
    with exe_tp2.start(params=tmp_path / "fsdp2") as runner:
        got = [runner.train_step(x, y).item() for x, y in data[2:]]
    assert_losses_match(got, want[2:])


def test_tdx_tp2s_dcp_checkpoint_loads_into_fsdp2_which_trains_on(exe_tp2, tmp_path):
    got = tdx_saves_dcp(exe_tp2, tmp_path / "tdx")
    assert_losses_match(fsdp2("load", tmp_path / "tdx", tmp_path / "fsdp2.json"), got)


def test_bad_dcp_folders_are_named(exe, tmp_path):
    torch.manual_seed(0)
    model = mlp()
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "ok", no_dist=True)
    # A missing shard file.
    shards = [f for f in os.listdir(tmp_path / "ok") if f.endswith(".distcp")]
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "torn", no_dist=True)
    os.remove(tmp_path / "torn" / shards[0])
    with pytest.raises(tdx.CheckpointError, match="reading the DCP shards failed"):
        exe.start(params=tmp_path / "torn")
    # A tensor of another shape (a wider model).
    wide = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    dcp.save({"model": wide.state_dict()}, checkpoint_id=tmp_path / "wide", no_dist=True)
    with pytest.raises(tdx.CheckpointError, match=r"model.0.bias has shape \(64,\); the "
                                                  r"program's 0.bias is \(32,\)"):
        exe.start(params=tmp_path / "wide")
    # A name the program does not have, and a parameter missing.
    renamed = {f"model.encoder.{k}": v for k, v in model.state_dict().items()}
    dcp.save(renamed, checkpoint_id=tmp_path / "renamed", no_dist=True)
    with pytest.raises(tdx.CheckpointError, match="DCP key model.encoder.0.bias maps to no state"):
        exe.start(params=tmp_path / "renamed")
    partial = {k: v for k, v in model.state_dict().items() if k != "2.weight"}
    dcp.save(partial, checkpoint_id=tmp_path / "partial", no_dist=True)
    with pytest.raises(tdx.CheckpointError, match="no tensor for 2.weight"):
        exe.start(params=tmp_path / "partial")
    # No .metadata: not DCP; the folder is read as safetensors files, as before.
    os.remove(tmp_path / "ok" / ".metadata")
    with pytest.raises(tdx.TdxError):
        exe.start(params=tmp_path / "ok").close()
