"""Training steps (tdx.trace_train_step): forward, backward and the
optimizer's update recorded from PyTorch, compiled and run for several steps
on CPU ranks; losses, gradients' effect and final state match eager PyTorch
with torch.optim on the same weights and batches."""

import functools
import itertools
import re

import pytest
import torch
import torch.nn.functional as F

import tdx
import philox
from reference import (assert_losses_near_float64, assert_state_near_float64, batch_in,
                       eager_runs, in_float64)
from models import GPT2, Llama
from vision_models import resnet18_small
from test_sharding import GPT2_PLAN, LLAMA_PLAN

STEPS = 10


def lm_loss(model, ids, targets):
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def mlp_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def batches(model):
    model = model.split("-")[0]
    g = torch.Generator().manual_seed(5)
    if model == "resnet":
        return [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))
                for _ in range(STEPS)]
    if model == "mlp":
        return [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g))
                for _ in range(STEPS)]
    return [(torch.randint(0, 96, (4, 8), generator=g), torch.randint(0, 96, (4, 8), generator=g))
            for _ in range(STEPS)]


MODELS = {"mlp": (mlp, mlp_loss), "gpt2": (GPT2, lm_loss), "llama": (Llama, lm_loss),
          "gpt2-dropout": (functools.partial(GPT2, dropout=0.1), lm_loss),
          "llama-sp": (Llama, lm_loss),
          "gpt2-ckpt": (functools.partial(GPT2, checkpoint="reentrant"), lm_loss),
          "gpt2-ckpt-nr": (functools.partial(GPT2, checkpoint="non-reentrant"), lm_loss),
          # torchvision's ResNet (BasicBlock [1, 1, 1, 1]): convolutions,
          # batch norm in training mode (its running statistics are state the
          # step writes), max pooling, and their backward ops.
          "resnet": (resnet18_small, mlp_loss)}
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3, weight_decay=0.01, amsgrad=True),
    # A ResNet on batches of 4 takes larger steps chaotically: eager itself,
    # its weights moved by 1e-7, ends 10 steps at lr 3e-4 with its last two
    # losses 1e-4 and 2.2e-3 off its own (1e-4: 2.6e-5); at this lr it stays
    # within 6.5e-7 (measured on this machine's kind).
    "momentum-small": lambda params: torch.optim.SGD(params, lr=3e-5, momentum=0.9),
}
# The floor of tdx's Adam and AdamW against float64 eager (reference.py),
# relative to each tensor. The step records torch's differentiable Adam
# (tdx/training.py), which computes its bias corrections 1 - beta ** step
# in the step's dtype: tdx keeps the step in float64 (as eager's default
# path computes them in Python floats), so the floor is reference.py's. With
# a float32 step, 1 - 0.999 is 1.3e-5 off and tdx's GPT-2 biases ended
# 7.7e-6 off float64 eager's where eager float32's are 2.5e-7 off
# (measured).
ADAM_FLOOR = 1e-6
MESHES = {"1": ((1,), ("dp",), None), "dp2": ((2,), ("dp",), "dp"),
          "tp2": ((2,), ("tp",), None), "2x2": ((2, 2), ("dp", "tp"), "dp")}
# Megatron sequence parallelism: the norms run on sequence-split activations.
LLAMA_SP_PLAN = dict(LLAMA_PLAN, **{"layers.*.attention_norm": tdx.SequenceParallel(),
                                    "layers.*.ffn_norm": tdx.SequenceParallel()})
PLANS = {"mlp": {}, "resnet": {}, "gpt2": GPT2_PLAN, "llama": LLAMA_PLAN, "gpt2-dropout": GPT2_PLAN,
         "gpt2-ckpt": GPT2_PLAN, "gpt2-ckpt-nr": GPT2_PLAN,
         "llama-sp": LLAMA_SP_PLAN}


