"""The GPU check's Python half (runs on the GPU machine with its PyTorch; no
tdx package needed): compares a program's outputs with the expected ones and
times PyTorch eager on the same model and weights.

    python3 check.py compare PROGRAM_DIR OUT.safetensors [--state STATE.safetensors
                             [--state-tolerance T] [--gpu-eager MODEL]]
    python3 check.py eager PROGRAM_DIR MODEL --steps N [--train]   # prints "eager_ms <ms>"
    mpirun -np R python3 check.py loop PROGRAM_DIR LIBRARY.so OUT.safetensors STATE.safetensors

"loop" is a user's training loop (loop.json: an lr per step, micro-batches
per step, an evaluation after every step) over a program built as a shared
object, driven through its C ABI (tdx_open, tdx_call, ...: the library that
tdx.Runner loads into each rank of an SPMD script), on the GPU.
"""

import argparse
import ctypes
import json
import math
import os
import struct
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool}


def load(path):
    """A safetensors file, read by its specification."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        data = bytearray(raw[8 + n + begin:8 + n + end])
        t = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(DTYPES[e["dtype"]]).reshape(e["shape"])
    return out


def save(path, tensors):
    """Writes `tensors` (name -> tensor) as a safetensors file."""
    names = {v: k for k, v in DTYPES.items()}
    header, blobs, at = {}, [], 0
    for name, t in sorted(tensors.items()):
        data = t.detach().cpu().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def loop_spec(folder):
    """A loop program's loop.json: "lrs" (one per step), "accumulation"
    (micro-batches per step), "evaluate" (an evaluation entry after each
    step, on the first micro-batch's rows)."""
    with open(os.path.join(folder, "loop.json")) as f:
        return json.load(f)


def cosine(base, steps):
    """CosineAnnealingLR's lr per step, from `base` over `steps`."""
    return [base * (1 + math.cos(math.pi * s / steps)) / 2 for s in range(steps)]


def eager_loop(model, optimizer, batches, spec, loss_fn):
    """Eager's loop as a user writes it: per step the schedule's lr, the
    step's micro-batches (each loss / k backward), the update, then the
    evaluation on the new weights; its losses ("s:output:0"), evaluations
    ("s:eval:0") and final parameters ("state:NAME")."""
    k, out = spec["accumulation"], {}
    rows = batches[0][0].shape[0] // k
    for s, ((x, y), lr) in enumerate(zip(batches, spec["lrs"])):
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        total = 0.0
        for i in range(k):
            loss = loss_fn(model, x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows])
            (loss / k).backward()
            total += loss.item()
        optimizer.step()
        out[f"{s}:output:0"] = torch.tensor(total / k)
        if spec["evaluate"]:
            with torch.no_grad():
                out[f"{s}:eval:0"] = loss_fn(model, x[:rows], y[:rows]).detach().cpu()
    out.update({f"state:{n}": v.detach() for n, v in model.named_parameters()})
    return out


def precision(folder):
    """A mixed-precision program's precision.json ("param_dtype", and the
    "state_tolerance" its final state is checked at), or None."""
    path = os.path.join(folder, "precision.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def eager_with_casts(model, optimizer, batches, loss_fn, dtype=torch.bfloat16):
    """Eager's steps as tdx.MixedPrecision computes them: each step a copy
    of the float32 parameters cast to `dtype` computes the loss and its
    gradients, which reach the float32 parameters as float32, and the
    optimizer updates those; the losses ("k:output:0") and final
    parameters ("state:NAME")."""
    from torch.func import functional_call
    out = {}
    for k, (x, y) in enumerate(batches):
        optimizer.zero_grad()
        params = dict(model.named_parameters())
        copies = {n: p.detach().to(dtype).requires_grad_() for n, p in params.items()}
        loss = loss_fn(lambda ids: functional_call(model, copies, (ids,)), x, y)
        loss.backward()
        for n, p in params.items():
            p.grad = copies[n].grad.float()
        optimizer.step()
        out[f"{k}:output:0"] = loss.detach().float().cpu()
    out.update({f"state:{n}": v.detach() for n, v in model.named_parameters()})
    return out


def lm_loss(model, ids, targets):
    """Cross-entropy of a language model's logits, or of a classifier's."""
    logits = model(ids)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1))


