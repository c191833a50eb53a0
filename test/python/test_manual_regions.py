"""Manual regions inside placed programs (tdx.local_map, tdx.shard_map):
per-shard code with the user's collectives, the program around it placed by
tdx; compiled and trained on dp2 and dp x tp meshes against eager on one
process (docs/mpi.md, "Manual regions")."""

import inspect

import pytest
import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

import tdx
from tdx import Partial, Replicate, Shard

STEPS = 3
MESH22 = tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp"))
MESH2 = tdx.init_device_mesh("cpu", (2,), ("dp",))


def megatron_body(x, w1, b1, w2):
    """A tensor-parallel MLP written per shard: w1's rows and w2's columns
    are this rank's share of the hidden units; one all_reduce over tp."""
    h = F.gelu(x @ w1.t() + b1)
    return funcol.all_reduce(h @ w2.t(), "sum", (MESH22, "tp"))


class HandTP(torch.nn.Module):
    """An MLP whose middle block is hand-written tensor parallelism (the
    region), between layers tdx places itself."""

    def __init__(self, manual="local_map"):
        super().__init__()
        self.inp = torch.nn.Linear(6, 8)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8, bias=False)
        self.out = torch.nn.Linear(8, 3)
        self.manual = manual

    def block(self, x):
        args = (x, self.up.weight, self.up.bias, self.down.weight)
        if self.manual is None:   # eager: the same math on whole tensors
            return self.down(F.gelu(self.up(x)))
        if self.manual == "local_map":
            return tdx.local_map(
                megatron_body, out_placements=(Shard(0), Replicate()),
                in_placements=((Shard(0), Replicate()), (Replicate(), Shard(0)),
                               (Replicate(), Shard(0)), (Replicate(), Shard(1))),
                mesh=MESH22)(*args)
        return tdx.shard_map(megatron_body, MESH22,
                             in_specs=(("dp", None), ("tp", None), ("tp",), (None, "tp")),
                             out_specs=("dp", None))(*args)

    def forward(self, x):
        return self.out(torch.tanh(self.block(torch.tanh(self.inp(x)))))


def mse(model, x, y):
    return F.mse_loss(model(x), y)


def data(n=STEPS, rows=8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g))
            for _ in range(n)]


