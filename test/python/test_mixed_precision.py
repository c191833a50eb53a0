"""Mixed precision (tdx.MixedPrecision, FSDP2's policy): a training step
computed in bf16 on fp32 master weights, against eager PyTorch with the same
casts written out by hand here: every step a bf16 copy of the fp32
parameters computes the loss and its gradients, which reach the fp32
parameters as fp32, and torch's AdamW updates them in fp32."""

import collections
import functools
import re

import pytest
import torch

import tdx
from test_training import (MESHES, MODELS, OPTIMIZERS, PLANS, STEPS, batches, full_state,
                           train_from_eagers_start)

slow = pytest.mark.slow
POLICY = tdx.MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def traced(model, opt="adamw"):
    build, loss_fn = MODELS[model]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    optimizer = OPTIMIZERS[opt](deferred.parameters())
    return tdx.trace_train_step(deferred, optimizer, loss_fn, *batches(model)[0])


def placed(model, mesh, zero=0, policy=POLICY):
    prog = traced(model)
    shape, axes, dp = MESHES[mesh]
    plan = PLANS[model] if "tp" in axes else {}
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), plan, data_parallel=dp,
                    zero=zero, mixed_precision=policy)
    return prog


@functools.lru_cache(maxsize=None)
def compiled(model, mesh, zero=0):
    prog = placed(model, mesh, zero)
    return prog.comm_report(), tdx.compile(prog)


def eager_with_casts(model, data):
    """Eager's 10 AdamW steps with a bf16 copy of the fp32 weights computing
    each step (one copy per tensor: a tied weight's two names share it)."""
    build, loss_fn = MODELS[model]
    torch.manual_seed(0)
    return eager_loop_with_casts(build(), OPTIMIZERS["adamw"], loss_fn, data)


def eager_loop_with_casts(m, make_optimizer, loss_fn, data):
    """Eager's loop on model `m`, each step computed by a bf16 copy of its
    fp32 weights, the gradients reaching the fp32 weights as fp32, which
    make_optimizer(parameters) updates: (m, losses)."""
    from torch.nn.utils.stateless import _reparametrize_module
    optimizer = make_optimizer(m.parameters())
    losses = []
    for batch in data:
        optimizer.zero_grad()
        copies, by_name = {}, {}
        for prefix, module in m.named_modules(remove_duplicate=False):
            for leaf, p in module._parameters.items():
                if p is None:
                    continue
                if id(p) not in copies:
                    copies[id(p)] = (p, p.detach().to(torch.bfloat16).requires_grad_())
                by_name[f"{prefix}.{leaf}" if prefix else leaf] = copies[id(p)][1]
        with _reparametrize_module(m, by_name):
            loss = loss_fn(m, *batch)
        assert loss.dtype == torch.bfloat16
        loss.backward()
        for p, copy in copies.values():
            p.grad = copy.grad.float()
        optimizer.step()
        losses.append(loss.item())
    return m, losses


CASES = [("gpt2", "1", 0), pytest.param("gpt2", "dp2", 0, marks=slow),
         pytest.param("gpt2", "tp2", 0, marks=slow), ("gpt2", "dp2", 3),
         pytest.param("llama", "1", 0, marks=slow), pytest.param("llama", "dp2", 0, marks=slow),
         ("llama", "tp2", 0), pytest.param("llama", "dp2", 3, marks=slow)]


@pytest.mark.parametrize("model,mesh,zero", CASES)
def test_bf16_training_matches_eager_with_the_same_casts(model, mesh, zero):
    data = batches(model)
    report, exe = compiled(model, mesh, zero)
    eager, want = eager_with_casts(model, data)
    losses, state = train_from_eagers_start(model, exe, data)
    assert len(losses) == STEPS
    # bf16 losses: within 2e-2 of eager's at every step.
    for k, (got, ref) in enumerate(zip(losses, want)):
        assert abs(got - ref) <= 2e-2 * abs(ref), f"step {k}: loss {got} vs eager {ref}"
    # The state is stored, returned and updated in fp32, and the parameters
    # took eager's steps: what separates them from eager's is a small part of
    # how far eager's moved in 10 steps (bf16 rounds the gradients
    # differently in places, and Adam's steps on a gradient that is rounding
    # noise, an attention key bias's, take either sign).
    torch.manual_seed(0)
    start = full_state(MODELS[model][0]())
    for name, value in state.items():
        # Adam's step count is float64 (tdx/training.py: its bias corrections).
        want_dtype = torch.float64 if name.endswith(".step") else torch.float32
        assert value.dtype == want_dtype, (name, value.dtype)
    moved = sum((p - start[n]).norm() ** 2 for n, p in eager.named_parameters()) ** 0.5
    apart = sum((state[n] - p).norm() ** 2 for n, p in eager.named_parameters()) ** 0.5
    assert 0 < apart <= 0.1 * moved, (apart.item(), moved.item())
    worst = max(abs(got - ref) / abs(ref) for got, ref in zip(losses, want))
    print(f"\n{model} {mesh} zero={zero}: losses within {worst:.1e} of eager's, "
          f"parameters {apart / moved:.1e} of eager's steps apart")
    kinds = collections.Counter((c["kind"], c["dtype"]) for c in report)
    # Every collective that sums (the gradients', tensor parallelism's) sums in fp32.
    assert all(c["dtype"] == "f32" for c in report if c["kind"] in ("all_reduce",
                                                                      "reduce_scatter")), kinds
    if mesh != "1":
        assert kinds[("all_reduce", "f32")] + kinds[("reduce_scatter", "f32")] > 0, kinds


