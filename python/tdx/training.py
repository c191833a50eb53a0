"""tdx.trace_train_step: a whole training step (forward, backward, optimizer
update) recorded from PyTorch itself into one function."""

import torch

from . import _C
from .errors import CaptureError
from .precision import computing_in
from .program import Program, _checked_entries, _fake_inputs, _non_persistent

__all__ = ["trace_train_step"]


def _optimizer_state(optimizer):
    """The state keys torch's optimizer keeps per parameter, one list per
    param group; the state is created before the step (as torch creates it
    on the first step) so that the step only updates it."""
    for group in optimizer.param_groups:
        if group.get("foreach"):
            raise CaptureError("trace_train_step: build the optimizer with foreach=False "
                               "(tdx records the per-parameter update)")
    kind = type(optimizer)
    if kind is torch.optim.SGD:
        keys = []
        for group in optimizer.param_groups:
            if group["momentum"] != 0 and group["dampening"] != 0:
                raise CaptureError(
                    "trace_train_step: SGD with dampening != 0 starts its momentum buffer "
                    "from the first gradient, which a compiled step cannot tell from later "
                    "ones; use dampening=0")
            keys.append(["momentum_buffer"] if group["momentum"] != 0 else [])
        return keys
    if kind in (torch.optim.Adam, torch.optim.AdamW):
        return [["step", "exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if g["amsgrad"] else [])
                for g in optimizer.param_groups]
    raise CaptureError(
        f"trace_train_step supports torch.optim.SGD, Adam and AdamW; "
        f"{kind.__name__} is not supported yet")


def _step(optimizer):
    """``optimizer.step()`` in a form a trace can record. torch's Adam
    reads its step count with ``.item()`` unless ``differentiable``: its own
    tensor formulation is used. AdamW: its decoupled decay, then torch's Adam
    update with no decay (AdamW's update exactly)."""
    kind = type(optimizer)
    if kind is torch.optim.SGD:
        optimizer.step()
        return
    if kind is torch.optim.Adam:
        saved = [g["differentiable"] for g in optimizer.param_groups]
        for g in optimizer.param_groups:
            g["differentiable"] = True
        try:
            optimizer.step()
        finally:
            for g, d in zip(optimizer.param_groups, saved):
                g["differentiable"] = d
        return
    from torch.optim.adam import adam
    for g in optimizer.param_groups:
        params = [p for p in g["params"] if p.grad is not None]
        states = [optimizer.state[p] for p in params]
        for p in params:
            p.mul_(1 - g["lr"] * g["weight_decay"])
        beta1, beta2 = g["betas"]
        adam(params, [p.grad for p in params], [s["exp_avg"] for s in states],
             [s["exp_avg_sq"] for s in states],
             [s["max_exp_avg_sq"] for s in states] if g["amsgrad"] else [],
             [s["step"] for s in states], foreach=False, capturable=False,
             differentiable=True, amsgrad=g["amsgrad"], beta1=beta1, beta2=beta2, lr=g["lr"],
             weight_decay=0.0, eps=g["eps"], maximize=g["maximize"])


def _clip_grad_norm(params, max_norm):
    """torch.nn.utils.clip_grad_norm_ (2-norm) with the same ops,
    each gradient rescaled by a new value rather than in place (the in-place
    write goes through autograd's views of the gradients)."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return
    total = torch.norm(torch.stack([torch.norm(p.grad, 2.0) for p in params]), 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        p.grad = p.grad * coef


def _hyperparameter_names(optimizer, hyperparameters):
    """The names of the optimizer hyperparameters made step inputs, checked:
    numbers every param group has."""
    if isinstance(hyperparameters, str):
        hyperparameters = (hyperparameters,)
    names = list(hyperparameters)
    if not names:
        return names
    for g, group in enumerate(optimizer.param_groups):
        known = sorted(k for k, v in group.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool))
        for name in names:
            if name not in known:
                which = "param group" if len(optimizer.param_groups) == 1 else \
                    f"param group {g}"
                raise CaptureError(f"trace_train_step: {name!r} is not a number of the "
                                   f"optimizer's {which}; its hyperparameters are "
                                   f"{', '.join(known)}")
    if len(set(names)) != len(names):
        raise CaptureError(f"trace_train_step: hyperparameters {tuple(names)} names one twice")
    return names


_CONSTANT = r"^(\s*)(%[\w.]+) = (tdx\.full (\S+)|arith\.constant dense<(\S+)>) : " \
            r"tensor<(f16|bf16|f32|f64)>$"


def _with_hyperparameters(texts, names, values, probes):
    """The step's text with every constant that depends on a hyperparameter
    computed from a new f64 input of the step instead. `texts[0]` was traced
    at `values`; `texts[1 + 2 i]` and `texts[2 + 2 i]` with hyperparameter i
    at `probes[i][0]` and `probes[i][1]`. A constant must be affine in one
    hyperparameter (torch's optimizers are: lr scales the update, and
    AdamW's decay is 1 - lr * weight_decay, affine in each with the other
    fixed); the second probe checks it."""
    import re
    lines = [t.split("\n") for t in texts]
    if any(len(l) != len(lines[0]) for l in lines):
        raise CaptureError("trace_train_step: the step records other ops when a hyperparameter "
                           "changes (it decides something by its value); trace without "
                           "hyperparameters")
    out, args = [], [f"%tdx_{n}: tensor<f64>" for n in names]
    for k, line in enumerate(lines[0]):
        changed = [i for i in range(len(names))
                   if lines[1 + 2 * i][k] != line or lines[2 + 2 * i][k] != line]
        if not changed:
            out.append(line)
            continue
        m = re.match(_CONSTANT, line)
        if len(changed) > 1 or not m:
            which = " and ".join(names[i] for i in changed)
            raise CaptureError(f"trace_train_step: {line.strip()!r} depends on {which} in a way "
                               f"tdx cannot make an input (a splat constant affine in one "
                               f"hyperparameter); trace with fewer hyperparameters")
        i = changed[0]
        probed = [re.match(_CONSTANT, lines[j][k]) for j in (0, 1 + 2 * i, 2 + 2 * i)]
        if not all(probed):
            raise CaptureError(f"trace_train_step: {line.strip()!r} changes with {names[i]} "
                               f"into something other than a constant; trace without it")
        c0, c1, c2 = (float(q.group(4) if q.group(4) is not None else q.group(5))
                      for q in probed)
        (x1, x2), x0 = probes[i], values[i]
        slope = (c1 - c0) / (x1 - x0)
        offset = c0 - slope * x0
        if abs(offset + slope * x2 - c2) > 1e-6 * max(1.0, abs(c2)):
            raise CaptureError(f"trace_train_step: {line.strip()!r} is not affine in "
                               f"{names[i]}; tdx cannot make it an input")
        indent, result, type_ = m.group(1), m.group(2), m.group(6)
        t = f"%tdx_{names[i]}_{k}"
        f64 = "tensor<f64>"
        out += [f"{indent}{t}_b = tdx.full {slope:.17e} : {f64}",
                f"{indent}{t}_m = tdx.mul %tdx_{names[i]}, {t}_b : ({f64}, {f64}) -> {f64}",
                f"{indent}{t}_a = tdx.full {offset:.17e} : {f64}"]
        if type_ == "f64":
            out.append(f"{indent}{result} = tdx.add {t}_m, {t}_a : ({f64}, {f64}) -> {f64}")
        else:
            out += [f"{indent}{t}_s = tdx.add {t}_m, {t}_a : ({f64}, {f64}) -> {f64}",
                    f"{indent}{result} = tdx.cast {t}_s : {f64} to tensor<{type_}>"]
    text = "\n".join(out)
    head = re.search(r"func\.func @train_step\(([^)]*)\)", text)
    params = head.group(1)
    text = text[:head.start(1)] + ", ".join(([params] if params else []) + args) + \
        text[head.end(1):]
    return text


def trace_train_step(model, optimizer, loss_fn, *batch, max_grad_norm=None, hyperparameters=(),
                     accumulation_steps=1, _mixed_precision=None):
    """Records one training step of a deferred-init ``model`` into
    ``func.func @train_step(batch...) -> loss``: ``loss_fn(model, *batch)``
    (a scalar), its gradients by libtorch's autograd on fake tensors (eager's
    backward formulas), and ``optimizer.step()`` as torch runs it. Parameters
    and optimizer state are program state written back with ``tdx.assign``;
    optimizer state is named ``optimizer.<param name>.<key>`` with torch's
    keys and starts as torch starts it.

    ``optimizer`` is a torch.optim SGD, Adam or AdamW (foreach=False) built
    on the deferred model's parameters. ``max_grad_norm`` clips the
    gradients by their global 2-norm before the update, as
    ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)``
    does between ``backward()`` and ``step()``. The batch's values are never
    read, only shapes and dtypes.

    ``hyperparameters`` names optimizer hyperparameters (``"lr"``,
    ``"weight_decay"``, ...) that become inputs of the step, after the
    batch: 0-D float64 tensors, in the order named, so a learning-rate
    schedule drives the compiled step without compiling it again
    (``exe.train(batches, lr=[...])``). With several param groups each
    group has its own input per name (``runner.train_step(x, y,
    lr=sched.get_last_lr())`` gives one per group; a number sets all).
    ``prog.hyperparameters`` maps each name to its traced value (a list of
    one per group with several), the default. The step is recorded at the
    traced values and once per hyperparameter at two other values; every
    constant that changes must be affine in one hyperparameter (torch's SGD,
    Adam and AdamW are), and becomes computed from its input.

    ``accumulation_steps=k`` accumulates the gradients of k micro-batches
    before the update, as eager's loop of k ``(loss / k).backward()`` calls
    does: each batch element is k micro-batches concatenated along dim 0,
    the step returns the mean of their losses, and a data-parallel step
    reduces its gradients once per step. The program's inputs are the
    micro-batches stacked, ``(k, B, ...)`` (``exe.train`` and the runner
    take the concatenated ``(k * B, ...)`` and stack them)."""
    from . import collectives, torch_collectives
    from .deferred import _python_guards
    given = batch
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"trace_train_step takes a torch.optim optimizer, got "
                        f"{type(optimizer).__name__}")
    if max_grad_norm is not None and not (isinstance(max_grad_norm, (int, float))
                                          and max_grad_norm > 0):
        raise ValueError(f"max_grad_norm must be a positive number, got {max_grad_norm!r}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, *batch) -> scalar loss")
    if not (isinstance(accumulation_steps, int) and accumulation_steps >= 1):
        raise ValueError(f"accumulation_steps must be a positive int, got {accumulation_steps!r}")
    k = accumulation_steps
    if k > 1:
        for i, x in enumerate(batch):
            if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] % k:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise CaptureError(f"trace_train_step: accumulation_steps={k} splits every batch "
                                   f"element along dim 0 into {k} micro-batches, but batch "
                                   f"element {i} is {shape}; give a batch of k micro-batches "
                                   f"concatenated")
        batch = tuple(x.reshape(k, x.shape[0] // k, *x.shape[1:]) for x in batch)
    names_hp = _hyperparameter_names(optimizer, hyperparameters)
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
                    # torch's own starting values: zeros, and a 0-D step, in
                    # float64: the recorded (differentiable) Adam computes its
                    # bias corrections 1 - beta**step in the step's dtype, where
                    # eager's default path uses Python floats (float32 would
                    # put 0.999 ** 1 1.3e-5 off).
                    optimizer.state[p] = {k: torch.zeros(() if k == "step" else p.shape,
                                                         dtype=torch.float64 if k == "step"
                                                         else p.dtype)
                                          for k in group_keys}
    _C.deferred_init_into(recording, init_state)
    for p, state in optimizer.state.items():
        for key, t in state.items():
            entries.append((f"optimizer.{names[id(p)]}.{key}", t, True, ""))

    inputs = _fake_inputs(batch, "batch element", "trace_train_step")
    fresh = {p: dict(state) for p, state in optimizer.state.items()}
    # One input per hyperparameter, or per hyperparameter and param group
    # ("lr.0", "lr.1", ...) when the optimizer has several.
    groups = optimizer.param_groups
    keys = [(name, g) for name in names_hp for g in range(len(groups))]
    labels = [n if len(groups) == 1 else f"{n}.{g}" for n, g in keys]
    traced = [groups[g][n] for n, g in keys]

    comms = []

    def record():
        log = _C.Trace()
        before = len(recording)
        optimizer.state.clear()
        optimizer.state.update({p: dict(state) for p, state in fresh.items()})
        try:
            with _python_guards(fake_cuda=True), _C.TraceMode(log), \
                    torch_collectives.record() as rec:
                comms[:] = [rec]
                trained = [p for p in params if p.requires_grad]
                with computing_in(model, _mixed_precision):
                    loss, grads = _accumulated(model, loss_fn, inputs, trained, k)
                with torch.no_grad():
                    for p, g in zip(trained, grads):
                        p.grad = g
                    if max_grad_norm is not None:
                        _clip_grad_norm(trained, max_grad_norm)
                    _step(optimizer)
                    for p in trained:
                        p.grad = None
                loss = loss.detach()
        finally:
            # The optimizer goes back to fresh: its state lives in the program.
            optimizer.state.clear()
        if len(recording) != before:
            raise CaptureError("the step changed the module's deferred state outside the trace")
        return recording.to_mlir(entries, log, inputs, [loss], function="train_step",
                                 write_state=True,
                                 non_persistent=_non_persistent(model)), log

    text, log = record()
    if names_hp:
        texts, probes = [text], []
        try:
            for (name, g), value in zip(keys, traced):
                probe = (2 * value, 3 * value) if value else (1.0, 2.0)
                probes.append(probe)
                for x in probe:
                    groups[g][name] = x
                    texts.append(record()[0])
                groups[g][name] = value
        finally:
            for (name, g), value in zip(keys, traced):
                groups[g][name] = value
        text = _with_hyperparameters(texts, labels, traced, probes)
    prog = Program(collectives.with_mesh(text, comms[0]))
    prog.forward_op_names = log.op_names()
    prog.hyperparameters = {n: groups[0][n] if len(groups) == 1 else [gr[n] for gr in groups]
                            for n in names_hp}
    prog.accumulation_steps = k
    prog._model = model
    prog._retrace = lambda policy, accumulation_steps=accumulation_steps: trace_train_step(
        model, optimizer, loss_fn, *given, max_grad_norm=max_grad_norm,
        hyperparameters=hyperparameters, accumulation_steps=accumulation_steps,
        _mixed_precision=policy)
    return prog


def _accumulated(model, loss_fn, inputs, trained, k):
    """The step's loss and the gradients of `trained`: of loss_fn on the
    whole batch, or (k > 1) eager's accumulation over the k micro-batches
    stacked in dim 0 of each input: grad of loss_i / k summed in order, and
    the mean of the losses."""
    from .deferred import model_code_tracing
    total = None
    for p in trained:
        p.grad = None
    for i in range(k):
        micro = [x.narrow(0, i, 1).reshape(x.shape[1:]) for x in inputs] if k > 1 else inputs
        with model_code_tracing():
            loss = loss_fn(model, *micro)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise CaptureError("loss_fn must return a scalar (0-D) tensor")
        # backward(), as eager's loop calls it (torch.utils.checkpoint's
        # reentrant form refuses autograd.grad): the parameters' .grad
        # accumulate as eager's do.
        (loss / k if k > 1 else loss).backward()
        with torch.no_grad():
            total = loss.detach() if total is None else total + loss.detach()
    grads = tuple(p.grad for p in trained)
    for p in trained:
        p.grad = None
    return (total / k if k > 1 else total), grads
