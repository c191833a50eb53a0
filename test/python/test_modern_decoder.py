"""A causal decoder written as models are written for torch 2.x:
F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) with fewer
key/value heads than query heads, nn.RMSNorm, a SwiGLU feed-forward, trained
from the runner (the user's loop) on 1 rank, dp2, tp2 (the plan written with
torch's own ColwiseParallel / RowwiseParallel objects on torch's DeviceMesh
over its fake process group) and ZeRO-3, against eager's loop.

The reference: eager's loop in float32 and in float64 on the same weights
(test/python/reference.py). Losses must be within 1e-5 of eager float32's
(this problem is well-conditioned: eager float32 is within ~1e-7 of
float64); parameters within 1e-4 of eager float32's, or twice the farthest
of eager float32's summation orders from float64 where AdamW's update
amplifies rounding."""

import pytest
import torch
import torch.nn.functional as F

import tdx
from reference import assert_losses_near_float64, assert_state_near_float64, eager_runs

from models import Decoder
from models import DECODER_LAYERS as LAYERS, DECODER_VOCAB as VOCAB
from test_training import eager_steps

SEQ, BATCH, STEPS = 8, 4, 3


def loss_fn(model, ids, targets):
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=False)


def data():
    g = torch.Generator().manual_seed(3)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
             torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)) for _ in range(STEPS)]


def torch_tp_plan():
    """torchtitan's Llama plan, written with torch's own objects."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel)
    return {
        "layers.*.attention": PrepareModuleInput(input_layouts=(Replicate(),),
                                                 desired_input_layouts=(Replicate(),)),
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wk": ColwiseParallel(),
        "layers.*.attention.wv": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Replicate()),
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w3": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Replicate()),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }


@pytest.fixture(scope="module")
def torch_mesh():
    """torch's DeviceMesh over its fake process group, in this one process
    (as AutoParallel plans): tp over 2 ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def eager():
    torch.manual_seed(0)
    model = Decoder()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    fp32, fp64 = eager_runs(model, optimizer,
                            lambda m, opt, d: eager_steps(m, opt, loss_fn, d), data())
    return start, fp32, fp64


@pytest.mark.parametrize("layout", ["1", "dp2", "tp2", "dp2-zero3"])
def test_decoder_trains_from_the_runner_like_eager(layout, eager, torch_mesh):
    start, fp32, fp64 = eager
    batches = data()
    torch.manual_seed(0)
    model = tdx.deferred_init(Decoder)
    prog = tdx.trace_train_step(model, optimizer(model.parameters()), loss_fn, *batches[0])
    # SDPA is one fused op (forward and backward), RMSNorm a norm: no
    # generic attention left.
    assert prog.mlir.count("tdx.sdpa ") == LAYERS and prog.mlir.count("tdx.sdpa_backward") == LAYERS
    assert "scaled_dot_product" not in prog.mlir
    if layout == "tp2":
        tdx.parallelize(prog, torch_mesh, torch_tp_plan())
        kinds = [c["kind"] for c in prog.comm_report()]
        # Megatron's: per layer, an all_reduce after the attention's and the
        # MLP's rowwise linears in the forward and for the input's gradient
        # in the backward; heads split, never gathered.
        assert "all_gather" not in kinds or kinds.count("all_gather") <= 2, kinds
    elif layout.startswith("dp2"):
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {},
                        data_parallel="dp", zero=3 if layout.endswith("zero3") else 0)
    exe = tdx.compile(prog, opt_level=0)
    with exe.start(params=start) as runner:
        losses = [runner.train_step(ids, targets).item() for ids, targets in batches]
        state = runner.state_dict()
    for k, (got, want) in enumerate(zip(losses, fp32.losses)):
        assert abs(got - want) <= 1e-5 * abs(want), f"step {k}: loss {got} vs eager {want}"
    assert_losses_near_float64(losses, fp32, fp64)
    names = [n for n, _ in fp32.model.named_parameters()]
    fp32_state, fp64_state = fp32.state(), fp64.state()
    for name in names:
        err = (state[name] - fp32_state[name]).norm() / fp32_state[name].norm()
        if err > 1e-4:  # AdamW's amplified rounding: judged against float64
            assert_state_near_float64(state, fp32, fp64, [name])


def test_attention_dropout_draws_its_mask_from_tdxs_counter_stream():
    # With dropout_p > 0 torch takes SDPA's math path (no fused CPU kernel
    # takes dropout): the ops stay generic, and the mask is tdx.bernoulli
    # of the keep probability from the counter-based stream.
    class Dropped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, x):
            q = self.proj(x).view(2, 8, 2, 8).transpose(1, 2)
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.25, is_causal=True)

    prog = tdx.trace(tdx.deferred_init(Dropped), torch.randn(2, 8, 16))
    assert "tdx.sdpa" not in prog.mlir
    assert "tdx.bernoulli(7.500000e-01)" in prog.mlir, prog.mlir
