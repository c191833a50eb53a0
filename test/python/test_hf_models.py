"""Hugging Face transformers models, unchanged, built from small configs
(nothing downloaded): GPT-2 as modeling_gpt2 writes it (Conv1D layers, a
tied lm_head, SDPA attention) trains from the runner on 1 rank and dp2
against eager's loop, the user's own model loads runner.state_dict()
strictly, and auto_parallelize finds its Conv1D pairs.

The reference: eager's loop in float32 on the same weights, with AdamW.
Losses within 1e-5; parameters within 1e-4 of eager float32, or within
twice eager float32's own distance to float64 eager (reference.py) where
AdamW's update amplifies rounding on near-zero gradients."""

import pytest
import torch
import torch.nn.functional as F

import tdx
from reference import assert_state_near_float64, eager_runs

VOCAB, STEPS = 96, 3


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    return GPT2LMHeadModel(config)


def loss_fn(model, ids, targets):
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=False)


def data():
    g = torch.Generator().manual_seed(3)
    return [(torch.randint(0, VOCAB, (4, 8), generator=g),
             torch.randint(0, VOCAB, (4, 8), generator=g)) for _ in range(STEPS)]


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    deferred = tdx.deferred_init(gpt2)
    return tdx.trace_train_step(deferred, adamw(deferred.parameters()), loss_fn, *data()[0])


def eager_loop(model, opt, batches):
    losses = []
    for ids, targets in batches:
        opt.zero_grad()
        loss = loss_fn(model, ids, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def eager():
    """(start state, fp32 run, fp64 run) of eager's loop on the same weights."""
    torch.manual_seed(0)
    model = gpt2()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    fp32, fp64 = eager_runs(model, adamw, eager_loop, data())
    return start, fp32, fp64


@pytest.mark.parametrize("layout", ["1", "dp2"])
def test_hf_gpt2_trains_from_the_runner_like_eager(program, eager, layout):
    start, fp32, fp64 = eager
    prog = program.copy()
    if layout == "dp2":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    exe = tdx.compile(prog, opt_level=0)
    with exe.start(params=start) as runner:
        losses = [runner.train_step(ids, targets).item() for ids, targets in data()]
        state = runner.state_dict()
    for k, (got, want) in enumerate(zip(losses, fp32.losses)):
        assert abs(got - want) <= 1e-5 * abs(want), f"step {k}: loss {got} vs eager {want}"
    fp32_state, fp64_state = fp32.state(), fp64.state()
    for name, _ in fp32.model.named_parameters():
        err = (state[name] - fp32_state[name]).norm() / fp32_state[name].norm()
        if err > 1e-4:  # AdamW's amplified rounding: judged against float64
            assert_state_near_float64(state, fp32_state, fp64_state, [name])
    # The user's own model (lm_head.weight tied to transformer.wte.weight)
    # takes the runner's state strictly.
    mine = gpt2()
    assert state.keys() == mine.state_dict().keys()
    mine.load_state_dict(state, strict=True)


def test_auto_parallelize_finds_hf_gpt2s_conv1d_pairs(program):
    # c_attn (q, k and v in one Conv1D) feeds attn.c_proj; mlp.c_fc feeds
    # mlp.c_proj: each pair split on its stored (in, out) layout.
    chosen = tdx.auto_parallelize(program.copy(), tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp")))
    got = {p: (type(s).__name__, s.in_out) for p, s in chosen["plan"].items()}
    assert got == {"transformer.h.*.attn.c_attn": ("ColwiseParallel", True),
                   "transformer.h.*.attn.c_proj": ("RowwiseParallel", True),
                   "transformer.h.*.mlp.c_fc": ("ColwiseParallel", True),
                   "transformer.h.*.mlp.c_proj": ("RowwiseParallel", True)}, chosen
