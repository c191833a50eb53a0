"""Pipeline parallelism (tdx.parallelize(..., pipeline=tdx.Pipeline(...))):
the training step split into stages balanced by cost, each pipeline rank
running its stages' forward and backward on the micro-batches in its
schedule's order, activations and gradients sent point to point. GPT-2 and
LLaMA (tests/python/models.py, written the usual way) on 2 and 4 stages, and
on 2x2 meshes of pp x dp and pp x tp, match eager's full-batch steps."""

import functools
import re

import pytest
import torch
import torch.nn.functional as F

import tdx
from models import GPT2, Llama
from test_sharding import GPT2_PLAN, LLAMA_PLAN
from test_training import assert_losses_match, rel

STEPS = 4
slow = pytest.mark.slow


def lm_loss(model, ids, targets):
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# Deep enough for 4 ranks x 2 stages each (interleaved): a layer is a block,
# or a module outside the blocks (embeddings, final norm).
MODELS = {"gpt2": functools.partial(GPT2, layers=6), "llama": functools.partial(Llama, layers=6)}
PLANS = {"gpt2": GPT2_PLAN, "llama": LLAMA_PLAN}
MESHES = {"pp2": ((2,), ("pp",)), "pp4": ((4,), ("pp",)),
          "pp2xdp2": ((2, 2), ("pp", "dp")), "pp2xtp2": ((2, 2), ("pp", "tp"))}
# SGD with momentum (optimizer state in every stage): its update is linear
# in the gradient, so the comparison is sharp. (Adam's first steps move
# entries whose gradient is rounding noise by +-lr: eager's own full-batch
# and accumulated steps differ by 1e-4 there.)
OPTIMIZER = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=0.01)
SCHEDULES = {"gpipe": ("gpipe", 1), "1f1b": ("1f1b", 1), "interleaved": ("interleaved-1f1b", 2)}


def data(n=STEPS, batch=8):
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, 96, (batch, 8), generator=g),
             torch.randint(0, 96, (batch, 8), generator=g)) for _ in range(n)]


def build(model):
    torch.manual_seed(0)
    deferred = tdx.deferred_init(MODELS[model])
    optimizer = OPTIMIZER(deferred.parameters())
    return deferred, tdx.trace_train_step(deferred, optimizer, lm_loss, *data(1)[0])


def pipelined(model, mesh, schedule, microbatches=4, zero=0):
    _, prog = build(model)
    shape, axes = MESHES[mesh]
    kind, per_rank = SCHEDULES[schedule]
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes),
                    PLANS[model] if "tp" in axes else {},
                    data_parallel="dp" if "dp" in axes else None, zero=zero,
                    pipeline=tdx.Pipeline("pp", microbatches=microbatches, schedule=kind,
                                          stages_per_rank=per_rank))
    return prog


def eager_steps(model, batches):
    torch.manual_seed(0)
    eager = MODELS[model]()
    start = {k: v.detach().clone() for k, v in eager.state_dict().items()}
    optimizer = OPTIMIZER(eager.parameters())
    losses = []
    for ids, targets in batches:
        optimizer.zero_grad()
        loss = lm_loss(eager, ids, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return eager, start, losses


CASES = [(m, mesh, s) for m in MODELS for mesh in MESHES for s in SCHEDULES]
# Every model, mesh and schedule is in the default tier at least once; the
# rest of the product runs with TDX_SLOW=1.
QUICK = {("gpt2", "pp2", "1f1b"), ("gpt2", "pp4", "interleaved"), ("gpt2", "pp2xdp2", "gpipe"),
         ("gpt2", "pp2xtp2", "1f1b"), ("llama", "pp2", "interleaved"), ("llama", "pp4", "gpipe"),
         ("llama", "pp2xdp2", "1f1b"), ("llama", "pp2xtp2", "interleaved")}


@pytest.mark.parametrize("model,mesh,schedule",
                         [c if c in QUICK else pytest.param(*c, marks=slow) for c in CASES])
def test_pipeline_matches_eager(model, mesh, schedule):
    batches = data()
    prog = pipelined(model, mesh, schedule)
    exe = tdx.compile(prog, opt_level=0)
    eager, start, want = eager_steps(model, batches)
    losses, state = exe.train(batches, params=start)
    assert len(losses) == STEPS
    assert_losses_match(losses, want)
    for name, p in eager.named_parameters():
        assert rel(state[name], p.detach()) < 1e-4, f"{name} after {STEPS} steps"
