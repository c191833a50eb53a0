"""tdx.capture / tdx.trace: IR that tdx-opt verifies, shapes and op counts
that agree with make_fx, counter-based random init."""

import collections
import os
import re
import subprocess
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tdx
from models import GPT2, ConvNet, Llama, ViewInit

TDX_OPT = os.path.join(os.path.dirname(tdx.__file__), "..", "..", "bin", "tdx-opt")

CASES = {
    "GPT2": (GPT2, lambda: torch.randint(0, 128, (2, 8))),
    "Llama": (Llama, lambda: torch.randint(0, 96, (2, 8))),
    "ConvNet": (ConvNet, lambda: torch.randn(2, 3, 8, 8)),
    "ViewInit": (ViewInit, lambda: torch.randn(2, 8)),
}


def tdx_opt(text, *args):
    return subprocess.run([TDX_OPT, "-", *args], input=text, capture_output=True,
                          text=True, timeout=120)


def build(name):
    cls, make_input = CASES[name]
    torch.manual_seed(0)
    m = tdx.deferred_init(cls)
    m.eval()
    return cls, m, make_input()


@pytest.mark.parametrize("name", list(CASES))
def test_capture_verifies_in_tdx_opt(name):
    cls = CASES[name][0]
    prog = tdx.capture(tdx.deferred_init(cls))
    result = tdx_opt(prog.mlir)
    assert result.returncode == 0, result.stderr
    torch.manual_seed(0)
    eager = cls()
    expected = {n: (tuple(t.shape), t.dtype) for n, t in eager.state_dict().items()}
    params = prog.parameters()
    for n, shape_dtype in expected.items():
        assert params[n] == shape_dtype, n


@pytest.mark.parametrize("name", list(CASES))
def test_trace_matches_make_fx(name):
    cls, m, x = build(name)
    prog = tdx.trace(m, x)
    result = tdx_opt(prog.mlir)
    assert result.returncode == 0, result.stderr

    torch.manual_seed(0)
    eager = cls().eval()
    graph = make_fx(eager)(x).graph
    expected_out = eager(x)
    # Output shapes: the signature of @forward.
    sig = re.search(r"func\.func @forward\(([^)]*)\) -> ([^{]*)\{", prog.mlir)
    assert sig, prog.mlir
    out_type = sig.group(2).strip()
    dims = "x".join(str(d) for d in expected_out.shape)
    assert out_type == f"tensor<{dims}xf32>"
    # aten op counts: make_fx records, besides, dead detaches and aliases
    # that autograd takes to save tensors for backward; they compute nothing.
    theirs = collections.Counter(
        n.target.overloadpacket._qualified_op_name for n in graph.nodes
        if n.op == "call_function" and hasattr(n.target, "overloadpacket")
        and not (n.target.overloadpacket._qualified_op_name in ("aten::detach", "aten::alias")
                 and not n.users))
    ours = collections.Counter(n.split(".")[0] for n in prog.forward_op_names)
    assert ours == theirs


def test_random_init_is_counter_based_and_tied_weights_are_tied():
    torch.manual_seed(7)
    prog = tdx.capture(tdx.deferred_init(GPT2))
    text = prog.mlir
    streams = re.findall(r"tdx\.normal\([^)]*\) seed\((\d+), (\d+)\)", text)
    assert streams, text
    assert all(seed == "7" for seed, _ in streams)
    # Every random op of the recording has its own stream (each parameter's
    # program is cut from one functionalized recording).
    assert len({s for _, s in streams}) == len(streams)
    assert re.search(r"tdx\.parameter @lm_head\.weight : tensor<128x32xf32> tied_to @wte\.weight", text)


def test_views_and_in_place_become_values():
    prog = tdx.capture(tdx.deferred_init(ViewInit))
    text = prog.mlir
    # a.weight[:, :2].zero_() and friends: scattered back into the base
    # (slice_scatter / select_scatter, raised to slices and a concat).
    assert "tdx.concat" in text and "tdx.slice" in text
    assert "slice_scatter" not in text and "select_scatter" not in text
    # kaiming_uniform_ with a=sqrt(5) on an 8-wide fan: bound 1/sqrt(8).
    assert re.search(r"tdx\.uniform\(-0\.353553390593273\d*, 0\.353553390593273\d*\) "
                     r"seed\(-?\d+, \d+\) : tensor<4x8xf32>", text), text


