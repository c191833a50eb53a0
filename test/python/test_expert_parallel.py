"""Expert parallelism (tdx.ExpertParallel, issue 55): Hugging Face's
Mixtures of Experts (test_hf_models.py's rows, unchanged, default grouped_mm
experts) with their routed experts split over an ep axis, trained from the
runner on ep2 and dp2 x ep2 against eager on one process."""

import re

import pytest
import torch

import tdx
from test_hf_models import MODELS, data, loss_fn_of
from test_training import eager_steps

PLAN = {"model.layers.*.mlp.experts": tdx.ExpertParallel("ep")}
LAYOUTS = {"ep2": ((2,), ("ep",)), "dp2xep2": ((2, 2), ("dp", "ep")),
           "dp2xep2-zero1": ((2, 2), ("dp", "ep"))}


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
                    data_parallel="dp" if "dp" in axes else None,
                    zero=1 if layout.endswith("zero1") else 0)
    return prog


def trained_like_eager(prog, start, want, batches, model=None):
    """Trains `prog` from the runner on the weights `start`: its losses
    within 1e-5 of eager's `want` and, given `model` (eager's after the
    same steps), its parameters within 1e-4. Returns the runner's state."""
    with tdx.compile(prog, opt_level=0).start(params=start) as runner:
        losses = [runner.train_step(*batch).item() for batch in batches]
        state = runner.state_dict()
    for k, (got, ref) in enumerate(zip(losses, want)):
        assert abs(got - ref) <= 1e-5 * abs(ref), f"step {k}: loss {got} vs eager {ref}"
    for param, p in (model.named_parameters() if model is not None else ()):
        err = ((state[param] - p.detach()).norm() / p.detach().norm()).item()
        assert err < 1e-4, f"{param}: {err:.2e} from eager after {len(batches)} steps"
    return state


@pytest.mark.parametrize("name,layout", [(n, "ep2") for n in
                                         ("qwen3-moe", "mixtral", "olmoe", "deepseek-v3",
                                          "gpt-oss")] +
                         [("qwen3-moe", "dp2xep2"), ("gpt-oss", "dp2xep2"),
                          ("qwen3-moe", "dp2xep2-zero1")])
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
    if layout.endswith("zero1"):
        # ZeRO-1 splits the experts' momentum over dp on another dim than
        # ep's: [Shard(1), Shard(0)].
        momentum = [line for line in prog.copy().propagate().mlir.splitlines()
                    if line.lstrip().startswith("tdx.buffer") and "mlp.experts." in line
                    and "momentum" in line]
        assert momentum and all("[Shard(1), Shard(0)]" in line for line in momentum), momentum
    state = trained_like_eager(prog, start, want, batches, model)
    mine = build()
    mine.load_state_dict(state, strict=True)


def test_the_dispatch_moves_the_routed_rows_over_ep():
    batches = data("lm")
    prog = placed("qwen3-moe", "ep2", batches)
    report = prog.comm_report()
    moved = [r for r in report if r["kind"] == "ragged_all_to_all"]
    assert {tuple(r["mesh_axes"]) for r in moved} == {("ep",)}
    # A rank's 16 tokens (4 x 8 over ep2), top-2: 32 (token, expert) pairs
    # go out and come back, 32 wide in float32, not the dropless buffer's
    # 2 x 16 x min(2, 2) = 64 rows; the ids (int64) and routing weights
    # beside them.
    pairs, hidden = 16 * 2, 32
    rows = [r for r in moved if r["bytes"] == pairs * hidden * 4]
    # Forward: there and back; backward: the adjoints of both; 2 MoE layers.
    assert len(rows) == 2 * 2 * 2, moved
    assert {r["bytes"] for r in moved} == {pairs * hidden * 4, pairs * 8, pairs * 4}, moved
    # The offsets: one all_to_all of the 2 send sizes (int64) per layer.
    sizes = [r for r in report if r["kind"] == "all_to_all"]
    assert [r["bytes"] for r in sizes] == [2 * 8] * 2, sizes
    # The emitted program passes the sizes to the collective as tensors:
    # nothing reads them back on the host between the ops.
    exe = tdx.compile(prog, opt_level=0, keep_source=True)
    with open(exe.path + ".cpp") as f:
        source = f.read()
    calls = [line for line in source.splitlines() if "ctx.startRaggedAllToAll(" in line]
    assert 8 <= len(calls) <= len(moved), calls   # the backend may drop an unused adjoint
    for call in calls:
        args = re.search(r"RaggedAllToAll\(([^)]*)\)", call).group(1).split(", ")
        for v in args[1:5]:      # the offsets and sizes: tensors, never read here
            assert re.fullmatch(r"v\d+", v), call
            assert not re.search(rf"\b{v}\.(item|tolist|data_ptr|cpu)\b", source), (v, call)