@functools.lru_cache(maxsize=None)
def compiled(model, opt, mesh, zero=0, clip=None):
    build, loss_fn = MODELS[model]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    optimizer = OPTIMIZERS[opt](deferred.parameters())
    prog = tdx.trace_train_step(deferred, optimizer, loss_fn, *batches(model)[0],
                                max_grad_norm=clip)
    shape, axes, dp = MESHES[mesh]
    plan = PLANS[model] if "tp" in axes else {}
    if dp or plan:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), plan, data_parallel=dp,
                        zero=zero)
    return prog.mlir, tdx.compile(prog)


def eager_run(model, opt, data, dropout_masks=None, clip=None):
    build, loss_fn = MODELS[model]
    torch.manual_seed(0)
    eager = build()
    if dropout_masks:
        dropout_masks(eager)
    optimizer = OPTIMIZERS[opt](eager.parameters())
    return eager, optimizer, eager_steps(eager, optimizer, loss_fn, data, clip)


def eager_in_float32_and_float64(model, opt, data, clip=None):
    """Eager's loop on the model as built (torch.manual_seed(0)) in float32,
    and on its exact float64 copy: the reference.Runs (fp32, fp64)."""
    build, loss_fn = MODELS[model]
    torch.manual_seed(0)
    return eager_runs(build(), OPTIMIZERS[opt],
                      lambda m, o, d: eager_steps(m, o, loss_fn, d, clip), data)


def eager_steps(eager, optimizer, loss_fn, data, clip=None):
    """Eager's loop, one step per batch; the losses."""
    losses = []
    for batch in data:
        optimizer.zero_grad()
        loss = loss_fn(eager, *batch)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(eager.parameters(), clip)
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_from_eagers_start(model, exe, data):
    """(losses, state) of the compiled step run on `data` from the weights
    and buffers eager starts with."""
    torch.manual_seed(0)
    start = {k: v.detach() for k, v in full_state(MODELS[model][0]()).items()}
    return exe.train(data, params=start)


def assert_losses_match(losses, want):
    for k, (got, ref) in enumerate(zip(losses, want)):
        assert abs(got - ref) <= 1e-5 * abs(ref), f"step {k}: loss {got} vs eager {ref}"


def assert_matches_eager(losses, want, state, eager):
    """Every step's loss within 1e-5 and every final parameter within 1e-4
    of eager float32's: for well-conditioned steps only (SGD, or Adam on
    the MLP, with no gradient that is rounding noise), where eager float32
    is itself within 1e-6 of eager float64 (measured: losses 1.5e-7,
    parameters 3e-7 relative). Ill-conditioned ones are judged against
    float64 eager (reference.py)."""
    assert_losses_match(losses, want)
    for name, p in eager.named_parameters():
        assert rel(state[name], p.detach()) < 1e-4, f"{name} after {STEPS} steps"


def full_state(module):
    """Parameters and every buffer (persistent or not) by name."""
    return dict(itertools.chain(module.named_parameters(), module.named_buffers()))


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


slow = pytest.mark.slow
# (model, optimizer, mesh, zero); the slow ones run with TDX_SLOW=1.
CASES = [
    ("mlp", "sgd", "1", 0), ("mlp", "momentum", "1", 0), ("mlp", "momentum", "dp2", 0),
    ("mlp", "adam", "1", 0), ("mlp", "adamw", "dp2", 0),
    ("gpt2", "adamw", "1", 0), pytest.param("gpt2", "momentum", "1", 0, marks=slow),
    pytest.param("gpt2", "adamw", "dp2", 0, marks=slow), ("gpt2", "adamw", "tp2", 0),
    ("gpt2", "momentum", "2x2", 0),
    pytest.param("llama", "adamw", "1", 0, marks=slow), ("llama", "momentum", "dp2", 0),
    pytest.param("llama", "adamw", "2x2", 0, marks=slow),
    # ZeRO stages by placement.
    ("mlp", "adamw", "dp2", 1), ("mlp", "adamw", "dp2", 2), ("mlp", "momentum", "dp2", 3),
    pytest.param("gpt2", "adamw", "dp2", 1, marks=slow), ("gpt2", "adamw", "dp2", 3),
    ("resnet", "momentum-small", "1", 0), pytest.param("resnet", "momentum-small", "dp2", 0, marks=slow),
    ("llama-sp", "adamw", "tp2", 0), pytest.param("llama-sp", "momentum", "2x2", 0, marks=slow),
    ("llama", "momentum", "2x2", 1), pytest.param("gpt2", "momentum", "2x2", 3, marks=slow),
    pytest.param("llama", "adamw", "2x2", 3, marks=slow),
    # torch.utils.checkpoint around each block: its forward is recomputed in
    # the backward, as eager recomputes it.
    ("gpt2-ckpt", "adamw", "1", 0), ("gpt2-ckpt-nr", "adamw", "dp2", 0),
    pytest.param("gpt2-ckpt", "adamw", "dp2", 0, marks=slow),
    pytest.param("gpt2-ckpt-nr", "adamw", "1", 0, marks=slow),
]


