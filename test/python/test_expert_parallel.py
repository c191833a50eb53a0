"""Expert parallelism (tdx.ExpertParallel, issue 55): Hugging Face's
Mixtures of Experts (test_hf_models.py's rows, unchanged, default grouped_mm
experts) with their routed experts split over an ep axis, trained from the
runner on ep2 and dp2 x ep2 against eager on one process."""

import pytest
import torch

import tdx
from test_hf_models import MODELS, data, loss_fn_of
from test_training import eager_steps

PLAN = {"model.layers.*.mlp.experts": tdx.ExpertParallel("ep")}
LAYOUTS = {"ep2": ((2,), ("ep",)), "dp2xep2": ((2, 2), ("dp", "ep"))}


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def traced(name, batches):
    build, kind = MODELS[name]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    return tdx.trace_train_step(deferred, sgd(deferred.parameters()), loss_fn_of(kind),
                                *batches[0])


def placed(name, layout, batches):
    prog = traced(name, batches)
    shape, axes = LAYOUTS[layout]
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), PLAN,
                    data_parallel="dp" if "dp" in axes else None)
    return prog


@pytest.mark.parametrize("name,layout", [(n, "ep2") for n in
                                         ("qwen3-moe", "mixtral", "olmoe", "deepseek-v3",
                                          "gpt-oss")] +
                         [("qwen3-moe", "dp2xep2"), ("gpt-oss", "dp2xep2")])
def test_expert_parallel_trains_like_eager(name, layout):
    build, kind = MODELS[name]
    batches = data(kind)
    torch.manual_seed(0)
    model = build()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    want = eager_steps(model, sgd(model.parameters()), loss_fn_of(kind), batches)
    prog = placed(name, layout, batches)
    assert prog.expert_parallel == "ep"
    # Each rank holds half the experts.
    experts = [line for line in prog.copy().propagate().mlir.splitlines()
               if line.lstrip().startswith("tdx.parameter") and "mlp.experts." in line]
    assert experts and all("Shard(0)" in line for line in experts), experts
    with tdx.compile(prog, opt_level=0).start(params=start) as runner:
        losses = [runner.train_step(*batch).item() for batch in batches]
        state = runner.state_dict()
    for k, (got, ref) in enumerate(zip(losses, want)):
        assert abs(got - ref) <= 1e-5 * abs(ref), f"step {k}: loss {got} vs eager {ref}"
    for param, p in model.named_parameters():
        err = ((state[param] - p.detach()).norm() / p.detach().norm()).item()
        assert err < 1e-4, f"{param}: {err:.2e} from eager after {len(batches)} steps"
    mine = build()
    mine.load_state_dict(state, strict=True)


def test_the_dispatch_moves_the_dropless_buffer_over_ep():
    batches = data("lm")
    prog = placed("qwen3-moe", "ep2", batches)
    moved = [r for r in prog.comm_report() if r["kind"] == "all_to_all"]
    assert {tuple(r["mesh_axes"]) for r in moved} == {("ep",)}
    # A rank's 16 tokens (4 x 8 over ep2) with top-2 of 2 local experts:
    # room for 16 * min(2, 2) rows from each of the 2 ranks, 32 wide in
    # float32 (the ids and routing weights beside them, 8 bytes and 4 a row).
    rows = 2 * 16 * min(2, 2)
    hidden = [r["bytes"] for r in moved if r["bytes"] == rows * 32 * 4]
    # Forward: there and back; backward: the adjoints of both; 2 MoE layers.
    assert len(hidden) == 2 * 2 * 2, moved
    assert {r["bytes"] for r in moved} <= {rows * 32 * 4, rows * 8, rows * 4}, moved


def test_expert_parallel_refusals_name_the_fix():
    batches = data("lm")
    mesh3 = tdx.init_device_mesh("cpu", (3,), ("ep",))
    with pytest.raises(tdx.CaptureError, match=r"Qwen3MoeExperts has 4 experts, which do not "
                                               r"split evenly over the 3 ranks of 'ep'"):
        tdx.parallelize(traced("qwen3-moe", batches), mesh3, PLAN)
    mesh = tdx.init_device_mesh("cpu", (2,), ("ep",))
    with pytest.raises(ValueError, match=r"'nothing' \(ExpertParallel\) matches no module; "
                                         r"experts modules are named like \['model.layers.0"):
        tdx.parallelize(traced("qwen3-moe", batches), mesh, {"nothing": tdx.ExpertParallel()})
    with pytest.raises(ValueError, match=r"names Qwen3MoeAttention, which is not a Hugging Face "
                                         r"experts module"):
        tdx.parallelize(traced("qwen3-moe", batches), mesh,
                        {"model.layers.*.self_attn": tdx.ExpertParallel()})
    prog = traced("qwen3-moe", batches)
    tdx.parallelize(prog, mesh, {}, data_parallel="ep")
    with pytest.raises(tdx.CaptureError, match=r"freshly traced program"):
        tdx.parallelize(prog, mesh, PLAN)
