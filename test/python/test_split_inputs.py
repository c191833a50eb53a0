"""Inputs split over ranks, against eager on the same inputs: reductions
over a split dim (each reduction's kind of Partial, reduced before it leaves
the program), shards with no rows (uneven torch.chunk splits over 3 ranks),
advanced indexing of a split operand, and the inputs data_parallel splits
(only those with the batch dim)."""

import pytest
import torch
import torch.nn.functional as F

import tdx


class Cases(torch.nn.Module):
    """Every case in one forward: case k reads input k, outputs in order."""

    def __init__(self, fns):
        super().__init__()
        self.fns = fns
        # tdx.trace takes a deferred module: a buffer the forward never reads.
        self.register_buffer("unused", torch.zeros(1))

    def forward(self, *xs):
        out = []
        for fn, x in zip(self.fns, xs):
            y = fn(x)
            out.extend(y if isinstance(y, (tuple, list)) else (y,))
        return tuple(out)


def run_split(cases, ranks):
    """Each case's input split on dim 0 over `ranks` ranks; the outputs of
    the compiled program by case, and eager's."""
    names = list(cases)
    fns = [cases[n][0] for n in names]
    inputs = [cases[n][1] for n in names]
    prog = tdx.trace(tdx.deferred_init(Cases, fns), *inputs)
    mesh = tdx.init_device_mesh("cpu", (ranks,), ("dp",))
    for i in range(len(inputs)):
        prog.annotate(f"input:{i}", mesh, [tdx.Shard(0)])
    got = list(tdx.compile(prog).run(*inputs))
    out = {}
    for name, fn, x in zip(names, fns, inputs):
        want = fn(x)
        want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
        out[name] = ([got.pop(0) for _ in want], want)
    return out


def assert_same(results):
    bad = []
    for name, (got, want) in results.items():
        for g, w in zip(got, want):
            if g.shape != w.shape or g.dtype != w.dtype or not (
                    torch.allclose(g, w, rtol=1e-5, atol=1e-6) if w.is_floating_point()
                    else torch.equal(g, w)):
                bad.append(f"{name}: got {g} want {w}")
    assert not bad, "\n".join(bad)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def reductions(rows):
    """Every reduction over the split dim 0 (and over all dims) of a
    (rows, 3) input."""
    fns = {
        "amax(0)": lambda x: torch.amax(x, dim=0),
        "amax(())": lambda x: torch.amax(x, dim=()),
        "amax(0, keepdim)": lambda x: torch.amax(x, dim=0, keepdim=True),
        "amin(0)": lambda x: torch.amin(x, dim=0),
        "amin(())": lambda x: torch.amin(x, dim=()),
        "amin(0, keepdim)": lambda x: torch.amin(x, dim=0, keepdim=True),
        "max()": lambda x: x.max(),
        "max(0)": lambda x: x.max(0),
        "min()": lambda x: x.min(),
        "min(0, keepdim)": lambda x: x.min(0, keepdim=True),
        "argmax(0)": lambda x: x.argmax(0),
        "argmin()": lambda x: x.argmin(),
        "logsumexp(0)": lambda x: torch.logsumexp(x, 0),
        "norm(dim=0)": lambda x: x.norm(dim=0),
        "norm()": lambda x: x.norm(),
        "vector_norm(inf)": lambda x: torch.linalg.vector_norm(x, float("inf"), dim=0),
        "prod(0)": lambda x: x.prod(0),
        "sum(0)": lambda x: x.sum(0),
        "mean()": lambda x: x.mean(),
        "amax(0) - amin(0)": lambda x: x.amax(0) - x.amin(0),
    }
    return {name: (fn, _x(rows, 3, seed=k)) for k, (name, fn) in enumerate(fns.items())}


def test_reductions_over_a_split_dim_on_dp2():
    # amax over the split dim is Partial(max): it was summed like a
    # Partial(sum) when it left the program.
    assert_same(run_split(reductions(6), 2))


def test_reductions_over_uneven_and_empty_shards_on_3_ranks():
    # 7 rows over 3 ranks are 3, 3, 1; 2 rows are 1, 1 and none.
    cases = {f"{k} of 7": v for k, v in reductions(7).items()}
    cases.update({f"{k} of 2": v for k, v in reductions(2).items()})
    assert_same(run_split(cases, 3))


def sized_ops():
    """Ops that take sizes or padding, on (2, 4, 3) inputs: over 3 ranks the
    last holds no rows."""
    fns = {
        "pad": lambda x: F.pad(x, (2, 2)),
        "pad 2-D": lambda x: F.pad(x, (1, 2, 0, 1), value=-1.0),
        "flatten": lambda x: x.flatten(1) * 2,
        "reshape(-1, 12)": lambda x: x.reshape(-1, 12) + 1,
        "view": lambda x: x.view(2, 2, 2, 3).sum(-1),
        "expand": lambda x: x[:, :1].expand(-1, 4, 3) + x,
        "zeros_like": lambda x: torch.zeros_like(x) + x,
        "full_like": lambda x: torch.full_like(x, 3.0) * x,
        "softmax": lambda x: x.softmax(-1),
        "layer_norm": lambda x: F.layer_norm(x, (3,)),
        "cat": lambda x: torch.cat([x, x * 2], 1),
        "transpose": lambda x: x.transpose(1, 2).contiguous(),
        "x[:, [1, 2]]": lambda x: x[:, [1, 2]],
        "linear": lambda x: F.linear(x, torch.ones(5, 3)),
    }
    return {name: (fn, _x(2, 4, 3, seed=k)) for k, (name, fn) in enumerate(fns.items())}