def _routing_of(model):
    """Each MoE layer's top-k experts for the model's tokens: (layers, T, k)."""
    experts = [m for n, m in model.named_modules() if n.endswith("mlp.experts")]

    class Routing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            picked = []
            hooks = [m.register_forward_pre_hook(lambda m, args: picked.append(args[1]))
                     for m in experts]
            try:
                self.model(ids, use_cache=False)
            finally:
                for h in hooks:
                    h.remove()
            return torch.stack(picked)
    return Routing()


def test_the_router_picks_eagers_experts_under_expert_parallel():
    # Qwen3-MoE's routers scaled up so that every token's k-th and
    # (k+1)-th logits are apart; the top-k of each MoE layer, forward only
    # on dp2 x ep2, against eager's.
    build, kind = MODELS["qwen3-moe"]
    ids = data(kind)[0][0]

    def separated():
        model = build().eval()
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.gate.weight.mul_(40)
        return model
    torch.manual_seed(0)
    model = separated()
    logits = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, out: logits.append(out[0]))
             for layer in model.model.layers]
    with torch.no_grad():
        want = _routing_of(model)(ids)
    for h in hooks:
        h.remove()
    top = torch.cat(logits).sort(-1, descending=True).values
    assert (top[:, 1] - top[:, 2]).min() > 1e-3, "the logits are not apart"
    torch.manual_seed(0)
    deferred = _routing_of(tdx.deferred_init(separated))
    prog = tdx.trace(deferred, ids)
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("dp", "ep")),
                    {"model.model.layers.*.mlp.experts": tdx.ExpertParallel("ep")},
                    data_parallel="dp")
    params = {f"model.{k}": v for k, v in [*model.state_dict().items(), *model.named_buffers()]}
    got = tdx.compile(prog, opt_level=0).run(ids, params=params)[0]
    assert got.shape == want.shape
    assert int((got != want).sum()) == 0


def _kept(index, cap, num_experts):
    """1.0 for the (token, expert) pairs of `index` (T, k) within each
    expert's first `cap`, in token order; 0.0 for the dropped."""
    flat = torch.nn.functional.one_hot(index.reshape(-1), num_experts)
    place = (flat.cumsum(0) * flat).sum(-1) - 1
    return (place < cap).reshape(index.shape)