def loop(folder, library, output, state):
    """This rank of the loop on the program's shared object: each rank
    passes the global batch (the library takes its box), the step's lr as
    its hyperparameter input, and gets every output; rank 0 writes the
    losses and evaluations to `output` and the final state to `state`."""
    ctypes.CDLL("libmpi.so.40", mode=os.RTLD_GLOBAL)  # its components need its symbols
    lib = ctypes.CDLL(library)
    handle = ctypes.c_void_p
    lib.tdx_open.restype = handle
    lib.tdx_open.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.tdx_error.restype = ctypes.c_char_p
    lib.tdx_call.argtypes = [handle, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                             ctypes.c_int, ctypes.c_int]
    lib.tdx_output.argtypes = [handle, ctypes.c_int, ctypes.c_void_p]
    lib.tdx_write_state.argtypes = [handle, ctypes.c_char_p]
    lib.tdx_close.argtypes = [handle]
    args = [b"tdx", b"--params", os.path.join(folder, "params.safetensors").encode()]
    h = lib.tdx_open(len(args), (ctypes.c_char_p * len(args))(*args))
    if not h:
        raise SystemExit(f"loop: tdx_open failed: {lib.tdx_error().decode()}")

    def call(entry, inputs):
        keep = [t.contiguous() for t in inputs]
        pointers = (ctypes.c_void_p * len(keep))(*[t.data_ptr() for t in keep])
        if lib.tdx_call(h, entry, pointers, len(keep), 0) != 0:
            raise SystemExit(f"loop: call failed: {lib.tdx_error().decode()}")
        loss = torch.empty((), dtype=torch.float32)  # each entry returns a loss
        lib.tdx_output(h, 0, ctypes.c_void_p(loss.data_ptr()))
        return loss

    spec, data = loop_spec(folder), load(os.path.join(folder, "batches.safetensors"))
    k, out = spec["accumulation"], {}
    for s, lr in enumerate(spec["lrs"]):
        x, y = data[f"{s}:input:0"], data[f"{s}:input:1"]
        rows = x.shape[0] // k
        stacked = [t.reshape(k, rows, *t.shape[1:]) if k > 1 else t for t in (x, y)]
        out[f"{s}:output:0"] = call(0, stacked + [torch.tensor(lr, dtype=torch.float64)])
        if spec["evaluate"]:
            out[f"{s}:eval:0"] = call(1, [x[:rows], y[:rows]])
    if lib.tdx_write_state(h, state.encode()) != 0:
        raise SystemExit(f"loop: state failed: {lib.tdx_error().decode()}")
    lib.tdx_close(h)
    if int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == 0:
        save(output, out)
    return 0


def distance(have, want):
    """Relative error of `have` against each expected tensor of `want`, by
    group ("output", "state"), with the worst tensor of each; None where a
    tensor is missing or has another shape (printed)."""
    errors = {"output": (0.0, ""), "state": (0.0, "")}
    for key, w in want.items():
        is_state = key.startswith("state:")
        h = have.get(key)
        if h is None:
            print(f"  {key}: missing from the run's files")
            return None
        h, w = h.double().cpu(), w.double().cpu()
        if h.shape != w.shape:
            print(f"  {key}: shape {tuple(h.shape)} but expected {tuple(w.shape)}")
            return None
        rel = ((h - w).norm() / w.norm()).item() if w.norm() else (h - w).norm().item()
        rel = rel if rel == rel else float("inf")
        group = "state" if is_state else "output"
        if rel >= errors[group][0]:
            errors[group] = (rel, key)
    return errors


def compare(folder, output, tolerance, state=None, state_tolerance=1e-4, gpu_eager=None):
    """Every expected tensor next to the run's: "output:0" of a forward,
    "k:output:0" (step k's loss) and "state:NAME" (a parameter after the
    last step, within `state_tolerance`: rounding grows over steps) of
    training. With `gpu_eager` (a training program's model), PyTorch eager
    also trains on this GPU: the run is compared with it too, and the final
    state's tolerance is at least twice eager's own distance between this GPU
    and the CPU (AdamW's update divides by the root of the squared gradients,
    which lifts rounding in small gradients to the size of the step)."""
    have = load(output)
    have.update({f"state:{k}": v for k, v in (load(state) if state else {}).items()})
    if precision(folder):  # a mixed-precision step's own tolerance
        state_tolerance = max(state_tolerance, precision(folder)["state_tolerance"])
    refs = {}
    for kind in ("eager", "cpu"):
        path = os.path.join(folder, f"expected.{kind}.safetensors")
        if os.path.exists(path):
            refs[kind] = load(path)
    if gpu_eager:
        refs["eager on this GPU"] = eager_steps(folder, gpu_eager)
        floor = distance(refs["eager on this GPU"], refs["eager"])
        if floor is None:
            return 1
        print(f"  eager on this GPU vs eager on the CPU: outputs {floor['output'][0]:.2e}, "
              f"final state {floor['state'][0]:.2e} ({floor['state'][1]})")
        if 2 * floor["state"][0] > state_tolerance:
            state_tolerance = 2 * floor["state"][0]
            print(f"  final state tolerance: {state_tolerance:.2e} (twice eager's own)")
    worst = 0.0
    for kind, want in refs.items():
        errors = distance(have, want)
        if errors is None:
            return 1
        (out, out_key), (st, st_key) = errors["output"], errors["state"]
        print(f"  relative error vs {kind}: outputs {out:.2e}" + (f" ({out_key})" if out else "") +
              (f", final state {st:.2e} ({st_key})" if state else ""))
        worst = max(worst, out / tolerance, st / state_tolerance)
    return 0 if worst < 1 else 1


