"""Fake tensors and deferred module initialization.

Both run in the C++ engine at libtorch's dispatcher (lib/Capture; docs/capture.md
says which dispatch keys); this module gives them PyTorch-style Python
entry points and guards the few places where Python reads tensor memory
directly (repr, numpy, tolist, item, torch.tensor from data).
"""

import contextlib
import functools
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode

from . import _C
from .errors import CaptureError, FakeTensorError

__all__ = [
    "capture_way",
    "fake_mode",
    "is_fake",
    "meta_like",
    "deferred_init",
    "is_deferred",
    "materialize_tensor",
    "materialize_module",
]


# --- The key-free way in (docs/capture.md, "Two ways in") ------------------
# With TDX_CAPTURE=dispatch-mode (or a build without the dispatch keys), ops
# reach the C++ engine through torch's Python dispatch: a fake tensor is of
# this subclass, and fake_mode pushes the mode below. Both hand the op to
# the same engine, _C._fake_dispatch.


class FakeTensor(torch.Tensor):
    """A fake tensor under the key-free capture: ``is_fake`` is what tells a
    fake tensor, under either way."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _C._fake_dispatch(func, args, kwargs or {})


class _FakeDispatchMode(TorchDispatchMode):
    """Sends every op to the engine while fake mode is on: factories make fake
    tensors, and libtorch takes its paths for tensors without data."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _C._fake_dispatch(func, args, kwargs or {})


_fake_modes = []  # the modes fake_mode pushed, innermost last
_set_aside = []   # per RealMode: the modes it took off the dispatch stack


def _enter_fake():
    mode = _FakeDispatchMode()
    mode.__enter__()
    _fake_modes.append(mode)


def _exit_fake():
    _fake_modes.pop().__exit__(None, None, None)


def _enter_real():
    taken = []
    while torch._C._len_torch_dispatch_stack() and isinstance(
            torch._C._get_dispatch_stack_at(torch._C._len_torch_dispatch_stack() - 1),
            _FakeDispatchMode):
        taken.append(_pop_mode())
    _set_aside.append(taken)


def _exit_real():
    for mode in reversed(_set_aside.pop()):
        _push_mode(mode)


_C._set_python_hooks(FakeTensor, _enter_fake, _exit_fake, _enter_real, _exit_real)


def capture_way():
    """How ops reach tdx's capture engine in this process: ``"fake-key"``
    (torch's reserved ``DispatchKey::Fake``, the default) or
    ``"dispatch-mode"`` (torch's Python dispatch, which needs no reserved key;
    ``TDX_CAPTURE=dispatch-mode``, or a build with ``-DTDX_CAPTURE_KEYS=OFF``).
    docs/capture.md, "Two ways in"."""
    return _C.capture_way()


def is_fake(tensor):
    """Whether `tensor` is fake: it has a device, shape and dtype but no data."""
    return isinstance(tensor, torch.Tensor) and _C.is_fake(tensor)


def meta_like(tensor):
    """A meta-device tensor with the shape, strides and dtype of `tensor`."""
    return _C.meta_like(tensor)


_constructing = 0  # deferred_init calls running (a module's constructor)


def _value_without_randomness(tensor):
    """While a module is built under deferred_init: the real value of a
    deferred tensor computed without random draws (a constructor's
    ``torch.linspace(0, rate, depth).tolist()``), replayed from the ops it
    depends on alone. None for any other fake tensor, and outside
    construction (a traced forward must not bake a state's value in)."""
    if not _constructing or not _C.is_deferred(tensor):
        return None
    recording = _C.recording_of(tensor)
    if recording is None:
        return None
    try:
        return recording.materialize_ancestors([tensor])[0]
    except CaptureError:
        return None


