"""Training steps (tdx.trace_train_step) of other losses and models, and of
the user's loop: smooth L1 and label-smoothed cross-entropy, torchvision's
models from their state dict, learning-rate schedules, gradient
accumulation, and runs given all their state."""

import functools
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import tdx
from test_training import (
    MESHES, OPTIMIZERS, assert_matches_eager, batches, compiled, eager_run, eager_steps,
    full_state, mlp, mlp_loss, slow)


@pytest.mark.parametrize("mesh", ["1", "dp2"])
def test_smooth_l1_loss_trains_like_eager(mesh):
    # F.smooth_l1_loss's backward (smooth_l1_loss_backward) has no meta
    # kernel in libtorch 1.13: tdx's (lib/Capture/MetaKernels.cpp) lets the
    # step trace. 3 SGD steps of the MLP regressing on dp2, against eager.
    def loss_fn(model, x, y):
        return F.smooth_l1_loss(model(x), y, beta=0.5)
    g = torch.Generator().manual_seed(11)
    data = [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in range(3)]
    mlp_trains_like_eager(loss_fn, data, mesh)


def mlp_trains_like_eager(loss_fn, data, mesh):
    """3 SGD steps of the MLP under `loss_fn` on 1 rank or dp2, against
    eager's loop; the traced program."""
    torch.manual_seed(0)
    model = tdx.deferred_init(mlp)
    prog = tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn,
                                *data[0])
    if mesh == "dp2":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    torch.manual_seed(0)
    eager = mlp()
    start = {k: v.detach().clone() for k, v in eager.state_dict().items()}
    losses, state = tdx.compile(prog).train(data, params=start)
    want = eager_steps(eager, torch.optim.SGD(eager.parameters(), lr=0.1), loss_fn, data)
    assert_matches_eager(losses, want, state, eager)
    return prog


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("mesh", ["1", "dp2"])
def test_label_smoothed_cross_entropy_trains_like_eager(mesh, weighted):
    # torch 1.13 computes label smoothing's mean with masked_select (a
    # data-dependent shape); tdx decomposes it for fake tensors
    # (lib/Capture/Decompositions.cpp). Targets include ignore_index, so the
    # mean divides by the targets not ignored (or their weights).
    weight = torch.tensor([0.5, 1.0, 2.0, 1.5]) if weighted else None

    def loss_fn(model, x, y):
        return F.cross_entropy(model(x), y, weight=weight, ignore_index=3, label_smoothing=0.1)
    g = torch.Generator().manual_seed(12)
    data = [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g))
            for _ in range(3)]
    assert all((y == 3).any() for _, y in data)
    prog = mlp_trains_like_eager(loss_fn, data, mesh)
    assert "masked_select" not in str(prog)


def vision_batches(steps=3):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(steps)]


@functools.lru_cache(maxsize=None)
def compiled_vision(model, mesh):
    import torchvision
    from vision_models import vit_small
    build = functools.partial(torchvision.models.mobilenet_v3_small, num_classes=10,
                              dropout=0.0) if model == "mobilenet_v3" else vit_small
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    optimizer = torch.optim.SGD(deferred.parameters(), lr=0.01, momentum=0.9)
    prog = tdx.trace_train_step(deferred, optimizer, mlp_loss, *vision_batches()[0])
    if mesh == "dp2":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    return build, tdx.compile(prog)


@pytest.mark.parametrize("model,mesh", [
    ("vit", "1"), ("vit", "dp2"),
    # 27 s and 51 s here: torchvision training runs on ViT in the default
    # tier (MobileNet's forward is test_real_models').
    pytest.param("mobilenet_v3", "1", marks=slow), pytest.param("mobilenet_v3", "dp2", marks=slow)])
