"""tdx.trace_train_step: a whole training step (forward, backward, optimizer
update) recorded from PyTorch itself into one function."""

import torch

from . import _C
from .errors import CaptureError
from .program import Program, _checked_entries

__all__ = ["trace_train_step"]


def _optimizer_state(optimizer):
    """(key, init) of every state tensor torch's optimizer keeps per
    parameter, created before the step so that the step only updates it."""
    if type(optimizer) is torch.optim.SGD:
        keys = []
        for group in optimizer.param_groups:
            if group["momentum"] != 0 and group["dampening"] != 0:
                raise CaptureError(
                    "trace_train_step: SGD with dampening != 0 starts its momentum buffer "
                    "from the first gradient, which a compiled step cannot tell from later "
                    "ones; use dampening=0")
            if group.get("foreach"):
                raise CaptureError("trace_train_step: build the optimizer with foreach=False")
            keys.append(["momentum_buffer"] if group["momentum"] != 0 else [])
        return keys
    raise CaptureError(
        f"trace_train_step supports torch.optim.SGD (with or without momentum) so far; "
        f"{type(optimizer).__name__} is not supported yet (torch 1.13's Adam and AdamW "
        f"read their step count with .item(), which a traced step cannot)")


def trace_train_step(model, optimizer, loss_fn, *batch):
    """Records one training step of a deferred-init ``model`` into
    ``func.func @train_step(batch...) -> loss``: ``loss_fn(model, *batch)``
    (a scalar), its gradients by libtorch's autograd on fake tensors (eager's
    backward formulas), and ``optimizer.step()`` as torch runs it. Parameters
    and optimizer state are program state written back with ``tdx.assign``;
    optimizer state is named ``optimizer.<param name>.<key>`` with torch's
    keys and starts as torch starts it.

    ``optimizer`` is a torch.optim optimizer built on the deferred model's
    parameters. The batch's values are never read, only shapes and dtypes."""
    from .deferred import _python_guards
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"trace_train_step takes a torch.optim optimizer, got "
                        f"{type(optimizer).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, *batch) -> scalar loss")
    entries, recording = _checked_entries(model, "trace_train_step")
    names = {id(t): name for name, t, _, tied in entries if not tied}
    keys = _optimizer_state(optimizer)
    params = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise CaptureError("the optimizer holds a tensor that is not a parameter of "
                                   "the model; build it on model.parameters()")
            params.append(p)
    if optimizer.state:
        raise CaptureError("the optimizer has stepped before; trace_train_step needs a fresh one")

    def init_state():
        for group, group_keys in zip(optimizer.param_groups, keys):
            for p in group["params"]:
                if group_keys:
                    optimizer.state[p] = {k: torch.zeros(p.shape, dtype=p.dtype) for k in group_keys}
    _C.deferred_init_into(recording, init_state)
    for p, state in optimizer.state.items():
        for key, t in state.items():
            entries.append((f"optimizer.{names[id(p)]}.{key}", t, True, ""))

    inputs = []
    for i, x in enumerate(batch):
        if not isinstance(x, torch.Tensor):
            raise CaptureError(f"batch element #{i} is a {type(x).__name__}; trace_train_step "
                               f"takes tensors")
        inputs.append(x if _C.is_fake(x) else _C.fake_like(x))
    log = _C.Trace()
    before = len(recording)
    try:
        with _python_guards(fake_cuda=True), _C.TraceMode(log):
            loss = loss_fn(model, *inputs)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise CaptureError("loss_fn must return a scalar (0-D) tensor")
            trained = [p for p in params if p.requires_grad]
            grads = torch.autograd.grad(loss, trained, allow_unused=True)
            with torch.no_grad():
                for p, g in zip(trained, grads):
                    p.grad = g
                optimizer.step()
                for p in trained:
                    p.grad = None
            loss = loss.detach()
    finally:
        # The optimizer goes back to fresh: its state lives in the program.
        optimizer.state.clear()
    if len(recording) != before:
        raise CaptureError("the step changed the module's deferred state outside the trace")
    prog = Program(recording.to_mlir(entries, log, inputs, [loss], function="train_step",
                                     write_state=True))
    prog.forward_op_names = log.op_names()
    return prog
