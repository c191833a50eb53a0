"""Models nobody on the project wrote for tdx (torchvision classifiers,
torch.nn Transformer modules, a GQA attention written with
repeat_interleave): deferred init, trace, compile, run on 1 rank, dp2 and
tp2 where a plan applies, and match eager on the same weights."""

import functools
import itertools
import os
import shutil

import pytest
import torch

import tdx
from models import GQA
from vision_models import IMAGES, EncoderClassifier, Seq2Seq

IMAGE = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
IDS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
TGT = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(2))

MODELS = dict(IMAGES, encoder=EncoderClassifier, transformer=Seq2Seq, gqa=GQA)
INPUTS = {name: (IMAGE,) for name in IMAGES}
INPUTS.update(encoder=(IDS,), transformer=(IDS, TGT), gqa=(IDS,))

# Tensor-parallel plans, written against each model's own module names.
PLANS = {
    # Output-channel sharded convolutions (and their batch norms); the next
    # convolution contracts the sharded channels.
    "resnet18": {"layer*.*.conv1": tdx.ColwiseParallel()},
    "vit": {"encoder.layers.*.mlp.0": tdx.ColwiseParallel(),
            "encoder.layers.*.mlp.3": tdx.RowwiseParallel()},
    "encoder": {"encoder.layers.*.linear1": tdx.ColwiseParallel(),
                "encoder.layers.*.linear2": tdx.RowwiseParallel()},
    "gqa": {"layers.*.wq": tdx.ColwiseParallel(), "layers.*.wk": tdx.ColwiseParallel(),
            "layers.*.wv": tdx.ColwiseParallel(), "layers.*.wo": tdx.RowwiseParallel()},
}
MESHES = {"1": ((1,), ("tp",), None), "dp2": ((2,), ("dp",), "dp"), "tp2": ((2,), ("tp",), None)}


def eager(name):
    """The eager model with random weights everywhere (torchvision zeroes
    some heads), in eval mode."""
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


@functools.lru_cache(maxsize=None)
def traced(name):
    torch.manual_seed(0)
    model = tdx.deferred_init(MODELS[name])
    model.eval()
    return tdx.trace(model, *INPUTS[name])


@functools.lru_cache(maxsize=None)
def compiled(name, mesh):
    prog = tdx.Program(traced(name).mlir)
    shape, axes, dp = MESHES[mesh]
    if mesh != "1":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes),
                        PLANS[name] if mesh == "tp2" else {}, data_parallel=dp)
    return tdx.compile(prog), prog


CASES = [(m, "1") for m in MODELS] + [(m, "dp2") for m in MODELS] + [(m, "tp2") for m in PLANS]


@pytest.mark.parametrize("name,mesh", CASES)
def test_matches_eager(name, mesh):
    exe, _ = compiled(name, mesh)
    model = eager(name)
    with torch.no_grad():
        want = model(*INPUTS[name])
    state = dict(itertools.chain(model.named_parameters(), model.named_buffers()))
    (got,) = exe.run(*INPUTS[name], params=state)
    assert got.shape == want.shape
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 1e-5, f"{name} on {mesh}: relative error {rel}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_generic_ops_left(name):
    """Everything these forwards do is raised to first-class tdx ops, so they
    shard and lower to CUDA."""
    forward = traced(name).mlir.split("func.func @forward", 1)[1]
    assert "tdx.aten" not in forward, [l for l in forward.splitlines() if "tdx.aten" in l]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_emission_compiles(name):
    """The 1-rank CUDA source of every model compiles and links with nvcc
    (there is no GPU here to run it)."""
    if not os.path.exists("/usr/local/cuda/bin/nvcc") and not shutil.which("nvcc"):
        pytest.skip("no nvcc on this machine")
    exe = tdx.compile(tdx.Program(traced(name).mlir), target="cuda")
    assert os.path.getsize(exe.path) > 0


def test_conv_tensor_parallel_shards_channels():
    """ResNet with output-channel-sharded conv1s: the sharded channels flow
    through batch norm and relu and are contracted by conv2, whose partial
    sums are all-reduced once per block; nothing is gathered."""
    _, prog = compiled("resnet18", "tp2")
    kinds = [c["kind"] for c in prog.comm_report()]
    assert kinds and set(kinds) == {"all_reduce"}, kinds
    assert len(kinds) == 4  # one per BasicBlock
    assert "tdx.conv" in prog.mlir


def test_data_parallel_conv_net_moves_no_activations():
    """On dp2 the batch is split through every convolution, norm and pool:
    the only collective gathers the logits at the end, if any."""
    _, prog = compiled("resnet18", "dp2")
    assert prog.comm_report() == []


def test_gqa_repeat_interleave_traces_without_data():
    text = traced("gqa").mlir
    assert "repeat_interleave" not in text
    assert "tdx.expand" in text
