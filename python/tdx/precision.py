"""tdx.MixedPrecision: FSDP2's mixed-precision policy for a traced step.

Parameters and optimizer state stay stored in float32 (as placed); the
forward and backward compute on copies cast to ``param_dtype``; every
collective that sums (the data-parallel gradient reductions, and tensor and
sequence parallelism's) sums in ``reduce_dtype``; the optimizer's update runs
in float32 on float32 gradients."""

import contextlib
import dataclasses

import torch

from .errors import CaptureError

__all__ = ["MixedPrecision"]

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class MixedPrecision:
    """``param_dtype``: the dtype parameters are cast to for compute (the
    cast is recorded in the step as eager runs it: ``p.to(param_dtype)``,
    whose backward casts the gradient back to the parameter's dtype), and
    the dtype floating-point inputs of the model are cast to
    (``cast_forward_inputs``, FSDP2's default). ``reduce_dtype``: the dtype
    every inserted collective that sums runs in (``None``: the dtype of the
    value it sums)."""
    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype = torch.float32
    cast_forward_inputs: bool = True

    def __post_init__(self):
        for field in ("param_dtype", "reduce_dtype"):
            value = getattr(self, field)
            if value is None and field == "reduce_dtype":
                continue
            if value not in _FLOATS:
                raise ValueError(f"MixedPrecision({field}={value!r}): give a floating-point "
                                 f"torch dtype (torch.bfloat16, torch.float16, torch.float32)")
        if self.reduce_dtype not in (None, torch.float32, torch.float64):
            raise ValueError(f"MixedPrecision(reduce_dtype={self.reduce_dtype}): tdx sums in "
                             f"torch.float32 or torch.float64 (or None: in the value's own "
                             f"dtype); a narrower reduce dtype is not supported yet")


def _mlir_type(dtype):
    """The MLIR element type of a torch dtype, from the dtype table
    (tdx/StateFormat/DTypes.def)."""
    from . import _C
    return next(ir for ir, d, *_ in _C.dtypes() if d == dtype)


@contextlib.contextmanager
def computing_in(model, policy):
    """Within: ``model``'s floating-point parameters read as ``p.to(
    policy.param_dtype)`` (one cast per tensor, tied names share it) and, with
    ``cast_forward_inputs``, the floating-point tensors the model is called
    with cast the same way, as FSDP2's pre-forward hook does."""
    if policy is None:
        yield
        return
    casts, swapped = {}, {}
    named = ((f"{prefix}.{leaf}" if prefix else leaf, p)
             for prefix, module in model.named_modules(remove_duplicate=False)
             for leaf, p in module._parameters.items() if p is not None)
    for name, p in named:
        if p.dtype in _FLOATS and p.dtype != policy.param_dtype:
            if id(p) not in casts:
                casts[id(p)] = p.to(policy.param_dtype)
            swapped[name] = casts[id(p)]
    handle = None
    if policy.cast_forward_inputs:
        def cast_inputs(module, args):
            return tuple(a.to(policy.param_dtype) if isinstance(a, torch.Tensor)
                         and a.dtype in _FLOATS else a for a in args)
        handle = model.register_forward_pre_hook(cast_inputs)
    try:
        from torch.nn.utils.stateless import _reparametrize_module
        with _reparametrize_module(model, swapped):
            yield
    finally:
        if handle is not None:
            handle.remove()


def retraced(prog, policy):
    """`prog` recorded again with `policy`'s casts (its module replaced):
    the program must be as traced, with no placement yet."""
    again = getattr(prog, "_retrace", None)
    if again is None:
        raise CaptureError("mixed_precision records the step again with its casts: give a "
                           "program traced in this process by tdx.trace_train_step or tdx.trace")
    module = prog._module
    if module.is_partitioned() or module.is_placed() or module.meshes():
        raise CaptureError("mixed_precision records the step again with its casts, which "
                           "would drop the changes made to the program since it was traced "
                           "(meshes, placements); pass mixed_precision to the first "
                           "tdx.parallelize call on a freshly traced program")
    fresh = again(policy)
    prog._module = fresh._module
    for key, value in vars(fresh).items():
        if key != "_module":
            setattr(prog, key, value)
    prog.mixed_precision = policy
    if policy.reduce_dtype is not None:
        prog._module.set_reduce_type(_mlir_type(policy.reduce_dtype))
    return prog