@pytest.mark.parametrize("layout,factor", [("ep2", 0.5), ("dp2xep2", 0.75), ("ep2", 2.0)])
def test_capacity_factor_drops_what_overflows_and_counts_it(layout, factor):
    # Each rank's pairs past an expert's capacity are dropped: against eager
    # with the same pairs' routing weights zeroed (what dropping does to
    # the output and the gradients), and the per-expert counts against a
    # count in Python on eager's routing of each rank's tokens. Factor 2.0
    # (the capacity is every token) drops nothing: plain eager's numbers.
    from tdx.expert_parallel import capacity
    name = "qwen3-moe"
    build, kind = MODELS[name]
    batches = data(kind)
    shape, axes = LAYOUTS[layout]
    ranks = 1
    for n in shape:
        ranks *= n
    torch.manual_seed(0)
    model = build()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    experts = 4
    counted = {}

    def drop(module, args):
        hidden, index, weight = args
        tokens = index.shape[0] // ranks
        cap = capacity(factor, tokens, index.shape[1], experts)
        keep = torch.cat([_kept(index[r * tokens:(r + 1) * tokens], cap, experts)
                          for r in range(ranks)])
        if module not in counted:       # the first step's
            counted[module] = sum(
                (torch.bincount(index[r * tokens:(r + 1) * tokens].reshape(-1),
                                minlength=experts) - cap).clamp(min=0) for r in range(ranks))
        return hidden, index, weight * keep
    names = {m: n for n, m in model.named_modules() if n.endswith("mlp.experts")}
    for m in names:
        m.register_forward_pre_hook(drop)
    want = eager_steps(model, sgd(model.parameters()), loss_fn_of(kind), batches)
    prog = traced(name, batches)
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes),
                    {"model.layers.*.mlp.experts": tdx.ExpertParallel("ep",
                                                                      capacity_factor=factor)},
                    data_parallel="dp" if "dp" in axes else None)
    with tdx.compile(prog, opt_level=0).start(params=start) as runner:
        losses = [runner.train_step(*batches[0]).item()]
        dropped = tdx.ExpertParallel.dropped_tokens(runner)
        losses += [runner.train_step(*batch).item() for batch in batches[1:]]
        state = runner.state_dict()
    assert set(dropped) == set(names.values())
    for m, n in names.items():
        assert dropped[n].dtype == torch.int64
        assert torch.equal(dropped[n], counted[m]), (n, dropped[n], counted[m])
    total = sum(int(c.sum()) for c in counted.values())
    assert (total == 0) == (factor >= 2.0), total
    for k, (got, ref) in enumerate(zip(losses, want)):
        assert abs(got - ref) <= 1e-5 * abs(ref), f"step {k}: loss {got} vs eager {ref}"
    for param, p in model.named_parameters():
        err = ((state[param] - p.detach()).norm() / p.detach().norm()).item()
        assert err < 1e-4, f"{param}: {err:.2e} from eager after {len(batches)} steps"
    mine = build()
    mine.load_state_dict(state, strict=True)


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
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match=r"capacity_factor must be a number > 0"):
            tdx.ExpertParallel("ep", capacity_factor=bad)
    prog = traced("qwen3-moe", batches)
    tdx.parallelize(prog, mesh, {}, data_parallel="ep")
    with pytest.raises(tdx.CaptureError, match=r"freshly traced program"):
        tdx.parallelize(prog, mesh, PLAN)


def test_a_router_index_out_of_range_stops_the_step_naming_the_layer():
    # Layer 1's router names expert 4 of 4 (ids 0..3) for the tokens whose
    # first routing weight is the larger: a value known only at run time.
    # Each rank stops with an error that names the layer, before any row
    # is sent anywhere.
    build, kind = MODELS["qwen3-moe"]
    batches = data(kind)

    def shifted(module, args):
        hidden, index, weight = args
        return hidden, index + 4 * (weight[:, :1] > weight[:, 1:]).to(index.dtype), weight

    def with_bad_router():
        model = build()
        model.model.layers[1].mlp.experts.register_forward_pre_hook(shifted)
        return model
    torch.manual_seed(0)
    model = build()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    deferred = tdx.deferred_init(with_bad_router)
    prog = tdx.trace_train_step(deferred, sgd(deferred.parameters()), loss_fn_of(kind),
                                *batches[0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("ep",)), PLAN)
    assert "aten::_assert_async" in prog.mlir
    with pytest.raises(tdx.TdxError, match=r"ExpertParallel: the router of "
                                           r"model\.layers\.1\.mlp\.experts \(Qwen3MoeExperts\) "
                                           r"picked an expert id outside \[0, 4\)"):
        tdx.compile(prog, opt_level=0).train(batches, params=start)


