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