def _guard(name, message):
    """Makes Tensor.<name> raise FakeTensorError(message(caller)) on fakes."""
    original = getattr(torch.Tensor, name)

    @functools.wraps(original)
    def guarded(self, *args, **kwargs):
        if _C.is_fake(self):
            real = _value_without_randomness(self)
            if real is not None:
                return original(real, *args, **kwargs)
            import inspect
            caller = inspect.stack()[1]
            raise FakeTensorError(message(f"{caller.filename}:{caller.lineno}"))
        return original(self, *args, **kwargs)

    setattr(torch.Tensor, name, guarded)


# Python paths that read tensor memory without the dispatcher.
for _name in ("numpy", "tolist", "item", "__array__"):
    _guard(_name, lambda where, n=_name: (
        f"Tensor.{n}() at {where} reads data, and this tensor is fake (it has a "
        f"shape and device but no storage); call tdx.materialize_tensor or "
        f"tdx.materialize_module first"))
# Python control flow on tensor values.
for _name in ("__bool__", "__int__", "__float__", "__index__"):
    _guard(_name, lambda where, n=_name: (
        f"data-dependent control flow at {where}: {n} of a fake tensor needs its "
        f"data, which it does not have; capture code whose control flow depends "
        f"only on shapes, or materialize first"))

_original_repr = torch.Tensor.__repr__


def _repr(self, *args, **kwargs):
    if _C.is_fake(self):
        extra = ", deferred=True" if _C.is_deferred(self) else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (f"tensor(..., size={tuple(self.shape)}, dtype={self.dtype}, "
                f"device='{self.device}'{grad}, fake=True{extra})")
    return _original_repr(self, *args, **kwargs)


torch.Tensor.__repr__ = _repr

# Tensors built from Python data are built for real, then lifted to fake
# tensors (recorded as constants while recording).
_FROM_DATA = ("tensor", "as_tensor", "from_numpy")
_original_from_data = {name: getattr(torch, name) for name in _FROM_DATA}
_depth = 0


def _lifting(name):
    original = _original_from_data[name]

    @functools.wraps(original)
    def lifted(*args, **kwargs):
        device = kwargs.pop("device", None)
        data = args[0] if args else kwargs.get("data")
        if isinstance(data, torch.Tensor) and _C.is_fake(data):
            # torch.tensor(t) copies a tensor, torch.as_tensor(t) converts
            # it: recorded ops on the fake tensor, not a constant.
            out = data.detach().clone() if name == "tensor" else data
            dtype = kwargs.get("dtype")
            if dtype is not None or device is not None:
                out = out.to(device=device, dtype=dtype)
            return out.requires_grad_(True) if kwargs.get("requires_grad") else out
        with _C.RealMode():
            real = original(*args, **kwargs)
        fake = _C.lift_constant(real)
        if device is not None and torch.device(device) != fake.device:
            fake = fake.to(device)
        return fake

    return lifted


# torch.nn.init.trunc_normal_ draws by rejection since torch 2.10: how many
# draws it takes depends on the values drawn (``mask.any()``), which a fake
# tensor does not have. On a fake tensor it is one op, tdx::trunc_normal_:
# its real kernel is torch's own function, so materializing runs what eager
# ran (bitwise, from the same generator state), its meta kernel keeps the
# shape, and the IR gets the counter-based tdx.trunc_normal.
_original_trunc_normal = torch.nn.init.trunc_normal_
_library = torch.library.Library("tdx", "FRAGMENT")  # collectives.py adds to tdx::
_library.define("trunc_normal_(Tensor(a!) self, float mean, float std, float a, float b) "
                "-> Tensor(a!)")


for _key in ("CPU", "CUDA"):
    _library.impl("trunc_normal_", _original_trunc_normal, _key)
_library.impl("trunc_normal_", lambda tensor, mean, std, a, b: tensor, "Meta")


_original_trunc_normal_body = torch.nn.init._no_grad_trunc_normal_