def test_an_assert_in_the_model_is_checked_at_run_time():
    # torch._assert_async in a model's forward stays in the step (an op of
    # no result) and stops it with the model's message where it fails.
    class Checked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            torch._assert_async((y.abs() < 100).all(), "Checked: an activation over 100")
            return y
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(Checked), torch.randn(2, 4))
    assert 'tdx.aten "aten::_assert_async.msg"' in prog.mlir
    torch.manual_seed(0)
    params = dict(Checked().state_dict())
    exe = tdx.compile(prog, opt_level=0)
    x = torch.randn(2, 4)
    with torch.no_grad():
        want = torch.nn.functional.linear(x, params["lin.weight"], params["lin.bias"])
    torch.testing.assert_close(exe.run(x, params=params)[0], want)
    with pytest.raises(tdx.TdxError, match="Checked: an activation over 100"):
        exe.run(x * 1000, params=params)


def test_hugging_faces_own_ep_plan_is_taken_as_it_is():
    # Mixtral's config.base_model_ep_plan as transformers writes it
    # ("layers.*.mlp.experts": "ep_dispatch_experts", its weights
    # "grouped_gemm"), given to tdx.parallelize: the experts split over ep
    # as tdx.ExpertParallel splits them, training like eager.
    build, kind = MODELS["mixtral"]
    batches = data(kind)
    hf_plan = build().config.base_model_ep_plan
    assert hf_plan["layers.*.mlp.experts"] == "ep_dispatch_experts"
    torch.manual_seed(0)
    model = build()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    want = eager_steps(model, sgd(model.parameters()), loss_fn_of(kind), batches)
    prog = traced("mixtral", batches)
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("ep",)), hf_plan)
    assert prog.expert_parallel == "ep"
    ours = placed("mixtral", "ep2", batches)

    def placements(p):
        return dict(re.findall(r"tdx\.parameter @(\S+) : \S+ sharding (<[^>]*>)",
                               p.copy().propagate().mlir))
    assert placements(prog) == placements(ours)
    assert placements(prog)["model.layers.0.mlp.experts.gate_up_proj"] == "<@mesh, [Shard(0)]>"
    trained_like_eager(prog, start, want, batches)
    # Its experts' weights without the module's entry: refused by name.
    with pytest.raises(ValueError, match=r"no 'ep_dispatch_experts' entry names its module"):
        tdx.parallelize(traced("mixtral", batches), tdx.init_device_mesh("cpu", (2,), ("ep",)),
                        {k: v for k, v in hf_plan.items() if v == "grouped_gemm"})


def test_the_routers_auxiliary_loss_trains_like_eager_under_expert_parallel():
    # Hugging Face's load-balancing loss (output_router_logits=True,
    # router_aux_loss_coef) added to the loss, as the model defines it: its
    # gradient reaches the routers, and the step on dp2 x ep2 is eager's.
    build, kind = MODELS["qwen3-moe"]
    batches = data(kind)

    def loss_fn(model, ids, targets):
        out = model(input_ids=ids, output_router_logits=True)
        ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]),
                                               targets.reshape(-1))
        return ce + model.config.router_aux_loss_coef * out.aux_loss

    torch.manual_seed(0)
    model = build()
    model.config.router_aux_loss_coef = 0.5
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    want = eager_steps(model, sgd(model.parameters()), loss_fn, batches)
    torch.manual_seed(0)
    base = build()
    plain = eager_steps(base, sgd(base.parameters()), loss_fn_of(kind), batches[:1])
    assert abs(want[0] - plain[0]) > 1e-3, "the auxiliary loss adds nothing"
    torch.manual_seed(0)

    def with_coef():
        m = build()
        m.config.router_aux_loss_coef = 0.5
        return m
    deferred = tdx.deferred_init(with_coef)
    prog = tdx.trace_train_step(deferred, sgd(deferred.parameters()), loss_fn, *batches[0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("dp", "ep")), PLAN,
                    data_parallel="dp")
    trained_like_eager(prog, start, want, batches, model)