def test_torchvision_models_train_from_their_state_dict(model, mesh):
    # torchvision's ViT initializes conv_proj with trunc_normal_ over its
    # fan-in, which is not pointwise in the global index: its binary cannot
    # make it, so the run must not try when the weights are given. Only the
    # optimizer state, which a model's state dict lacks, starts from its
    # init program.
    build, exe = compiled_vision(model, mesh)
    torch.manual_seed(0)
    eager = build()
    start = {k: v.clone() for k, v in eager.state_dict().items()}
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.01, momentum=0.9)
    data = vision_batches()
    want = eager_steps(eager, optimizer, mlp_loss, data)
    losses, state = exe.train(data, params=start, verbose=True)
    # Reference: eager float32, well-conditioned here (MobileNet's batch
    # norm over 4 samples too): within 1e-7 of eager float64's losses, and
    # within these tolerances of its state (measured).
    for k, (got, ref) in enumerate(zip(losses, want)):
        assert abs(got - ref) <= 1e-5, f"step {k}: loss {got} vs eager {ref}"
    for name, t in eager.state_dict().items():
        assert torch.allclose(state[name].to(t.dtype), t, rtol=1e-4, atol=1e-6), name
    made = {int(m.group(1)) for m in
            re.finditer(r"rank \d+: (\d+) of \d+ state entries made", exe.last_log)}
    momentum = sum(1 for p in eager.parameters() if p.requires_grad)
    assert made == {momentum}, exe.last_log


def test_a_run_given_all_its_state_runs_no_init_program():
    _, exe = compiled("mlp", "momentum", "1")
    data = batches("mlp")[:2]
    torch.manual_seed(0)
    start = {k: v.detach() for k, v in full_state(mlp()).items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", tdx.TdxWarning)
        _, state = exe.train(data[:1], params=start, verbose=True)
    # The model's weights only: the momentum buffers are made (4 of them).
    assert re.search(r"rank 0: 4 of 8 state entries made by their init programs", exe.last_log)
    # Everything, optimizer state included: nothing is made.
    exe.train(data[1:], params=state, verbose=True)
    assert re.search(r"rank 0: 0 of 8 state entries made by their init programs", exe.last_log)
    # A model entry the file lacks is made, and said so.
    partial = {k: v for k, v in start.items() if k != "0.bias"}
    with pytest.warns(tdx.TdxWarning, match="has no '0.bias'; it starts as its init program"):
        exe.train(data[:1], params=partial, verbose=True)
    assert re.search(r"rank 0: 5 of 8 state entries made by their init programs", exe.last_log)


@pytest.mark.parametrize("opt", ["momentum", "adamw"])
@pytest.mark.parametrize("mesh", ["1", "dp2"])
def test_a_learning_rate_schedule_drives_the_compiled_step(opt, mesh):
    # lr is an input of the step (hyperparameters=("lr",)): eager's loop with
    # a cosine schedule that changes lr every step, and the compiled step
    # given the same lrs, compiled once for every schedule.
    data = batches("mlp")
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    optimizer = OPTIMIZERS[opt](deferred.parameters())
    lr0 = optimizer.param_groups[0]["lr"]
    prog = tdx.trace_train_step(deferred, optimizer, mlp_loss, *data[0], hyperparameters=("lr",))
    assert prog.hyperparameters == {"lr": lr0}
    assert prog._module.num_arguments("train_step") == 3
    shape, axes, dp = MESHES[mesh]
    if dp:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), {}, data_parallel=dp)
    exe = tdx.compile(prog)
    lr_input = exe.signature()["inputs"][-1]
    assert (lr_input["shape"], lr_input["dtype"]) == ([], "F64")

    torch.manual_seed(0)
    eager = mlp()
    eager_opt = OPTIMIZERS[opt](eager.parameters())
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(eager_opt, T_max=len(data))
    lrs, want = [], []
    for batch in data:
        lrs.append(schedule.get_last_lr()[0])
        eager_opt.zero_grad()
        loss = mlp_loss(eager, *batch)
        loss.backward()
        eager_opt.step()
        schedule.step()
        want.append(loss.item())
    assert len(set(lrs)) == len(lrs)
    torch.manual_seed(0)
    start = {k: v.detach() for k, v in full_state(mlp()).items()}
    losses, state = exe.train(data, params=start, lr=lrs)
    assert_matches_eager(losses, want, state, eager)
    # The same binary at the traced lr (the default) is eager's constant-lr loop.
    eager_const, _, want_const = eager_run("mlp", opt, data)
    assert max(abs(a - b) / abs(b) for a, b in zip(want, want_const)) > 1e-3  # lr matters
    losses, state = exe.train(data, params=start)
    assert_matches_eager(losses, want_const, state, eager_const)