def eager_losses(build, batches):
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = mse(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return start, losses, model


def compiled_step(build, mesh, plan=None):
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    opt = torch.optim.SGD(deferred.parameters(), lr=0.1, momentum=0.9)
    prog = tdx.trace_train_step(deferred, opt, mse, *data(1)[0])
    tdx.parallelize(prog, mesh, plan or {}, data_parallel="dp")
    return prog


def assert_trains_like_eager(prog, eager_build):
    batches = data()
    start, want, eager = eager_losses(eager_build, batches)
    losses, state = tdx.compile(prog).train(batches, params=start)
    for k, (got, ref) in enumerate(zip(losses, want)):
        assert abs(got - ref) <= 1e-5 * abs(ref), f"step {k}: loss {got} vs eager {ref}"
    for name, p in eager.named_parameters():
        err = ((state[name] - p.detach()).norm() / p.detach().norm()).item()
        assert err < 1e-4, f"{name}: {err:.2e} from eager after {STEPS} steps"


@pytest.mark.parametrize("manual", ["local_map", "shard_map"])
def test_hand_written_tensor_parallel_region_trains_like_eager_on_dp_x_tp(manual):
    prog = compiled_step(lambda: HandTP(manual), MESH22)
    assert_trains_like_eager(prog, lambda: HandTP(None))


def test_the_comm_report_lists_the_regions_collectives_beside_tdxs():
    prog = compiled_step(lambda: HandTP("local_map"), MESH22)
    report = prog.comm_report()
    line = inspect.getsourcelines(megatron_body)[1] + 4   # the funcol.all_reduce
    site = f"test_manual_regions.py:{line}"
    mine = [r for r in report if site in str(r["location"])]
    # Forward and backward all_reduce of the region over tp, at the user's line.
    assert {(r["kind"], tuple(r["mesh_axes"])) for r in mine} == {("all_reduce", ("tp",))}, report
    assert len(mine) >= 2, report
    # tdx's own: the data-parallel gradients' reduction over dp.
    assert any("dp" in r["mesh_axes"] and site not in str(r["location"]) for r in report), report


def global_center(x):
    """Centers each column by the global batch's mean: the batch is split
    over dp, so the sum needs the other ranks' rows."""
    total = funcol.all_reduce(x.sum(0, keepdim=True), "sum", (MESH2, "dp"))
    return x - total / (x.shape[0] * 2)


class Centered(torch.nn.Module):
    def __init__(self, manual=True):
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(8, 3)
        self.manual = manual

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if self.manual:
            h = tdx.local_map(global_center, out_placements=(Shard(0),),
                              in_placements=((Shard(0),),), mesh=MESH2)(h)
        else:
            h = h - h.mean(0, keepdim=True)
        return self.b(h)


def test_a_region_over_the_data_parallel_axis_trains_like_eager():
    prog = compiled_step(lambda: Centered(True), MESH2)
    assert_trains_like_eager(prog, lambda: Centered(False))


def test_torchs_own_local_map_inside_the_model_makes_the_region():
    from torch.distributed.tensor.experimental import local_map as torch_local_map

    class TorchCentered(Centered):
        def forward(self, x):
            h = torch.tanh(self.a(x))
            h = torch_local_map(global_center, out_placements=(Shard(0),),
                                in_placements=((Shard(0),),), device_mesh=MESH2)(h)
            return self.b(h)

    prog = compiled_step(lambda: TorchCentered(True), MESH2)
    assert "tdx.to_local" in prog.mlir
    assert_trains_like_eager(prog, lambda: Centered(False))


def test_an_output_claimed_replicate_that_differs_is_refused_naming_both_lines():
    def body(x):
        return x * 2                          # still this rank's rows

    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            return tdx.local_map(body, out_placements=(Replicate(),),
                                 in_placements=((Shard(0),),), mesh=MESH2)(self.a(x)).sum()

    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(Bad), torch.randn(8, 4))
    with pytest.raises(tdx.TdxError) as e:
        tdx.compile(prog)
    text = str(e.value)
    assert "Replicate over mesh axis \"dp\", but it differs across \"dp\"" in text
    assert "check_replication=False" in text
    assert text.count('"test_manual_regions.py":') >= 2, text  # the region and the cause
    # Off: compiled as the user claims.
    torch.manual_seed(0)

    class Unchecked(Bad):
        def forward(self, x):
            return tdx.local_map(body, out_placements=(Replicate(),), in_placements=((Shard(0),),),
                                 mesh=MESH2, check_replication=False)(self.a(x)).sum()

    tdx.compile(tdx.trace(tdx.deferred_init(Unchecked), torch.randn(8, 4)))