def _qwen3_moe(intermediate):
    from test_hf_models import _DECODER, _lm
    return _lm("Qwen3MoeForCausalLM", "Qwen3MoeConfig", moe_intermediate_size=intermediate,
               num_experts=4, num_experts_per_tok=2, **_DECODER)


@pytest.mark.parametrize("intermediate,split", [(1024, True), (4, False)])
def test_auto_parallelize_splits_the_experts_when_it_pays(intermediate, split):
    # On a 1-D ("ep",) mesh the candidates are the experts split over it
    # (all-to-alls of the routed rows) and the experts replicated with the
    # batch split: wide experts (1024) make the first cheaper (the weights
    # and optimizer state each rank stops holding), experts of width 4 the
    # second (the cost model gathers their few tokens instead).
    build = _qwen3_moe(intermediate)
    batches = data("lm")
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    prog = tdx.trace_train_step(deferred, sgd(deferred.parameters()), loss_fn_of("lm"),
                                *batches[0])
    chosen = tdx.auto_parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("ep",)))
    if split:
        assert list(chosen["plan"]) == ["model.layers.*.mlp.experts"], chosen
        assert isinstance(chosen["plan"]["model.layers.*.mlp.experts"], tdx.ExpertParallel)
        assert chosen["data_parallel"] is None and prog.expert_parallel == "ep"
        kinds = {r["kind"] for r in prog.comm_report()}
        assert "ragged_all_to_all" in kinds, kinds
    else:
        assert chosen["plan"] == {} and chosen["data_parallel"] == "ep", chosen
        assert "ragged_all_to_all" not in {r["kind"] for r in prog.comm_report()}


def test_auto_parallelize_with_dp_and_ep_trains_like_eager():
    # A (dp, ep) mesh: the experts over ep, the batch over both.
    build, kind = MODELS["qwen3-moe"]
    batches = data(kind)
    torch.manual_seed(0)
    model = build()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    want = eager_steps(model, sgd(model.parameters()), loss_fn_of(kind), batches)
    prog = traced("qwen3-moe", batches)
    chosen = tdx.auto_parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("dp", "ep")))
    assert chosen["data_parallel"] == "dp" and prog.expert_parallel == "ep", chosen
    trained_like_eager(prog, start, want, batches)
    with pytest.raises(ValueError, match=r"no experts module tdx splits"):
        tdx.auto_parallelize(traced("llama", batches), tdx.init_device_mesh("cpu", (2,), ("ep",)))


def test_the_shared_expert_computes_while_the_combine_is_in_flight():
    # DeepSeek-V3's MoE block: the routed experts' rows go out and come
    # back by ragged all-to-alls, and the shared expert reads only the
    # block's input. In the program the backends run (tdx-backend), the
    # shared expert's matmul sits between the combine's start and its wait
    # (tdx-overlap-dispatch), so it computes while the rows are in flight.
    prog = placed("deepseek-v3", "ep2", data("lm"))
    lines = prog.copy().partition().run_pipeline("tdx-backend").mlir.splitlines()

    def defined(pattern):
        return next((i, re.match(r"\s*(%\S+) =", line).group(1)) for i, line in enumerate(lines)
                    if re.search(pattern, line))
    _, weight = defined(r"param_ref @model\.layers\.1\.mlp\.shared_experts\.gate_proj\.weight ")
    _, transposed = defined(rf"tdx\.transpose {re.escape(weight)}\b")
    matmul, _ = defined(rf"tdx\.(matmul|linear) .*{re.escape(transposed)}\b")
    windows = []
    for i, line in enumerate(lines):
        if "tdx.ragged_all_to_all" in line:
            token = re.match(r"\s*(%\S+) = tdx\.start", lines[i - 1]).group(1)
            wait = next(j for j in range(i, len(lines)) if f"tdx.wait {token} " in lines[j])
            windows.append((i, wait))
    assert any(start < matmul < wait for start, wait in windows), (matmul, windows)