def test_ops_that_take_sizes_with_an_empty_shard():
    assert_same(run_split(sized_ops(), 3))


def test_pad_of_one_row_on_dp2():
    # Rank 1 holds none of the one row: the padding's filled blocks are its
    # own box of their global shape (it crashed the binary with a size of
    # INT64_MIN).
    assert_same(run_split({"pad": (lambda x: F.pad(x, (2, 2)), _x(1, 3, 3))}, 2))


def indexing():
    return {
        "x[[1, 2]]": (lambda x: x[[1, 2]], _x(5, 5, 5)),
        "x[[-1, 2]]": (lambda x: x[[-1, 2]], _x(5, 5, 5, seed=1)),
        "x[[4, 0, 3]]": (lambda x: x[[4, 0, 3]] * 2, _x(5, 4, seed=2)),
        "x[[1, 0, -2]] of 2 rows": (lambda x: x[[1, 0, -2]], _x(2, 4, seed=3)),
    }


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_advanced_indexing_of_a_split_operand(ranks):
    # The index list becomes a lookup whose table is the split input: it
    # needs the table's global row count (uneven: 5 rows over 2 ranks), a
    # row on ranks that hold none (2 rows over 3), and negative indices
    # counted from the end (they read nothing, silently, before).
    assert_same(run_split(indexing(), ranks))


class Scaled(torch.nn.Module):
    """A batch, a 0-D temperature, a broadcast row and a weight given as
    inputs, as a user's forward takes them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("unused", torch.zeros(1))

    def forward(self, x, temperature, row, w):
        return (x / temperature + row) @ w, (x @ w).amax(0)


def scaled_inputs(batch=6):
    return (_x(batch, 4), torch.tensor(2.0), _x(4, seed=1), _x(4, 3, seed=2))


@pytest.mark.parametrize("ranks", [2, 3])
def test_data_parallel_splits_only_the_inputs_with_the_batch_dim(ranks):
    inputs = scaled_inputs(6 if ranks == 2 else 7)
    prog = tdx.trace(tdx.deferred_init(Scaled), *inputs)
    mesh = tdx.init_device_mesh("cpu", (ranks,), ("dp",))
    tdx.parallelize(prog, mesh, {}, data_parallel="dp")
    shapes = [s for s, _ in prog._module.argument_shapes("forward")]
    assert shapes == [[6 if ranks == 2 else 7, 4], [], [4], [4, 3]]
    # Only the batch is split; the others are left to propagation, which
    # replicates them (DDP's answer).
    placed = tdx.Program(prog.mlir).run_pipeline("tdx-place").mlir
    signature = placed.split("func.func @forward", 1)[1].split("{\n", 1)[0]
    assert signature.count("[Shard(0)]") == 1, signature
    got = tdx.compile(prog).run(*inputs)
    want = Scaled()(*inputs)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-6), (g, w)


class Product(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("unused", torch.zeros(1))

    def forward(self, x, w):
        return x @ w


def test_data_parallel_preferences_that_disagree_are_settled_by_cost():
    # Both (6, 6) inputs have the batch's leading size: x split by rows asks
    # the matmul for its i factor, w for its k factor. Data parallelism's
    # splits are preferences, so the cost model picks instead of refusing
    # with "conflicting user shardings".
    x, w = _x(6, 6), _x(6, 6, seed=1)
    prog = tdx.trace(tdx.deferred_init(Product), x, w)
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    got, = tdx.compile(prog).run(x, w)
    assert torch.allclose(got, x @ w, rtol=1e-5, atol=1e-6)


def test_a_users_placement_wins_over_data_parallelism():
    x, w = _x(6, 6), _x(6, 6, seed=1)
    prog = tdx.trace(tdx.deferred_init(Product), x, w)
    mesh = tdx.init_device_mesh("cpu", (2,), ("dp",))
    prog.annotate("input:1", mesh, [tdx.Shard(1)])
    tdx.parallelize(prog, mesh, {}, data_parallel="dp")
    placed = tdx.Program(prog.mlir).run_pipeline("tdx-place").mlir
    assert "%arg1: tensor<6x6xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(1)]>}" in placed
    got, = tdx.compile(prog).run(x, w)
    assert torch.allclose(got, x @ w, rtol=1e-5, atol=1e-6)


def test_a_preference_is_for_inputs():
    prog = tdx.trace(tdx.deferred_init(torch.nn.Linear, 4, 3), _x(6, 4))
    mesh = tdx.init_device_mesh("cpu", (2,), ("dp",))
    with pytest.raises(tdx.CaptureError, match="a preference.*is for inputs"):
        prog._module.annotate("weight", mesh.name, [2], ["dp"], "[Shard(0)]", priority=0)