def build(name):
    sys.path.insert(0, os.path.join(HERE, "models"))
    if name == "resnet18":
        from vision_models import IMAGES
        return IMAGES["resnet18"]().eval()
    if name == "resnet-tiny":
        from vision_models import resnet_tiny
        return resnet_tiny()
    import models
    return {"gpt2": models.GPT2, "llama": models.Llama, "decoder": models.Decoder}[name]()


def loaded(folder, name):
    """Model `name` on the GPU with the program's parameters and buffers."""
    # Tensors the model makes in forward (torch.arange(t), say) on the GPU too.
    torch.set_default_device("cuda")
    model = build(name)
    # Every name: buffers, non-persistent ones too, and tied weights under
    # each of their names (named_parameters lists a tied one once).
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    tensors.update(model.state_dict(keep_vars=True))
    with torch.no_grad():
        for key, value in load(os.path.join(folder, "params.safetensors")).items():
            tensors[key].copy_(value)
    return model.cuda()


def training(folder, name, with_step=True):
    """The model on the GPU in training mode, its program's optimizer
    (torch.optim's class and arguments), one step (or, without `with_step`,
    the optimizer), and the program's batches."""
    model = loaded(folder, name).train()
    with open(os.path.join(folder, "optimizer.json")) as f:
        name, kwargs = json.load(f)
    optimizer = getattr(torch.optim, name)(model.parameters(), foreach=False, **kwargs)
    data = load(os.path.join(folder, "batches.safetensors"))
    batches = [(data[f"{k}:input:0"].cuda(), data[f"{k}:input:1"].cuda())
               for k in range(len(data) // 2)]
    if not with_step:
        return model, optimizer, batches

    def step(ids, targets):
        optimizer.zero_grad()
        loss = lm_loss(model, ids, targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return model, step, batches


def eager_steps(folder, name):
    """Eager's losses and final parameters after one step per batch, in
    float32 on this GPU (no TF32), as the expected files name them."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if os.path.exists(os.path.join(folder, "loop.json")):
        model, optimizer, batches = training(folder, name, with_step=False)
        return eager_loop(model, optimizer, batches, loop_spec(folder), lm_loss)
    if precision(folder):
        model, optimizer, batches = training(folder, name, with_step=False)
        return eager_with_casts(model, optimizer, batches, lm_loss,
                                getattr(torch, precision(folder)["param_dtype"]))
    model, step, batches = training(folder, name)
    out = {f"{k}:output:0": step(*b) for k, b in enumerate(batches)}
    out.update({f"state:{k}": v.detach() for k, v in model.named_parameters()})
    return out


def eager_train(folder, name, steps):
    """Times eager training steps on the program's batches (repeated)."""
    model, step, batches = training(folder, name)
    step(*batches[0])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for k in range(steps):
        step(*batches[k % len(batches)])
    torch.cuda.synchronize()
    print(f"eager_ms {(time.perf_counter() - start) * 1e3 / steps:.4f}")
    return 0


def eager(folder, name, steps):
    model = loaded(folder, name)
    inputs = [x.cuda() for _, x in sorted(load(os.path.join(folder, "in.safetensors")).items())]
    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            model(*inputs)
        torch.cuda.synchronize()
    print(f"eager_ms {(time.perf_counter() - start) * 1e3 / steps:.4f}")
    return 0


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("folder")
    c.add_argument("output")
    c.add_argument("--tolerance", type=float, default=1e-5)
    c.add_argument("--state", help="a training run's --save-state file")
    c.add_argument("--state-tolerance", type=float, default=1e-4,
                   help="relative error allowed in the final state (default 1e-4)")
    c.add_argument("--gpu-eager", metavar="MODEL",
                   help="a training program's model: also train eager on this GPU and compare")
    e = sub.add_parser("eager")
    e.add_argument("folder")
    e.add_argument("model")
    e.add_argument("--steps", type=int, default=20)
    e.add_argument("--train", action="store_true", help="time training steps")
    lp = sub.add_parser("loop")
    lp.add_argument("folder")
    lp.add_argument("library")
    lp.add_argument("output")
    lp.add_argument("state")
    args = parser.parse_args()
    if args.cmd == "loop":
        return loop(args.folder, args.library, args.output, args.state)
    if args.cmd == "compare":
        return compare(args.folder, args.output, args.tolerance, args.state,
                       args.state_tolerance, args.gpu_eager)
    if args.train:
        return eager_train(args.folder, args.model, args.steps)
    return eager(args.folder, args.model, args.steps)


if __name__ == "__main__":
    sys.exit(main())