@pytest.mark.parametrize("model,opt,mesh,zero", CASES)
def test_training_matches_eager(model, opt, mesh, zero):
    """STEPS steps of the compiled step against eager's loop.

    Adam and AdamW: the reference is eager in float64 (reference.py),
    every loss and every tensor of the final state (parameters, buffers,
    optimizer state) within twice eager float32's distance from it, plus
    1e-6 relative (losses) and ADAM_FLOOR (state: tdx's float32 bias
    corrections). Adam divides by the gradient's own scale: where the
    gradient is rounding noise (GPT-2's attention key bias: softmax ignores
    a shift of the keys) float32 steps by a good part of lr where float64
    does not move, eager's own float32 c_attn.bias ending 3.2e-4 off
    float64's (measured).

    SGD: eager float32 at fixed tolerances (losses 1e-5, parameters and
    buffers 1e-4, optimizer state 1e-3): well-conditioned, eager float32 is
    within 1.5e-7 of float64 eager's losses, 3.7e-7 of its parameters and
    5.5e-7 of its momentum; the ResNet on batches of 4 at momentum-small's
    lr within 7.2e-7 (losses), 2.0e-5 (parameters: batch norm's biases) and
    2.1e-5 (momentum), measured; float32 runs of other summation orders
    (thread counts) are up to 2.8 times that far."""
    data = batches(model)
    _, exe = compiled(model, opt, mesh, zero)
    losses, state = train_from_eagers_start(model, exe, data)
    assert len(losses) == STEPS
    if opt.startswith("adam"):
        fp32, fp64 = eager_in_float32_and_float64(model, opt, data)
        assert_losses_near_float64(losses, fp32, fp64)
        assert_state_near_float64(state, fp32, fp64, floor=ADAM_FLOOR)
        return
    eager, optimizer, want = eager_run(model, opt, data)
    assert_losses_match(losses, want)
    for name, p in eager.named_parameters():
        assert rel(state[name], p.detach()) < 1e-4, f"{name} after {STEPS} steps"
    # Buffers the step writes (batch norm's running statistics) and those it
    # only reads.
    for name, b in eager.named_buffers():
        assert rel(state[name].to(b.dtype).double(), b.double()) < 1e-4, name
    names = {id(p): n for n, p in eager.named_parameters()}
    for p, s in optimizer.state.items():
        for key, t in s.items():
            if t is None:  # SGD without momentum keeps momentum_buffer None
                continue
            # Optimizer state sums the steps' gradients, which rounding moves
            # most: ResNet's first conv measured 1.2e-4 (its step-1 gradient
            # is within 2e-8, test_first_step_applies_eagers_gradients).
            got = state[f"optimizer.{names[id(p)]}.{key}"]
            assert rel(got, t) < 1e-3, f"optimizer.{names[id(p)]}.{key}"


@pytest.mark.parametrize("model,opt,mesh", [("mlp", "momentum", "dp2"),
                                            ("gpt2", "adamw", "tp2")])