@pytest.mark.parametrize("call,message", [
    (lambda x: tdx.local_map(lambda t: t, out_placements=(Shard(0),),
                             in_placements=((Shard(0),), (Shard(0),)), mesh=MESH2)(x),
     "has 1 argument(s) but 2 in_placements"),
    (lambda x: tdx.local_map(lambda t: t, out_placements=(Shard(0),),
                             in_placements=((Shard(1),),), mesh=MESH2)(x),
     "does not split evenly over 2 ranks"),
    (lambda x: tdx.local_map(lambda t: (t, t), out_placements=(Shard(0),),
                             in_placements=((Shard(0),),), mesh=MESH2)(x),
     "returns 2 value(s) but has 1 out_placements"),
    (lambda x: tdx.local_map(lambda t: t, out_placements=(Shard(0),),
                             in_placements=((Shard(0), Shard(1)),), mesh=MESH2)(x),
     "has 2 placement(s) for a 1-D mesh"),
    (lambda x: tdx.local_map(lambda t: t, out_placements=(Shard(0),),
                             in_placements=((Shard(0),),))(x),
     "needs its mesh"),
    (lambda x: tdx.shard_map(lambda t: t, MESH2, in_specs=("tp",), out_specs=("dp",))(x),
     "the mesh has no axis 'tp'"),
])
def test_bad_regions_are_named(call, message):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)

        def forward(self, x):
            return call(self.a(x))

    with pytest.raises(tdx.CaptureError, match=".*" + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        tdx.trace(tdx.deferred_init(M), torch.randn(8, 3))


def test_outside_a_trace_local_map_runs_the_function_as_torchs_does():
    f = tdx.local_map(lambda t: t * 3, out_placements=(Shard(0),),
                      in_placements=((Shard(0),),), mesh=MESH2)
    assert torch.equal(f(torch.ones(2)), torch.full((2,), 3.0))


def routed_body(h, dest, scale, *, wrong_sizes=False):
    """Each row goes to the rank `dest` names, is scaled by that rank's
    `scale` row, and comes back: a dispatch and a combine by
    tdx.ragged_all_to_all, whose counts follow the data."""
    n, rows = 2, h.shape[0]
    order = torch.sort(dest, stable=True).indices
    per_rank = F.one_hot(dest, n).sum(0)
    offsets = per_rank.cumsum(0) - per_rank
    received = funcol.all_to_all_single(per_rank, None, None, (MESH2, "dp"))
    slots = torch.arange(n) * rows        # room for every row of each sender
    got = tdx.ragged_all_to_all(h[order], offsets, per_rank, slots,
                                per_rank if wrong_sizes else received, n * rows, (MESH2, "dp"))
    back = tdx.ragged_all_to_all(got * scale, slots, received, offsets, per_rank, rows,
                                 (MESH2, "dp"))
    return back.new_zeros(back.shape).index_copy(0, order, back)


class Routed(torch.nn.Module):
    def __init__(self, manual=True, wrong_sizes=False):
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.scale = torch.nn.Parameter(torch.tensor([[0.5] * 8, [2.0] * 8]))
        self.b = torch.nn.Linear(8, 3)
        self.manual, self.wrong_sizes = manual, wrong_sizes

    def forward(self, x):
        h = torch.tanh(self.a(x))
        dest = (h[:, 0] > 0).to(torch.int64)      # rows to rank 0 or 1, by value
        if self.manual:
            h = tdx.local_map(lambda h, d, s: routed_body(h, d, s, wrong_sizes=self.wrong_sizes),
                              out_placements=(Shard(0),),
                              in_placements=((Shard(0),), (Shard(0),), (Shard(0),)),
                              mesh=MESH2)(h, dest, self.scale)
        else:
            h = h * self.scale[dest]
        return self.b(h)


def test_rows_routed_by_value_with_ragged_all_to_all_train_like_eager():
    # The rows each rank sends each peer differ per step (8 rows, dest by
    # the sign of a unit); the gradients come back by the adjoint.
    batches = data()
    torch.manual_seed(0)
    model = Routed(False)
    h = torch.tanh(model.a(batches[0][0]))[:, 0] > 0
    assert 0 < int(h[:4].sum()) < 4 or 0 < int(h[4:].sum()) < 4, "not a ragged split"
    prog = compiled_step(lambda: Routed(True), MESH2)
    moved = [r for r in prog.comm_report() if r["kind"] == "ragged_all_to_all"]
    # A rank's 4 rows of 8 float32 there and back, forward and backward.
    assert [r["bytes"] for r in moved] == [4 * 8 * 4] * 4, moved
    assert_trains_like_eager(prog, lambda: Routed(False))


def test_a_ragged_all_to_all_whose_sizes_disagree_stops_naming_the_line():
    prog = compiled_step(lambda: Routed(True, wrong_sizes=True), MESH2)
    batches = data()
    start, _, _ = eager_losses(lambda: Routed(False), batches)
    source, first = inspect.getsourcelines(routed_body)
    line = first + next(i for i, text in enumerate(source) if "got = tdx.ragged" in text)
    # Each rank stops with the error (no hang, no wrong rows).
    with pytest.raises(tdx.TdxError, match=rf"ragged_all_to_all at test_manual_regions.py:{line} "
                                           rf"\(rank \d of its group\): rank \d sends it \d+ rows, "
                                           rf"recv_sizes says \d+"):
        tdx.compile(prog).train(batches, params=start)