def test_program_save_load_run_pipeline(tmp_path):
    prog = tdx.trace(tdx.deferred_init(torch.nn.Linear, 4, 3), torch.randn(2, 4))
    path = tmp_path / "linear.mlir"
    prog.save(path)
    loaded = tdx.Program.load(path)
    assert loaded.mlir == prog.mlir
    assert loaded.parameters() == {"weight": ((3, 4), torch.float32), "bias": ((3,), torch.float32)}
    loaded.run_pipeline("canonicalize,cse")
    assert "func.func @forward" in loaded.mlir
    summary = tmp_path / "summary.txt"
    loaded.run_pipeline(f"builtin.module(tdx-model-summary{{output={summary}}})")
    assert "total parameters: 2 (0 tied), 15 elements" in summary.read_text()
    with pytest.raises(tdx.CaptureError, match="cannot parse the pass pipeline"):
        loaded.run_pipeline("no-such-pass")
    # A pipeline or a placement that fails leaves the program as it was.
    before = loaded.mlir
    with pytest.raises(tdx.CaptureError, match="already partitioned"):
        loaded.run_pipeline("tdx-partition,tdx-partition")
    assert loaded.mlir == before
    mesh = tdx.init_device_mesh("cpu", (2,), ("tp",))
    with pytest.raises(tdx.CaptureError, match="no parameter or buffer named 'nope'"):
        loaded.annotate("nope", mesh, [tdx.Shard(0)])
    assert loaded.mlir == before and loaded.mesh is None and loaded.world_size == 1
    copy = loaded.copy().annotate("weight", mesh, [tdx.Shard(0)])
    assert copy.mesh.shape == (2,) and copy.mesh.mesh_dim_names == ("tp",)
    assert copy.world_size == 2 and loaded.mlir == before
    with pytest.raises(FileNotFoundError):
        tdx.Program.load(tmp_path / "missing.mlir")
    bad = tmp_path / "bad.mlir"
    bad.write_text("tdx.parameter @w : tensor<4xf32>\n")
    with pytest.raises(tdx.CaptureError, match="has no init region"):
        tdx.Program.load(bad)


class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return y
        return -y


