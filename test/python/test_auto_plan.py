"""tdx.auto_parallelize: plans chosen by the cost model, in the form
tdx.parallelize takes, on models written the usual way."""

import pytest
import torch

import tdx
from test_sharding import GPT2_PLAN, LLAMA_PLAN
from test_training import LLAMA_SP_PLAN, MODELS, OPTIMIZERS, batches, compiled

PLANS = {"gpt2": GPT2_PLAN, "llama": LLAMA_PLAN}


def fresh(model, opt="adamw"):
    build, loss_fn = MODELS[model]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    return tdx.trace_train_step(deferred, OPTIMIZERS[opt](deferred.parameters()), loss_fn,
                                *batches(model)[0])


def styles(plan):
    return {pattern: (type(style).__name__, style.mesh_axis) for pattern, style in plan.items()}


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_the_tensor_parallel_plan_found_is_megatrons(model):
    # The pairs tdx-linear-pairs finds in the traced step (GPT-2's fused
    # qkv and MLP; LLaMA's q, k, v, o and SwiGLU's gate, up, down) are the
    # hand plans the other tests use, one decision per repeated layer.
    # The other candidate adds sequence parallelism on the norms before the
    # column-parallel layers: LLaMA's is the hand plan of the SP tests; at
    # these sizes its extra collectives cost more than the memory it saves,
    # and Megatron's plan is chosen.
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp"))
    chosen = tdx.auto_parallelize(fresh(model), mesh)
    assert styles(chosen["plan"]) == styles(PLANS[model]), chosen
    assert chosen["data_parallel"] == "dp" and chosen["zero"] in (0, 1, 3)
    from tdx.auto import _tensor_parallel_plans
    candidates = _tensor_parallel_plans(fresh(model), "tp")
    assert len(candidates) == 2 and styles(candidates[0]) == styles(PLANS[model])
    assert {type(s).__name__ for s in candidates[1].values()} == {
        "ColwiseParallel", "RowwiseParallel", "SequenceParallel"}
    if model == "llama":
        assert styles(candidates[1]) == styles(LLAMA_SP_PLAN)


# Slow (two GPT-2 binaries at -O2): the default tier trains an auto plan in
# test_a_memory_budget_moves_the_choice_to_what_fits.
@pytest.mark.slow
def test_an_auto_plan_trains_as_the_same_hand_plan():
    # GPT-2's step on (dp 2, tp 2): the auto plan, compiled and run, gives
    # bitwise the losses and state of the hand plan it chose (the hand
    # plans match eager: test_training.py).
    prog = fresh("gpt2")
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp"))
    chosen = tdx.auto_parallelize(prog, mesh)
    assert chosen["zero"] == 0, chosen
    data = batches("gpt2")[:3]
    losses, state = tdx.compile(prog).train(data)
    want, want_state = compiled("gpt2", "adamw", "2x2")[1].train(data)
    assert losses == want
    assert all(torch.equal(state[k], want_state[k]) for k in want_state)


def test_a_memory_budget_moves_the_choice_to_what_fits():
    # LLaMA on dp2: unconstrained, the cost model keeps the cheapest step
    # (ZeRO-0: one all_reduce per gradient, where ZeRO-1 adds a gather per
    # parameter); under a budget below its peak and above ZeRO-1's, ZeRO-1
    # (optimizer state split); below ZeRO-1's and above ZeRO-3's, ZeRO-3
    # (parameters split too), which trains.
    mesh = tdx.init_device_mesh("cpu", (2,), ("dp",))
    free = fresh("llama")
    first = tdx.auto_parallelize(free, mesh)
    assert first["zero"] == 0, first
    peaks = [free.memory_report()["peak"]] + [
        tdx.parallelize(fresh("llama"), mesh, {}, data_parallel="dp", zero=z)
        .memory_report()["peak"] for z in (1, 3)]
    assert peaks[2] < peaks[1] < peaks[0], peaks
    budget = (peaks[0] + peaks[1]) // 2
    assert tdx.auto_parallelize(fresh("llama"), mesh, memory_budget=budget)["zero"] == 1
    budget = (peaks[1] + peaks[2]) // 2
    tight = fresh("llama")
    chosen = tdx.auto_parallelize(tight, mesh, memory_budget=budget)
    assert chosen["zero"] == 3 != first["zero"], (first, chosen)
    assert tight.memory_report()["peak"] <= budget
    # It trains: bitwise the hand-placed ZeRO-3 step (which matches eager).
    data = batches("llama")[:3]
    losses, state = tdx.compile(tight).train(data)
    want, want_state = compiled("llama", "adamw", "dp2", 3)[1].train(data)
    assert losses == want
    assert all(torch.equal(state[k], want_state[k]) for k in want_state)
    # Deterministic: the same program and mesh, the same plan and program.
    again = fresh("llama")
    assert repr(tdx.auto_parallelize(again, mesh, memory_budget=budget)) == repr(chosen)
    assert again.mlir == tight.mlir