def test_gradient_clipping_matches_eagers_clip_grad_norm(model, opt, mesh):
    # max_grad_norm=0.05 clips every step here (the global norms are larger),
    # as torch.nn.utils.clip_grad_norm_ between backward and step does. On
    # tp2 each split gradient's squares sum to a Partial scalar: the norm
    # moves scalars, never gradients.
    # Reference: eager in float64 (reference.py), losses and final state
    # within twice eager float32's distance from it plus 1e-6 relative
    # (AdamW's state: ADAM_FLOOR): on GPT-2, AdamW's steps on the key bias's
    # rounding noise put eager's own float32 c_attn.bias 7.6e-6 off
    # float64's (measured).
    clip = 0.05
    data = batches(model)
    text, exe = compiled(model, opt, mesh, clip=clip)
    fp32, fp64 = eager_in_float32_and_float64(model, opt, data, clip=clip)
    losses, state = train_from_eagers_start(model, exe, data)
    assert_losses_near_float64(losses, fp32, fp64)
    assert_state_near_float64(state, fp32, fp64,
                              floor=ADAM_FLOOR if opt.startswith("adam") else 1e-6)
    _, _, unclipped = eager_run(model, opt, data)
    assert max(abs(a - b) for a, b in zip(fp32.losses, unclipped)) > 1e-4  # clipping acted
    if mesh == "tp2":
        assert "tdx.aten \"aten::norm" not in text


def tdx_dropout(program_text, data):
    """Makes an eager model's nn.Dropout modules multiply by tdx's masks: the
    k-th dropout of step c draws the k-th tdx.bernoulli of the step program
    at call c (written again from the definition in philox.py)."""
    draws = []
    for m in re.finditer(r"tdx\.bernoulli\((\S+)\) seed\((-?\d+), (\d+)\)(?: \{([^}]*)\})? : "
                         r"tensor<([\dx]+)xf32>", program_text):
        keep, seed, stream, attrs, local = m.groups()
        shape = re.search(r"global_shape = array<i64: ([\d, ]+)>", attrs or "")
        shape = shape.group(1).split(", ") if shape else local.split("x")
        draws.append((float(keep), int(seed), int(stream), tuple(map(int, shape))))
    assert draws, "the step program draws no dropout mask"
    calls = iter(range(len(data)))

    def install(model):
        at = {"call": -1, "k": len(draws)}

        def step_hook(module, args):
            assert at["k"] == len(draws), "every mask of the step was drawn"
            at["call"], at["k"] = next(calls), 0

        def masked(x):
            keep, seed, stream, shape = draws[at["k"]]
            at["k"] += 1
            assert x.shape == shape
            return x * (philox.bernoulli(keep, seed, stream, shape, call=at["call"]) / keep)

        model.register_forward_pre_hook(step_hook)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.forward = masked
    return install


@pytest.mark.parametrize("mesh", ["1", pytest.param("dp2", marks=slow),
                                  pytest.param("tp2", marks=slow), pytest.param("2x2", marks=slow)])
def test_dropout_training_matches_eager_with_the_same_masks(mesh):
    # GPT-2 with dropout 0.1 on the embeddings, attention probabilities and
    # both residual branches. Each rank draws only its box of each mask, and
    # the boxes make the definition's global mask on every layout: the step
    # is eager's with those masks.
    model, opt = "gpt2-dropout", "momentum"
    data = batches(model)
    text, exe = compiled(model, opt, mesh)
    eager, optimizer, want = eager_run(model, opt, data, tdx_dropout(text, data))
    losses, state = train_from_eagers_start(model, exe, data)
    assert_matches_eager(losses, want, state, eager)
    # Dropout took effect: without it the losses differ.
    _, _, plain = eager_run("gpt2", opt, data)
    assert max(abs(a - b) for a, b in zip(losses, plain)) > 1e-3


# The foldings of a 2x2 (dp, tp) mesh: the mesh axes each run inside a rank.
FOLDINGS = {"1": ("dp", "tp"), "dp2": ("tp",), "tp2": ("dp",), "2x2": ()}