# torch.nn.init.trunc_normal_ calls this module global: replacing it (not
# trunc_normal_ itself) reaches code that took a reference to trunc_normal_
# at import (Hugging Face's initialization table).
@functools.wraps(_original_trunc_normal_body)
def _trunc_normal(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    if not _C.is_fake(tensor):
        return _original_trunc_normal_body(tensor, mean, std, a, b, generator=generator)
    if generator is not None:
        raise FakeTensorError(
            "torch.nn.init.trunc_normal_ with a generator= on a fake tensor: tdx replays "
            "initialization from the global generator (torch.manual_seed); drop generator=")
    with torch.no_grad():
        return torch.ops.tdx.trunc_normal_(tensor, float(mean), float(std), float(a), float(b))


_original_data = torch.Tensor.data


def _set_data(self, new_data):
    # `tensor.data = x` bypasses libtorch's dispatcher: record it by hand.
    if _C.is_fake(self) or _C.is_fake(new_data):
        _C.record_set_data(self, new_data)
    else:
        _original_data.__set__(self, new_data)


torch.Tensor.data = property(_original_data.__get__, _set_data,
                             doc=_original_data.__doc__)


@contextlib.contextmanager
def model_code_tracing():
    """Within it, ``torch.compiler.is_compiling()`` is true, as under
    torch.compile and torch.export: a model's own code (Hugging Face's mask
    builders, for one) then skips the checks that read a tensor's values,
    which a capture on fake tensors cannot answer. Only around the model's
    forward (and a step's loss_fn): the optimizer's step keeps eager's
    Python-number path."""
    saved = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    moe = sys.modules.get("transformers.integrations.moe")
    choice = getattr(moe, "_can_use_grouped_mm", None)
    if choice is not None:
        moe._can_use_grouped_mm = _as_eager(choice)
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = saved
        if choice is not None:
            moe._can_use_grouped_mm = choice


def _as_eager(decide):
    """`decide` (a model library's choice of kernel) answered as eager
    would, not as under torch.compile: Hugging Face's MoE experts pick
    torch's grouped_mm eagerly, and under torch.compile a Python loop of
    matmuls over the split sizes read to the host (which fake tensors do
    not have) for any dtype but bf16."""
    def eager(*args, **kwargs):
        saved = torch.compiler._is_compiling_flag
        torch.compiler._is_compiling_flag = False
        try:
            return decide(*args, **kwargs)
        finally:
            torch.compiler._is_compiling_flag = saved
    return eager


def _experts_loop_hint(tb):
    """The fix, when a refused op is in Hugging Face's `eager` experts loop
    (a Python loop over the experts that tokens were routed to: nonzero,
    per-expert torch.where)."""
    found = None
    while tb is not None:
        me = tb.tb_frame.f_locals.get("self")
        if tb.tb_frame.f_code.co_name == "forward" and type(me).__name__.endswith("Experts") \
                and "transformers" in tb.tb_frame.f_code.co_filename:
            found = (type(me).__name__, os.path.basename(tb.tb_frame.f_code.co_filename),
                     tb.tb_lineno)   # the innermost: the loop itself
        tb = tb.tb_next
    if found is None:
        return ""
    return (f"; this is Hugging Face's 'eager' experts loop ({found[0]} at {found[1]}:"
            f"{found[2]}), whose shapes follow the routing: build the model with "
            f"experts_implementation=\"grouped_mm\" (transformers' default), which tdx takes")


def _torch_compile_frame(error):
    """'file:line (function)' of the function torch.compile (dynamo) was
    compiling on the way to `error`, or None when dynamo was not compiling.
    (Dynamo's disable wrapper, eval_frame.py, also stands between torch and
    Python dispatch handlers: only its compiling frames count.)"""
    import os
    dynamo = os.path.join("torch", "_dynamo") + os.sep
    frames = []
    tb = error.__traceback__
    while tb is not None:
        if dynamo in tb.tb_frame.f_code.co_filename:
            frames.append(tb.tb_frame)
        tb = tb.tb_next
    compiling = [f for f in frames if os.path.basename(f.f_code.co_filename)
                 in ("convert_frame.py", "symbolic_convert.py")]
    if not compiling:
        return None
    for frame in frames:
        fn = frame.f_locals.get("fn")
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        if code is not None and dynamo not in code.co_filename:
            return f"{code.co_filename}:{code.co_firstlineno} ({code.co_name})"
    return f"code run by {compiling[0].f_code.co_filename}:{compiling[0].f_lineno}"


@contextlib.contextmanager
def _python_guards(fake_cuda):
    """Installs the Python-side pieces of fake mode for its duration."""
    global _depth
    saved_lazy_init = torch.cuda._lazy_init
    _depth += 1
    if _depth == 1:
        for name in _FROM_DATA:
            setattr(torch, name, _lifting(name))
        torch.nn.init._no_grad_trunc_normal_ = _trunc_normal
    if fake_cuda:
        # No CUDA runtime is needed to describe CUDA tensors.
        torch.cuda._lazy_init = lambda: None
    try:
        yield
    except Exception as e:
        compiled = _torch_compile_frame(e)
        if compiled and "flex_attention" in compiled:
            raise CaptureError(
                f"tdx: FlexAttention ({compiled}) is not supported by tdx yet: it is built "
                f"on torch.compile, which cannot take tdx's fake tensors; use scaled dot "
                f"product attention (attn_implementation='sdpa' in a Hugging Face config, "
                f"or torch.nn.functional.scaled_dot_product_attention)") from None
        if compiled:
            raise CaptureError(
                f"tdx: {compiled} is compiled with torch.compile, which cannot take tdx's fake "
                f"tensors; tdx compiles the whole model itself: trace the function without "
                f"torch.compile (remove the decorator, or trace the module before "
                f"torch.compile wraps it)") from None
        # libtorch raises what tdx's fake tensors refuse ("tdx: aten::nonzero's
        # result has a shape that depends on ...") as a plain RuntimeError.
        if not isinstance(e, RuntimeError) or isinstance(e, FakeTensorError) or \
                not str(e).startswith("tdx: "):
            raise
        raise FakeTensorError(str(e) + _experts_loop_hint(e.__traceback__)) from None
    finally:
        torch.cuda._lazy_init = saved_lazy_init
        _depth -= 1
        if _depth == 0:
            for name, fn in _original_from_data.items():
                setattr(torch, name, fn)
            torch.nn.init._no_grad_trunc_normal_ = _original_trunc_normal_body


@contextlib.contextmanager
def fake_mode(*, fake_cuda=False):
    """Within it, tensor factories make fake tensors: they report a device
    (cpu, or cuda with ``fake_cuda=True`` even without a GPU), a shape and a
    dtype computed by meta kernels, and own no storage.

        with tdx.fake_mode(fake_cuda=True):
            t = torch.ones(10, device="cuda")   # fake=True, no memory
    """
    with _python_guards(fake_cuda), _C.FakeMode(fake_cuda):
        yield


# --- Deferred init ---------------------------------------------------------

def deferred_init(module_fn, *args, **kwargs):
    """Builds ``module_fn(*args, **kwargs)`` with fake parameters and buffers,
    recording every op (views, in-place ops, ``.data`` assignment,
    ``torch.nn.init``, tied weights) for later materialization.

    Call ``torch.manual_seed`` before it exactly as you would before eager
    construction: materializing replays the record from that generator
    state, so values come out bitwise equal to eager construction.

    A constructor may read the values of tensors it computes without random
    draws (``torch.linspace(0, rate, depth).tolist()``, as timm's models
    do): those are replayed from the ops they depend on alone. Reading a
    value drawn at random raises ``tdx.FakeTensorError``.
    """
    if isinstance(module_fn, torch.nn.Module):
        raise TypeError("deferred_init got a module that is already built (and "
                        "allocated); pass its class or a function that builds it, "
                        "for example tdx.deferred_init(MyModel, hidden=64)")
    if not callable(module_fn):
        raise TypeError(f"deferred_init needs a callable that builds the module, "
                        f"got {type(module_fn).__name__}")
    global _constructing
    built = []
    _constructing += 1
    try:
        with _python_guards(fake_cuda=True):
            recording = _C.deferred_init(lambda: built.append(module_fn(*args, **kwargs)))
    finally:
        _constructing -= 1
    module = built[0]
    # The recording lives as long as what it built: the module, or the
    # tensors returned.
    if isinstance(module, torch.nn.Module):
        object.__setattr__(module, "_tdx_recording", recording)
    else:
        for t in _tensors_in(module):
            t._tdx_recording = recording
    return module


def _tensors_in(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)


def _recording(obj):
    if isinstance(obj, torch.Tensor):
        return _C.recording_of(obj) if _C.is_deferred(obj) else None
    for t in _state_tensors(obj):
        if _C.is_deferred(t):
            return _C.recording_of(t)
    return None


def _state_tensors(module):
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None:
                yield p
        for b in m._buffers.values():
            if b is not None:
                yield b


def is_deferred(obj):
    """Whether a tensor, or any parameter or buffer of a module, is deferred."""
    if isinstance(obj, torch.Tensor):
        return _C.is_deferred(obj)
    if isinstance(obj, torch.nn.Module):
        return any(_C.is_deferred(t) for t in _state_tensors(obj))
    raise TypeError(f"is_deferred takes a tensor or an nn.Module, got {type(obj).__name__}")


def _materialize_all(tensors, device):
    by_recording = {}
    for t in tensors:
        rec = _C.recording_of(t)
        if rec is None:
            raise CaptureError("this deferred tensor's recording is gone (the module "
                               "or tensors deferred_init returned were freed); keep "
                               "them alive, or build again with tdx.deferred_init")
        by_recording.setdefault(id(rec), (rec, []))[1].append(t)
    real = {}
    for rec, ts in by_recording.values():
        for t, r in zip(ts, rec.materialize(ts, device)):
            real[id(t)] = r
    return real


def materialize_tensor(tensor, *, device=None):
    """The real value of a deferred tensor. Replays the whole recording it
    belongs to (in recorded order), so the value is the one eager construction
    gives. ``device`` overrides the recorded device (for example "cpu")."""
    if not isinstance(tensor, torch.Tensor) or not _C.is_deferred(tensor):
        return tensor
    real = _materialize_all([tensor], device)[id(tensor)]
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(real, requires_grad=tensor.requires_grad)
    return real


def materialize_module(module, buffers_only=False, check_fn=None, *, device=None):
    """Replaces the deferred parameters and buffers of ``module`` (and its
    submodules, where ``check_fn(submodule)`` is true) by real ones, replaying
    the recording in recorded order. Tied parameters stay tied. Returns the
    module."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"materialize_module takes an nn.Module, got {type(module).__name__}")
    slots = []  # (dict, name, tensor)
    for m in module.modules():
        if check_fn is not None and not check_fn(m):
            continue
        if not buffers_only:
            slots += [(m._parameters, n, p) for n, p in m._parameters.items()
                      if p is not None and _C.is_deferred(p)]
        slots += [(m._buffers, n, b) for n, b in m._buffers.items()
                  if b is not None and _C.is_deferred(b)]
    unique = list({id(t): t for _, _, t in slots}.values())
    if not unique:
        return module
    real = _materialize_all(unique, device)
    made = {}
    for slot, name, t in slots:
        if id(t) not in made:
            r = real[id(t)]
            made[id(t)] = (torch.nn.Parameter(r, requires_grad=t.requires_grad)
                           if isinstance(t, torch.nn.Parameter) else r)
        slot[name] = made[id(t)]
    return module