def test_a_pipeline_axis_gets_a_pipeline():
    """(pp 2, dp 2): the pipeline (schedule, micro-batches) is chosen by the
    cost model's timeline, the stages by cost; what is returned places a
    fresh program exactly as auto_parallelize placed this one, and a forward
    (no training step) is refused."""
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("pp", "dp"))
    prog = fresh("gpt2")
    chosen = tdx.auto_parallelize(prog, mesh)
    pipeline = chosen["pipeline"]
    assert isinstance(pipeline, tdx.Pipeline) and pipeline.mesh_axis == "pp"
    # The batch of 4 splits into 2 or 4 micro-batches; more micro-batches
    # shrink the bubble, so the cost model takes 4.
    assert pipeline.microbatches == 4 and chosen["data_parallel"] == "dp"
    again = tdx.parallelize(fresh("gpt2"), mesh, **chosen)
    assert again.mlir == prog.mlir
    forward = tdx.trace(tdx.deferred_init(MODELS["gpt2"][0]), torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="'pp' is a pipeline, which splits a training step"):
        tdx.auto_parallelize(forward, mesh)


def test_auto_parallelize_names_what_it_cannot_do():
    with pytest.raises(ValueError, match="axis 'x' is neither data parallel"):
        tdx.auto_parallelize(fresh("gpt2"), tdx.init_device_mesh("cpu", (2,), ("x",)))
    placed = tdx.parallelize(fresh("gpt2"), tdx.init_device_mesh("cpu", (2,), ("dp",)), {},
                             data_parallel="dp")
    with pytest.raises(ValueError, match="not placed yet"):
        tdx.auto_parallelize(placed, tdx.init_device_mesh("cpu", (2,), ("dp",)))
    lone = tdx.trace(tdx.deferred_init(torch.nn.Linear, 8, 4), torch.zeros(2, 8))
    with pytest.raises(ValueError, match="no pair of linear layers to split over 'tp'"):
        tdx.auto_parallelize(lone, tdx.init_device_mesh("cpu", (2,), ("tp",)))
    with pytest.raises(ValueError, match="positive number of bytes"):
        tdx.auto_parallelize(fresh("gpt2"), tdx.init_device_mesh("cpu", (2,), ("dp",)),
                             memory_budget=0)


class Conv1D(torch.nn.Module):
    """Hugging Face's transformers.pytorch_utils.Conv1D, as modeling_gpt2
    uses it: a weight stored (in, out) and torch.addmm of the flattened
    input (transformers is not a dependency of this suite yet)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = torch.nn.Parameter(torch.empty(nx, nf))
        self.bias = torch.nn.Parameter(torch.zeros(nf))
        torch.nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class GPT2MLP(torch.nn.Module):
    """modeling_gpt2's GPT2MLP: c_fc, gelu (tanh), c_proj, all Conv1D."""

    def __init__(self, d):
        super().__init__()
        self.c_fc = Conv1D(4 * d, d)
        self.c_proj = Conv1D(d, 4 * d)

    def forward(self, x):
        return self.c_proj(torch.nn.functional.gelu(self.c_fc(x), approximate="tanh"))


class Conv1DBlock(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_2 = torch.nn.LayerNorm(d)
        self.mlp = GPT2MLP(d)

    def forward(self, x):
        return x + self.mlp(self.ln_2(x))


class Conv1DMLPs(torch.nn.Module):
    """GPT-2's MLP blocks with their pre-norms and residuals, between an
    embedding and a head."""

    def __init__(self, vocab=64, d=32, layers=2):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.h = torch.nn.ModuleList(Conv1DBlock(d) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.wte(ids)
        for block in self.h:
            h = block(h)
        return self.head(h)


def test_conv1d_layers_stored_in_out_are_split_as_pairs():
    # The pairs of Hugging Face's Conv1D (weights stored (in, out)) are
    # found, each split on its stored layout's dims (column: Shard(1), row:
    # Shard(0)), and the step on (dp 2, tp 2) trains as eager does.
    def loss_fn(model, ids, targets):
        return torch.nn.functional.cross_entropy(model(ids).reshape(-1, 64), targets.reshape(-1))

    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 64, (4, 8), generator=g), torch.randint(0, 64, (4, 8), generator=g))
            for _ in range(2)]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(Conv1DMLPs)
    prog = tdx.trace_train_step(deferred, torch.optim.SGD(deferred.parameters(), lr=0.1),
                                loss_fn, *data[0])
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp"))
    chosen = tdx.auto_parallelize(prog, mesh)
    plan = chosen["plan"]
    assert {p: (type(s).__name__, s.in_out) for p, s in plan.items()} == {
        "h.*.mlp.c_fc": ("ColwiseParallel", True), "h.*.mlp.c_proj": ("RowwiseParallel", True)}, plan
    assert str(plan["h.*.mlp.c_fc"].placements["weight"]) == str(tdx.Shard(1))
    assert str(plan["h.*.mlp.c_proj"].placements["weight"]) == str(tdx.Shard(0))
    torch.manual_seed(0)
    eager = Conv1DMLPs()
    start = {k: v.detach().clone() for k, v in eager.state_dict().items()}
    losses, _ = tdx.compile(prog).train(data, params=start)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for (x, y), got in zip(data, losses):
        opt.zero_grad()
        loss = loss_fn(eager, x, y)
        loss.backward()
        opt.step()
        assert abs(got - loss.item()) <= 1e-5 * abs(loss.item()), (got, loss.item())