def test_zero3_gathers_bf16_parameters_half_the_bytes():
    # ZeRO-3 casts before it gathers: every all_gather of the bf16 step
    # moves bf16, half the bytes of the fp32 step's gathers, and the
    # gradients are reduce-scattered in fp32, the same bytes as fp32's.
    bf16 = placed("gpt2", "dp2", 3).comm_report()
    fp32 = placed("gpt2", "dp2", 3, policy=None).comm_report()

    def total(report, kind, dtype):
        rows = [c for c in report if c["kind"] == kind]
        assert rows and all(c["dtype"] == dtype for c in rows), (kind, dtype, rows)
        return sum(c["bytes"] for c in rows)

    assert total(bf16, "all_gather", "bf16") * 2 == total(fp32, "all_gather", "f32")
    assert total(bf16, "reduce_scatter", "f32") == total(fp32, "reduce_scatter", "f32")


def test_tensor_parallel_reductions_sum_in_the_reduce_dtype():
    # Without reduce_dtype, tensor parallelism's all_reduces sum the bf16
    # activations' gradients in bf16; with it, in fp32 (twice the bytes):
    # FSDP2's TP all_reduces ignore reduce_dtype, tdx's do not.
    narrow = placed("llama", "tp2",
                    policy=tdx.MixedPrecision(torch.bfloat16, reduce_dtype=None)).comm_report()
    wide = placed("llama", "tp2").comm_report()
    assert [c["dtype"] for c in narrow if c["kind"] == "all_reduce"] == ["bf16"] * 8
    assert [c["dtype"] for c in wide if c["kind"] == "all_reduce"] == ["f32"] * 8
    assert sum(c["bytes"] for c in wide) == 2 * sum(c["bytes"] for c in narrow)


def test_autocast_in_user_code_compiles_and_runs_like_eager():
    # torch.autocast regions in a loss_fn are recorded as eager runs them
    # (bf16 matmuls inside, fp32 outside) and compile on CPU.
    def loss_fn(model, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        return torch.nn.functional.cross_entropy(logits.float(), y)

    build = MODELS["mlp"][0]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    prog = tdx.trace_train_step(deferred, OPTIMIZERS["sgd"](deferred.parameters()), loss_fn,
                                *batches("mlp")[0])
    assert "bf16" in prog.mlir
    data = batches("mlp")[:3]
    torch.manual_seed(0)
    eager = build()
    optimizer = OPTIMIZERS["sgd"](eager.parameters())
    want = []
    for batch in data:
        optimizer.zero_grad()
        loss = loss_fn(eager, *batch)
        loss.backward()
        optimizer.step()
        want.append(loss.item())
    torch.manual_seed(0)
    losses, state = tdx.compile(prog).train(data, params=dict(build().named_parameters()))
    for got, ref in zip(losses, want):
        assert abs(got - ref) <= 1e-2 * abs(ref), (losses, want)
    for name, p in eager.named_parameters():
        assert state[name].dtype == torch.float32
        assert (state[name] - p).norm() <= 1e-2 * p.norm(), name


def test_mixed_precision_misuse_is_named():
    with pytest.raises(ValueError, match="floating-point torch dtype"):
        tdx.MixedPrecision(param_dtype=torch.int8)
    with pytest.raises(ValueError, match="float32 or torch.float64"):
        tdx.MixedPrecision(reduce_dtype=torch.bfloat16)
    prog = traced("mlp", "sgd")
    mesh = tdx.init_device_mesh("cpu", (2,), ("dp",))
    with pytest.raises(TypeError, match="tdx.MixedPrecision"):
        tdx.parallelize(prog, mesh, {}, data_parallel="dp", mixed_precision=torch.bfloat16)
    tdx.parallelize(prog, mesh, {}, data_parallel="dp")
    with pytest.raises(tdx.CaptureError, match="freshly traced program"):
        tdx.parallelize(prog, mesh, {}, data_parallel="dp", mixed_precision=POLICY)
    loaded = tdx.Program(traced("mlp", "sgd").mlir)
    with pytest.raises(tdx.CaptureError, match="traced in this process"):
        tdx.parallelize(loaded, mesh, {}, data_parallel="dp", mixed_precision=POLICY)


def build_and_load(build, weights):
    model = build()
    model.load_state_dict(weights)
    return model


def test_a_batch_of_another_dtype_than_a_bf16_programs_is_named():
    # A program traced on bfloat16 images takes bfloat16: a float32 batch
    # is refused in Python with what the program takes, before a rank
    # starts, by the binary's loop and by the runner alike.
    def build():
        return torch.nn.Sequential(torch.nn.Linear(8, 4)).to(torch.bfloat16)

    torch.manual_seed(0)
    x = torch.randn(4, 8).to(torch.bfloat16)
    prog = tdx.trace(tdx.deferred_init(build), x)
    exe = tdx.compile(prog)
    torch.manual_seed(0)
    weights = build().state_dict()
    want = "the program was traced for torch.bfloat16 of shape (4, 8)"
    with pytest.raises(tdx.InputError, match=re.escape(
            f"run: input 0 is torch.float32 of shape (4, 8); {want}")):
        exe.run(x.float(), params=weights)
    with exe.start(params=weights) as runner:
        with pytest.raises(tdx.InputError, match=re.escape(want)):
            runner(x.float())
        y = runner(x)
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y, build_and_load(build, weights)(x), rtol=1e-2, atol=1e-2)