def folded_exe(model, opt, fold):
    build, loss_fn = MODELS[model]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    optimizer = OPTIMIZERS[opt](deferred.parameters())
    prog = tdx.trace_train_step(deferred, optimizer, loss_fn, *batches(model)[0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp")), PLANS[model],
                    data_parallel="dp", fold=fold)
    return prog.mlir, prog.world_size, tdx.compile(prog)


def test_dropout_training_is_bitwise_the_same_on_every_folding_of_a_mesh(tmp_path):
    # GPT-2 with dropout 0.1, 10 SGD-momentum steps of the 2x2 mesh's
    # program on 1 process, on 2 (dp or tp), and on 4: every rank computes the
    # whole mesh's ops with their shapes and adds what a folded axis reduces
    # in one order, so losses and final state are bitwise equal.
    model, opt = "gpt2-dropout", "momentum"
    data = batches(model)
    runs, exes = {}, {}
    torch.manual_seed(0)
    start = {k: v.detach() for k, v in full_state(MODELS[model][0]()).items()}
    for layout, fold in FOLDINGS.items():
        text, world, exes[layout] = folded_exe(model, opt, fold)
        assert world == {"1": 1, "dp2": 2, "tp2": 2, "2x2": 4}[layout]
        runs[layout] = exes[layout].train(data, params=start, threads=1)
    losses, state = runs["2x2"]
    for layout, (got_losses, got_state) in runs.items():
        assert got_losses == losses, layout
        assert got_state.keys() == state.keys()
        for name, t in state.items():
            assert torch.equal(got_state[name], t), (layout, name)
    # Saved on 1 process after 5 steps and resumed on 4: the same run, bitwise.
    first, _ = exes["1"].train(data[:5], params=start, threads=1, checkpoint=tmp_path)
    rest, resumed = exes["2x2"].train(data, threads=1, checkpoint=tmp_path, resume=True)
    assert first + rest == losses
    assert all(torch.equal(resumed[name], t) for name, t in state.items())
    # Each is eager's step with the same masks (within eager's tolerances).
    eager, _, want = eager_run(model, opt, data, tdx_dropout(text, data))
    assert_matches_eager(losses, want, state, eager)
    # Unfolded layouts sum in other orders: the plain 1-rank program's losses
    # differ from 2x2's (the mesh folded on no axis) in the last bits.
    plain, _ = train_from_eagers_start(model, compiled(model, opt, "1")[1], data)
    assert plain != losses and max(abs(a - b) for a, b in zip(plain, losses)) < 1e-4


def test_fold_names_mesh_axes():
    prog = tdx.trace(tdx.deferred_init(mlp), torch.zeros(4, 8))
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp"))
    with pytest.raises(ValueError, match=r"fold names mesh axis 'pp', but the mesh's axes are "
                                         r"\['dp', 'tp'\]"):
        tdx.parallelize(prog, mesh, {}, data_parallel="dp", fold=("pp",))
    with pytest.raises(ValueError, match="fold names an axis twice"):
        tdx.parallelize(prog, mesh, {}, data_parallel="dp", fold=("dp", "dp"))
    tdx.parallelize(prog, mesh, {}, data_parallel="dp", fold="dp")
    assert prog.world_size == 2 and prog.mesh.size() == 4
    assert "ranks = [1, 2]" in prog.mlir
    with pytest.raises(tdx.TdxError, match=r"runs on 2 process\(es\) \(its mesh's devices, less "
                                           r"folded axes\) but nprocs=4"):
        tdx.compile(prog).run(torch.zeros(4, 8), nprocs=4)


def test_a_folded_axis_communicates_nothing():
    # The MLP's step on a 2x2 (dp, tp) Megatron mesh: folding dp leaves the tp
    # all_reduce of each batch half (the whole mesh's, once per half); folding
    # tp leaves the dp gradient all_reduces, each tp shard's on its own;
    # folding both leaves nothing.
    def report(fold):
        torch.manual_seed(0)
        deferred = tdx.deferred_init(mlp)
        prog = tdx.trace_train_step(deferred, torch.optim.SGD(deferred.parameters(), lr=0.1),
                                    mlp_loss, *batches("mlp")[0])
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp")),
                        {"0": tdx.ColwiseParallel(), "2": tdx.RowwiseParallel()},
                        data_parallel="dp", fold=fold)
        return [(e["kind"], tuple(e["mesh_axes"]), e["bytes"]) for e in prog.comm_report()]

    whole = report(())
    assert ("all_reduce", ("tp",), 16 * 4 * 4 // 2) in whole
    assert report(("dp",)) == [("all_reduce", ("tp",), 16 * 4 * 4 // 2)] * 2
    by_tp = report(("tp",))
    assert {axes for _, axes, _ in by_tp} == {("dp",)}
    # Every byte of the whole mesh's dp reductions, for both tp shards.
    dp_bytes = sum(b for _, axes, b in whole if axes == ("dp",))
    split = (32 * 8 + 32 + 4 * 32) * 4 // 2  # a tp shard of each split parameter
    assert sum(b for _, _, b in by_tp) == dp_bytes + split
    assert report(("dp", "tp")) == []


def test_dropout_mask_is_the_definitions_box_on_every_layout():
    # A forward in training mode, run 3 times: the third call's mask on one
    # rank and on 2x2 with an uneven split is bitwise the definition's.
    class Drop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(10))
            self.drop = torch.nn.Dropout(0.3)

        def forward(self, x):
            return self.drop(x) * self.scale

    x = torch.randn(7, 10)
    prog = tdx.trace(tdx.deferred_init(Drop), x)
    [(seed, stream)] = re.findall(r"tdx\.bernoulli\(\S+\) seed\((-?\d+), (\d+)\)", prog.mlir)
    want = x * (philox.bernoulli(0.7, int(seed), int(stream), (7, 10), call=2) / 0.7)
    assert 0 < (want == 0).sum() < want.numel()
    assert torch.equal(tdx.compile(prog.copy()).run(x, steps=3)[0], want)
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp"))
    prog.annotate("input:0", mesh, [tdx.Shard(1), tdx.Shard(0)])
    prog.propagate()
    prog.partition()
    assert "global_shape = array<i64: 7, 10>" in prog.mlir
    assert torch.equal(tdx.compile(prog).run(x, steps=3)[0], want)
    # Another call draws another mask.
    other = x * (philox.bernoulli(0.7, int(seed), int(stream), (7, 10), call=0) / 0.7)
    assert not torch.equal(other, want)


@pytest.mark.parametrize("model", ["gpt2", pytest.param("resnet", marks=slow)])
def test_first_step_applies_eagers_gradients(model):
    """One plain SGD step: the change of a parameter is -lr times its
    gradient. A large lr keeps float rounding of the update far below the
    change, so the changes compare the gradients. Reference: eager's
    gradients in float64 (reference.py), each within twice eager float32's
    distance from them plus 1e-6 relative. GPT-2's float32 gradients are
    within 5e-7 of float64's; the ResNet's batch norm over 4 samples of
    layer4's 1x1 maps puts eager float32's bn biases' 1.5e-5 off (measured)."""
    build, loss_fn = MODELS[model]
    data = batches(model)[:1]
    lr = 1e3
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    prog = tdx.trace_train_step(deferred, torch.optim.SGD(deferred.parameters(), lr=lr),
                                loss_fn, *data[0])
    exe = tdx.compile(prog)
    torch.manual_seed(0)
    eager = build()
    start = {k: v.detach().clone() for k, v in full_state(eager).items()}
    wide = in_float64(eager)
    loss_fn(eager, *data[0]).backward()
    loss_fn(wide, *batch_in(torch.float64, data[0])).backward()
    _, state = exe.train(data, params=start)
    names = [name for name, _ in eager.named_parameters()]
    got = {n: (start[n].double() - state[n].double()) / lr for n in names}
    assert_state_near_float64(got, {n: p.grad for n, p in eager.named_parameters()},
                              {n: p.grad for n, p in wide.named_parameters()}, what="gradient")


def sym(name):
    """A symbol as MLIR prints it: quoted unless it is an identifier."""
    return name if re.fullmatch(r"[A-Za-z_][\w.$]*", name) else f'"{name}"'


def test_train_step_program_writes_every_state_once():
    text, _ = compiled("mlp", "momentum", "1")
    assert "func.func @train_step(" in text
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        buf = f"optimizer.{name}.momentum_buffer"
        assert text.count(f"tdx.assign @{sym(name)},") == 1, name
        assert f"tdx.buffer @{sym(buf)} :" in text, buf
        assert text.count(f"tdx.assign @{sym(buf)},") == 1, buf
    # Backward ops are in the step (libtorch's formulas, recorded).
    assert "tdx.matmul" in text


def test_unsupported_optimizers_and_misuse_are_named():
    torch.manual_seed(0)
    model = tdx.deferred_init(mlp)
    x, y = batches("mlp")[0]
    with pytest.raises(tdx.CaptureError, match="RMSprop is not supported yet"):
        tdx.trace_train_step(model, torch.optim.RMSprop(model.parameters()), mlp_loss, x, y)
    with pytest.raises(tdx.CaptureError, match="foreach=False"):
        tdx.trace_train_step(model, torch.optim.AdamW(model.parameters(), foreach=True),
                             mlp_loss, x, y)
    with pytest.raises(tdx.CaptureError, match="dampening=0"):
        tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                                                    dampening=0.5), mlp_loss, x, y)
    with pytest.raises(tdx.CaptureError, match="not a parameter of the model"):
        tdx.trace_train_step(model, torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1),
                             mlp_loss, x, y)
    with pytest.raises(tdx.CaptureError, match="scalar"):
        tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             lambda m, x, y: m(x), x, y)
    with pytest.raises(ValueError, match="max_grad_norm must be a positive number"):
        tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), mlp_loss, x, y,
                             max_grad_norm=0)
    with pytest.raises(TypeError, match="torch.optim optimizer"):
        tdx.trace_train_step(model, None, mlp_loss, x, y)
    # The module is unchanged by the failed traces: a good one still works.
    prog = tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), mlp_loss, x, y)
    assert "tdx.assign" in prog.mlir


