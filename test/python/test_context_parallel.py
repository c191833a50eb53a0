"""Context parallelism written by the user: causal ring attention
(examples/ring_attention.py) in a manual region inside torchtitan's Llama 3,
trained from the runner on cp2, cp4 and dp2 x cp2 against the unchanged
model's full attention (SDPA) eagerly on one process (issue 54, point 6)."""

import inspect
import os
import sys

import pytest
import torch

import tdx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import ring_attention as ra  # noqa: E402

STEPS = 3


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def eager_run(data):
    torch.manual_seed(0)
    model = ra.llama3()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = sgd(model.parameters())
    losses = []
    for ids, targets in data:
        opt.zero_grad()
        loss = ra.loss_fn(model, ids, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return start, losses, model


def ring_program(mesh, data):
    torch.manual_seed(0)
    model = tdx.deferred_init(lambda: ra.with_ring_attention(ra.llama3(), mesh))
    prog = tdx.trace_train_step(model, sgd(model.parameters()), ra.loss_fn, *data[0])
    dp = "dp" if "dp" in mesh.mesh_dim_names else None
    tdx.parallelize(prog, mesh, {}, data_parallel=dp)
    return prog


def assert_trains_like_eager(prog, data):
    """The compiled step from the runner against the unchanged model's
    eager loop: losses to 1e-5, parameters to 1e-4 after the steps."""
    start, want, eager = eager_run(data)
    losses, state = tdx.compile(prog).train(data, params=start)
    for k, (got, ref) in enumerate(zip(losses, want)):
        assert abs(got - ref) <= 1e-5 * abs(ref), f"step {k}: loss {got} vs eager {ref}"
    for name, p in eager.named_parameters():
        err = ((state[name] - p.detach()).norm() / p.detach().norm()).item()
        assert err < 1e-4, f"{name}: {err:.2e} from eager after {STEPS} steps"


LAYOUTS = {"cp2": ((2,), ("cp",)), "cp4": ((4,), ("cp",)), "dp2xcp2": ((2, 2), ("dp", "cp"))}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ring_attention_region_trains_like_eager_full_attention(layout):
    mesh = tdx.init_device_mesh("cpu", *LAYOUTS[layout])
    data = ra.batches(STEPS)
    assert_trains_like_eager(ring_program(mesh, data), data)


def test_the_ring_moves_key_value_blocks_at_the_users_line():
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("dp", "cp"))
    prog = ring_program(mesh, ra.batches(1))
    lines, first = inspect.getsourcelines(ra.ring_attention)
    permutes = {f"ring_attention.py:{first + i}" for i, text in enumerate(lines)
                if "permute_tensor" in text}
    report = prog.comm_report()
    ring = [r for r in report if any(s in str(r["location"]) for s in permutes)]
    # Forward K and V, and their gradients' way back, in both layers, over cp.
    assert {(r["kind"], tuple(r["mesh_axes"])) for r in ring} == {("collective_permute", ("cp",))}
    assert len(ring) >= 2 * 2 * 2, report
    # Every permutation is the user's; around the region tdx moves what its
    # cost model picks (on this small model it gathers some activations over
    # cp for the weight gradients rather than all-reducing the gradients).
    assert all(r in ring for r in report if r["kind"] == "collective_permute"), report


@pytest.mark.parametrize("layout", ["cp2", "dp2xcp2"])
def test_context_parallel_plan_trains_the_unchanged_model_like_eager(layout):
    mesh = tdx.init_device_mesh("cpu", *LAYOUTS[layout])
    data = ra.batches(STEPS)
    torch.manual_seed(0)
    model = tdx.deferred_init(ra.llama3)
    prog = tdx.trace_train_step(model, sgd(model.parameters()), ra.loss_fn, *data[0])
    dp = "dp" if "dp" in mesh.mesh_dim_names else None
    tdx.parallelize(prog, mesh, {"layers.*.attention": tdx.ContextParallel("cp")},
                    data_parallel=dp)
    assert prog.context_parallel == "cp"
    kinds = {(r["kind"], tuple(r["mesh_axes"])) for r in prog.comm_report()}
    assert ("all_gather", ("cp",)) in kinds and ("reduce_scatter", ("cp",)) in kinds, kinds
    assert_trains_like_eager(prog, data)


def test_context_parallel_refusals_name_the_fix():
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("dp", "cp"))
    data = ra.batches(1)

    def traced():
        torch.manual_seed(0)
        model = tdx.deferred_init(ra.llama3)
        return tdx.trace_train_step(model, sgd(model.parameters()), ra.loss_fn, *data[0])
    with pytest.raises(ValueError, match=r"'nothing\.\*' \(ContextParallel\) matches no module"):
        tdx.parallelize(traced(), mesh, {"nothing.*": tdx.ContextParallel("cp")})
    with pytest.raises(ValueError, match=r"call no torch.nn.functional.scaled_dot_product_"
                                         r"attention in the step; name the attention modules"):
        tdx.parallelize(traced(), mesh, {"layers.*.feed_forward": tdx.ContextParallel("cp")})
    with pytest.raises(ValueError, match=r"the data-parallel axis too"):
        tdx.parallelize(traced(), mesh, {"layers.*.attention": tdx.ContextParallel("dp")},
                        data_parallel="dp")
    with pytest.raises(ValueError, match=r"mesh has no axis 'sp'"):
        tdx.parallelize(traced(), mesh, {"layers.*.attention": tdx.ContextParallel("sp")})
    placed = traced()
    tdx.parallelize(placed, mesh, {}, data_parallel="dp")
    with pytest.raises(tdx.CaptureError, match=r"freshly traced program"):
        tdx.parallelize(placed, mesh, {"layers.*.attention": tdx.ContextParallel("cp")})
