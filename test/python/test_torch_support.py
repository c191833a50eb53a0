"""tdx on the torch users have: an unsupported torch refused by name, and
what torch 2.x users write that tdx cannot take refused at trace with the
op or line and the fix."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tdx

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_SCRIPT = os.path.join(HERE, "..", "..", "python", "tdx", "_torch_version.py")


def test_torch_older_than_supported_is_refused_at_configure_and_import(tmp_path):
    # What CMake runs at configure time (and scripts/setup.sh), with a torch
    # 1.13 on the path.
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '1.13.1'\n")
    done = subprocess.run([sys.executable, VERSION_SCRIPT], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1
    assert "tdx needs torch >= 2.11" in done.stderr and "torch 1.13.1" in done.stderr
    assert "requirements.txt" in done.stderr and "TDX_PYTHON" in done.stderr
    # The supported torch passes.
    assert subprocess.run([sys.executable, VERSION_SCRIPT]).returncode == 0
    # import tdx with an old torch: refused before the extension loads.
    script = "import torch; torch.__version__ = '1.13.1'\nimport tdx"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode != 0
    assert "UnsupportedTorchError" in done.stderr and "torch >= 2.11" in done.stderr


def test_built_against_this_torch():
    # The extension links the interpreter's torch, not another one.
    import tdx._C as ext
    libs = subprocess.run(["ldd", ext.__file__], capture_output=True, text=True).stdout
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    linked = [line for line in libs.splitlines() if "libtorch_cpu.so" in line]
    assert linked and torch_lib in linked[0], libs


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)


def test_torch_compile_inside_the_model_is_named():
    class Compiled(Linear):
        @torch.compile
        def forward(self, x):
            return self.fc(x).relu()

    model = tdx.deferred_init(Compiled)
    if tdx._C.capture_way() == "dispatch-mode":
        # Dynamo steps aside while a TorchDispatchMode is active: under the
        # key-free way the forward runs as written and is captured.
        prog = tdx.trace(model, torch.randn(2, 4))
        assert "tdx.matmul" in prog.mlir and "tdx.relu" in prog.mlir, prog.mlir
        return
    with pytest.raises(tdx.CaptureError, match=r"test_torch_support.py:\d+ \(forward\) is "
                                               r"compiled with torch.compile.*remove the "
                                               r"decorator"):
        tdx.trace(model, torch.randn(2, 4))


@pytest.fixture(scope="module")
def custom_ops():
    lib = torch.library.Library("tdx_test_ops", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    lib.define("thrice(Tensor x) -> Tensor")
    lib.impl("thrice", lambda x: x * 3, "CPU")
    torch.library.register_fake("tdx_test_ops::thrice", lambda x: torch.empty_like(x))
    yield
    del lib


def test_a_custom_op_without_a_fake_kernel_is_named(custom_ops):
    class Twice(Linear):
        def forward(self, x):
            return torch.ops.tdx_test_ops.twice(self.fc(x))

    with pytest.raises(tdx.FakeTensorError,
                       match=r"tdx_test_ops::twice has no meta kernel in torch 2\.\d+.*"
                             r"torch.library.register_fake"):
        tdx.trace(tdx.deferred_init(Twice), torch.randn(2, 4))

    # With its fake kernel it is recorded (a generic op, run by ATen on the CPU).
    class Thrice(Linear):
        def forward(self, x):
            return torch.ops.tdx_test_ops.thrice(self.fc(x))

    prog = tdx.trace(tdx.deferred_init(Thrice), torch.randn(2, 4))
    assert 'tdx.aten "tdx_test_ops::thrice"' in prog.mlir


def test_a_tensor_subclass_that_reads_values_is_named_at_its_line():
    class Quantized(torch.Tensor):
        """A weight-only quantization subclass: its dispatch reads the
        weight's scale, a value."""

        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

        def __init__(self, inner):
            self.inner = inner

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = [a.inner if isinstance(a, Quantized) else a for a in args]
            scale = float(unwrap[0].abs().max())  # reads data
            return func(*unwrap, **(kwargs or {})) / scale

    class Model(Linear):
        def forward(self, x):
            return Quantized(self.fc(x)) * 2

    with pytest.raises(tdx.FakeTensorError, match=r"test_torch_support.py:\d+.*fake tensor"):
        tdx.trace(tdx.deferred_init(Model), torch.randn(2, 4))