class ReadsData(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * len(x.tolist())


def test_data_dependent_control_flow_is_named():
    m = tdx.deferred_init(DataDependent)
    with pytest.raises(tdx.FakeTensorError, match=r"data-dependent control flow at .*test_capture\.py:\d+"):
        tdx.trace(m, torch.randn(2, 4))


def test_reading_data_in_forward_is_an_error():
    m = tdx.deferred_init(ReadsData)
    with pytest.raises(tdx.FakeTensorError, match="tolist"):
        tdx.trace(m, torch.randn(2, 4))


class DataDependentShape(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return {"masked_select": lambda: torch.masked_select(y, y > 0),
                "x[mask]": lambda: y[y > 0], "nonzero": lambda: torch.nonzero(y),
                "unique": lambda: torch.unique(y),
                "unique_consecutive": lambda: torch.unique_consecutive(y)}[self.op]()


@pytest.mark.parametrize("op,aten,rewrite", [
    ("masked_select", "aten::masked_select", "torch.where"),
    ("x[mask]", r"x\[mask\] \(aten::index.Tensor with a boolean index\)", "torch.where"),
    ("nonzero", "aten::nonzero", "torch.where"),
    ("unique", "aten::_unique2", "torch.sort"),
    ("unique_consecutive", "aten::unique_consecutive", r"x\[1:\] != x\[:-1\]")])
def test_data_dependent_shapes_are_named_with_the_rewrite(op, aten, rewrite):
    # A static program cannot hold a result whose shape depends on values:
    # the op is named at trace, with why and the usual rewrite.
    m = tdx.deferred_init(DataDependentShape, op)
    with pytest.raises(tdx.FakeTensorError,
                       match=f"{aten}'s result has a shape that depends on the values of its "
                             f"input, which a static program cannot hold.*{rewrite}"):
        tdx.trace(m, torch.randn(2, 4))


class InPlacePow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return (x * self.p).abs().pow_(3.0)


def test_an_in_place_op_records_the_overload_with_its_arguments():
    # pow_.Scalar(self, exponent)'s functional op is pow.Tensor_Scalar, not
    # pow.Scalar(Scalar self, Tensor exponent), which shares its overload name.
    prog = tdx.trace(tdx.deferred_init(InPlacePow), torch.randn(4))
    assert "aten::pow.Scalar" not in prog.mlir and "tdx.pow" in prog.mlir, prog.mlir


def test_capture_needs_a_deferred_module():
    with pytest.raises(tdx.CaptureError, match="tdx.deferred_init"):
        tdx.capture(torch.nn.Linear(2, 2))
    m = tdx.materialize_module(tdx.deferred_init(torch.nn.Linear, 2, 2))
    with pytest.raises(tdx.CaptureError, match="not yet materialized"):
        tdx.capture(m)
    with pytest.raises(TypeError):
        tdx.capture("model")


def test_module_changed_after_deferred_init():
    m = tdx.deferred_init(torch.nn.Linear, 4, 3)
    # Recorded changes are part of the module's program ...
    with torch.no_grad():
        m.weight.mul_(2.0)
    assert "tdx.mul" in tdx.capture(m).mlir
    # ... a real tensor swapped in behind the recording's back is named.
    m.bias = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(tdx.CaptureError, match=r"bias is not deferred"):
        tdx.capture(m)


def test_module_apply_after_deferred_init_captures():
    # Module._apply sets `p.data = fn(p)`, a self-assignment when nothing
    # changes (.float() on a float model).
    m = tdx.deferred_init(lambda: torch.nn.Linear(4, 4).float())
    assert "tdx.parameter @weight" in tdx.capture(m).mlir


class SharedStorage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        w = torch.randn(8, 4)
        self.a = torch.nn.Parameter(w[:4])
        self.b = torch.nn.Parameter(w[4:])

    def forward(self, x):
        return x @ self.a.t() + x @ self.b.t()


def test_parameters_sharing_a_storage_are_read_by_name():
    prog = tdx.trace(tdx.deferred_init(SharedStorage), torch.randn(2, 4))
    assert "tdx.param_ref @a" in prog.mlir and "tdx.param_ref @b" in prog.mlir
    assert tdx_opt(prog.mlir).returncode == 0


class _Identity(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # tdx.trace takes a deferred module: a buffer the forward never reads.
        self.register_buffer("unused", torch.zeros(1))

    def forward(self, x):
        return x.clone()


@pytest.mark.parametrize("ir,dtype,runs,stored", tdx._C.dtypes())
def test_every_element_type_of_the_table_captures(ir, dtype, runs, stored):
    # The one table (include/tdx/StateFormat/DTypes.def) gives capture its
    # element types and the Python package their torch dtypes: a tensor of
    # each dtype captures as that spelling, and its program's signature
    # gives the dtype back.
    x = torch.ones(2, 3, dtype=dtype)
    prog = tdx.trace(tdx.deferred_init(_Identity), x)
    assert f"tensor<2x3x{ir}>" in prog.mlir
    # Types only the IR holds (runs: False) stop at the backends, by name.
    if not runs:
        partitioned = prog.copy().run_pipeline("tdx-place").run_pipeline("tdx-spmd")
        translate = os.path.join(os.path.dirname(tdx.__file__), "..", "..", "bin", "tdx-translate")
        done = subprocess.run([translate, "--tdx-to-cpp"], input=partitioned.mlir,
                              capture_output=True, text=True)
        assert done.returncode != 0 and f"argument #0 has type 'tensor<2x3x{ir}>'" in done.stderr, \
            done.stderr


def test_the_enums_python_reads_are_the_dialects():
    # tdx._C.dialect_enums() lists every enum ODS defines (docs/dialect.md is
    # generated from ODS), with its cases by value.
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "dialect.md")
    text = open(path).read().split("\n## Enums", 1)[1]
    documented = set(re.findall(r"^### (\w+)", text, re.M))
    enums = dict(tdx._C.dialect_enums())
    assert set(enums) == documented, (
        f"enums in ODS but not in tdx._C.dialect_enums(): {sorted(documented - set(enums))}; "
        f"add them to dialectEnums() in lib/Capture/ProgramOps.cpp")
    assert enums["ReduceKind"] == ["sum", "avg", "max", "min"]
    assert enums["CmpPredicate"][2] == "lt"


def test_a_saved_transpose_of_a_square_weight_is_not_the_weight():
    # torch.utils.checkpoint(use_reentrant=False) saves what its recompute
    # makes through detach(): autograd's saved `weight.t()` of a square
    # Linear reaches the trace as a view of the weight's storage that no
    # recorded op made. It has the weight's shape, but not its layout: the
    # backward must read the transpose (it read the weight itself, and the
    # gradients were wrong).
    import torch.utils.checkpoint as checkpoint

    class Square(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)

        def forward(self, x):
            return checkpoint.checkpoint(lambda h: self.b(self.a(h)), x, use_reentrant=False)

    torch.manual_seed(0)
    model = tdx.deferred_init(Square)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    prog = tdx.trace_train_step(model, opt, lambda m, x: m(x).square().sum(), torch.randn(4, 8))
    strided = re.findall(r'"aten::as_strided"\(%\w+\) \{args = \{size = array<i64: 8, 8>, '
                         r'storage_offset = 0 : i64, stride = array<i64: 1, 8>\}\}', prog.mlir)
    assert strided, prog.mlir
    torch.manual_seed(0)
    eager = Square()
    x = torch.randn(4, 8)
    start = {k: v.detach().clone() for k, v in eager.named_parameters()}
    eager(x).square().sum().backward()
    _, state = tdx.compile(prog).train([(x,)], params=start)
    for name, p in eager.named_parameters():
        assert torch.allclose(start[name] - state[name], p.grad, rtol=1e-5, atol=1e-6), name


# --- The two ways in (docs/capture.md, "Two ways in") ------------------------

_BOTH_WAYS = r'''
import sys, torch, tdx
sys.path.insert(0, {here!r})
from models import GPT2
torch.manual_seed(0)
model = tdx.deferred_init(GPT2)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
prog = tdx.trace_train_step(model, opt, lambda m, ids: m(ids).logsumexp(-1).mean(),
                            torch.randint(0, 128, (2, 8)))
real = tdx.materialize_module(tdx.deferred_init(GPT2))
torch.save({{"way": tdx.capture_way(), "mlir": prog.mlir,
            "state": {{k: v.detach().clone() for k, v in real.state_dict().items()}}}}, {out!r})
'''


def test_both_ways_capture_the_same_program_and_init(tmp_path):
    # One training step of GPT-2 (forward, backward, AdamW) and a deferred
    # init, captured once through the Fake key and once through torch's
    # Python dispatch: the same IR text and bitwise the same materialized
    # state.
    got = {}
    for way in ("fake-key", "dispatch-mode"):
        out = tmp_path / f"{way}.pt"
        env = dict(os.environ, TDX_CAPTURE=way)
        script = _BOTH_WAYS.format(here=os.path.dirname(__file__), out=str(out))
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        got[way] = torch.load(out)
        assert got[way]["way"] == way
    keyed, keyfree = got["fake-key"], got["dispatch-mode"]
    assert keyed["mlir"] == keyfree["mlir"]
    assert keyed["state"].keys() == keyfree["state"].keys()
    for name, value in keyed["state"].items():
        assert torch.equal(value, keyfree["state"][name]), name


def test_an_unknown_capture_way_is_named():
    env = dict(os.environ, TDX_CAPTURE="python")
    run = subprocess.run([sys.executable, "-c", "import tdx; tdx.capture_way()"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "TDX_CAPTURE=python is not a capture way; use fake-key or dispatch-mode" in run.stderr


def test_the_key_free_fake_tensor_is_a_subclass_only_there():
    layer = tdx.deferred_init(torch.nn.Linear, 4, 4)  # holds the recording
    p = layer.weight
    assert isinstance(p, torch.nn.Parameter) and tdx.is_fake(p) and tdx.is_deferred(p)
    assert isinstance(p, tdx.deferred.FakeTensor) == (tdx.capture_way() == "dispatch-mode")
    real = tdx.materialize_tensor(p)
    assert type(real) is torch.nn.Parameter and not tdx.is_fake(real)