def test_hyperparameter_misuse_is_named():
    data = batches("mlp")
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    optimizer = OPTIMIZERS["sgd"](deferred.parameters())
    with pytest.raises(tdx.CaptureError, match="'lrr' is not a number of the optimizer's param "
                                               "group; its hyperparameters are .*lr"):
        tdx.trace_train_step(deferred, optimizer, mlp_loss, *data[0], hyperparameters=("lrr",))
    _, exe = compiled("mlp", "sgd", "1")
    with pytest.raises(tdx.InputError, match="lr is not a hyperparameter of this step; it takes "
                                             "none"):
        exe.train(data, lr=0.1)


@pytest.mark.parametrize("mesh", ["1", "dp2"])
def test_gradient_accumulation_is_eagers_loop_of_micro_batches(mesh):
    # accumulation_steps=2: each batch of 16 is 2 micro-batches of 8; eager
    # runs (loss / 2).backward() on each, then steps. The step returns the
    # mean of the two losses. Data parallel splits every micro-batch, as
    # DDP's ranks would, and reduces each gradient once per step.
    k, data = 2, batches("mlp")
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    prog = tdx.trace_train_step(deferred, OPTIMIZERS["momentum"](deferred.parameters()),
                                mlp_loss, *data[0], accumulation_steps=k)
    assert prog._module.argument_shapes("train_step")[0][0] == [2, 8, 8]
    shape, axes, dp = MESHES[mesh]
    if dp:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), {}, data_parallel=dp)
        grads = sorted(p.numel() * 4 for p in mlp().parameters())
        # Each gradient once, and each micro-batch's loss sum and count.
        assert sorted(r["bytes"] for r in prog.comm_report()) == sorted(grads + [4] * 2 * k)
    exe = tdx.compile(prog)

    torch.manual_seed(0)
    eager = mlp()
    opt = OPTIMIZERS["momentum"](eager.parameters())
    want = []
    for x, y in data:
        opt.zero_grad()
        total = 0.0
        for i in range(k):
            micro = slice(i * 8, (i + 1) * 8)
            loss = mlp_loss(eager, x[micro], y[micro])
            (loss / k).backward()
            total += loss.item()
        opt.step()
        want.append(total / k)
    torch.manual_seed(0)
    start = {n: v.detach() for n, v in full_state(mlp()).items()}
    losses, state = exe.train(data, params=start)
    assert_matches_eager(losses, want, state, eager)
    # The runner takes the same concatenated batches.
    with exe.start(params=start) as runner:
        assert runner.train_step(*data[0]).item() == losses[0]
        with pytest.raises(tdx.InputError, match=r"input 0 is torch.float32 of shape \(8, 8\); "
                                                 r"the program was traced for torch.float32 "
                                                 r"of shape \(16, 8\)"):
            runner.train_step(data[0][0][:8], data[0][1])


def test_accumulation_needs_whole_micro_batches():
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    x, y = batches("mlp")[0]
    with pytest.raises(tdx.CaptureError, match=r"accumulation_steps=3 splits every batch "
                                               r"element along dim 0 into 3 micro-batches, but "
                                               r"batch element 0 is \(16, 8\)"):
        tdx.trace_train_step(deferred, OPTIMIZERS["sgd"](deferred.parameters()), mlp_loss, x, y,
                             accumulation_steps=3)
    with pytest.raises(ValueError, match="accumulation_steps must be a positive int, got 0"):
        tdx.trace_train_step(deferred, OPTIMIZERS["sgd"](deferred.parameters()), mlp_loss, x, y,
                             accumulation_steps=0)