def test_a_backward_op_without_a_cuda_lowering_is_named():
    # The CPU backend runs every backward op libtorch dispatches (generic ops
    # through ATen); the CUDA backend runs those of its list
    # (tdx/Runtime/cuda/AtenOps.def) and names the first other one, with
    # what to do. hardswish_backward is not on the list.
    torch.manual_seed(0)
    model = tdx.deferred_init(lambda: torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Hardswish(), torch.nn.Linear(32, 4)))
    prog = tdx.trace_train_step(model, OPTIMIZERS["sgd"](model.parameters()), mlp_loss,
                                *batches("mlp")[0])
    with pytest.raises(tdx.TdxError,
                       match=r"\(aten::hardswish_backward\) has no CUDA lowering.*--target cpu"):
        tdx.compile(prog, target="cuda")


def test_train_needs_batches_and_the_cpu_binary_checks_options(tmp_path):
    _, exe = compiled("mlp", "sgd", "1")
    with pytest.raises(ValueError, match="at least one batch"):
        exe.train([])
    # Every batch is checked against the step's inputs before any rank starts.
    with pytest.raises(tdx.InputError, match=re.escape(
            "batch 0 has 1 input(s) but the program takes 2: input 0: torch.float32 of shape "
            "(16, 8), input 1: torch.int64 of shape (16,)")):
        exe.train([(torch.randn(16, 8),)])
    good = (torch.randn(16, 8), torch.randint(0, 4, (16,)))
    with pytest.raises(tdx.InputError, match=re.escape(
            "batch 1: input 1 is torch.int32 of shape (16,); the program was traced for "
            "torch.int64 of shape (16,)")):
        exe.train([good, (good[0], good[1].int())])


@pytest.mark.parametrize("opt", ["momentum", "adamw"])
def test_data_parallel_step_all_reduces_each_gradient_once(opt):
    # DDP's communication and nothing else: one all_reduce per parameter
    # gradient with its bytes, plus the loss's sum and its target count
    # (4 bytes each). The backward's own ops keep the batch split.
    torch.manual_seed(0)
    model = tdx.deferred_init(mlp)
    prog = tdx.trace_train_step(model, OPTIMIZERS[opt](model.parameters()), mlp_loss,
                                *batches("mlp")[0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    report = prog.comm_report()
    assert {r["kind"] for r in report} == {"all_reduce"}, report
    grads = sorted(p.numel() * 4 for p in mlp().parameters())
    assert sorted(r["bytes"] for r in report) == sorted(grads + [4, 4])


def test_tied_weight_gradient_is_all_reduced_once():
    # GPT-2 ties lm_head.weight to wte.weight: its two gradient
    # contributions (the head's matmul and the embedding's backward) are
    # summed while Partial and reduced once. DP moves each gradient once
    # (wpe's only for the 8 of 16 positions the batch uses), plus the loss.
    torch.manual_seed(0)
    model = tdx.deferred_init(GPT2)
    prog = tdx.trace_train_step(model, OPTIMIZERS["adamw"](model.parameters()), lm_loss,
                                *batches("gpt2")[0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    report = prog.comm_report()
    assert {r["kind"] for r in report} == {"all_reduce"}
    grads = {n: p.numel() * 4 for n, p in GPT2().named_parameters()}
    assert len(report) == len(grads) + 2
    used_wpe = 8 * 32 * 4
    assert sum(r["bytes"] for r in report) == sum(grads.values()) - grads["wpe.weight"] + used_wpe + 8


@pytest.mark.parametrize("opt", ["momentum", "adamw"])
def test_tensor_parallel_step_all_reduces_four_activations_per_layer(opt):
    # Megatron on tp2, the whole step: per layer the forward all_reduces the
    # attention's and the MLP's output, the backward the gradients of their
    # inputs (the q/k/v and gate/up partial gradients summed first), each
    # [4, 8, 32] floats; heads stay split through the attention's backward
    # and the rotary embedding's. Nothing else moves: the weights are split.
    torch.manual_seed(0)
    model = tdx.deferred_init(Llama)
    prog = tdx.trace_train_step(model, OPTIMIZERS[opt](model.parameters()), lm_loss,
                                *batches("llama")[0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)), LLAMA_PLAN)
    report = prog.comm_report()
    layers = 2
    assert [(r["kind"], r["bytes"]) for r in report] == [("all_reduce", 4 * 8 * 32 * 4)] * 4 * layers


def test_sequence_parallel_step_reduce_scatters_and_gathers_activations():
    # Megatron sequence parallelism over the whole step: each of the four
    # activation all_reduces per layer of tensor parallelism becomes a
    # reduce_scatter of the partial sums plus an all_gather of half the
    # bytes (and one gather of the final norm's output for the head).
    # What is still all-reduced is gradients of weights the plan
    # replicates: the norms' (applied to split sequences) and the head's.
    torch.manual_seed(0)
    model = tdx.deferred_init(Llama)
    prog = tdx.trace_train_step(model, OPTIMIZERS["sgd"](model.parameters()), lm_loss,
                                *batches("llama")[0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)), LLAMA_SP_PLAN)
    report = prog.comm_report()
    layers, activation = 2, 4 * 8 * 32 * 4
    by_kind = lambda k: sorted(r["bytes"] for r in report if r["kind"] == k)
    assert by_kind("reduce_scatter") == [activation] * 4 * layers
    assert by_kind("all_gather") == [activation // 2] * (4 * layers + 1)
    replicated = sorted(p.numel() * 4 for n, p in Llama().named_parameters()
                        if "norm" in n or n == "output.weight")
    assert by_kind("all_reduce") == replicated
