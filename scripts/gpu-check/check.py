"""The GPU check's Python half (runs on the GPU machine with its PyTorch; no
tdx package needed): compares a program's outputs with the expected ones and
times PyTorch eager on the same model and weights.

    python3 check.py compare PROGRAM_DIR OUT.safetensors [--state STATE.safetensors [--state-tolerance T]]
    python3 check.py eager PROGRAM_DIR MODEL --steps N [--train]   # prints "eager_ms <ms>"
"""

import argparse
import json
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


def compare(folder, output, tolerance, state=None, state_tolerance=1e-4):
    """Every expected tensor next to the run's: "output:0" of a forward,
    "k:output:0" (step k's loss) and "state:NAME" (a parameter after the
    last step, within `state_tolerance`: rounding grows over steps) of
    training."""
    got = load(output)
    final = load(state) if state else {}
    worst = 0.0
    for kind in ("eager", "cpu"):
        path = os.path.join(folder, f"expected.{kind}.safetensors")
        if not os.path.exists(path):
            continue
        errors = {"output": 0.0, "state": 0.0}
        for key, want in load(path).items():
            is_state = key.startswith("state:")
            have = final.get(key[len("state:"):]) if is_state else got.get(key)
            if have is None:
                print(f"  {key}: missing from the run's files")
                return 1
            have, want = have.double(), want.double()
            if have.shape != want.shape:
                print(f"  {key}: shape {tuple(have.shape)} but {kind} has {tuple(want.shape)}")
                return 1
            rel = ((have - want).norm() / want.norm()).item() if want.norm() else \
                (have - want).norm().item()
            rel = rel if rel == rel else float("inf")
            group = "state" if is_state else "output"
            errors[group] = max(errors[group], rel)
            worst = max(worst, rel / state_tolerance if is_state else rel / tolerance)
        print(f"  relative error vs {kind}: outputs {errors['output']:.2e}" +
              (f", final state {errors['state']:.2e}" if final else ""))
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
    return {"gpt2": models.GPT2, "llama": models.Llama}[name]()


def loaded(folder, name):
    """Model `name` on the GPU with the program's parameters and buffers."""
    model = build(name)
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    with torch.no_grad():
        for key, value in load(os.path.join(folder, "params.safetensors")).items():
            tensors[key].copy_(value)
    return model.cuda()


def eager_train(folder, name, steps):
    """Eager training steps on the program's batches (repeated), with its optimizer."""
    model = loaded(folder, name).train()
    # The program's optimizer (torch.optim's class and arguments).
    with open(os.path.join(folder, "optimizer.json")) as f:
        name, kwargs = json.load(f)
    optimizer = getattr(torch.optim, name)(model.parameters(), foreach=False, **kwargs)
    data = load(os.path.join(folder, "batches.safetensors"))
    batches = [(data[f"{k}:input:0"].cuda(), data[f"{k}:input:1"].cuda())
               for k in range(len(data) // 2)]

    def step(ids, targets):
        optimizer.zero_grad()
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        loss.backward()
        optimizer.step()

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
    e = sub.add_parser("eager")
    e.add_argument("folder")
    e.add_argument("model")
    e.add_argument("--steps", type=int, default=20)
    e.add_argument("--train", action="store_true", help="time training steps")
    args = parser.parse_args()
    if args.cmd == "compare":
        return compare(args.folder, args.output, args.tolerance, args.state,
                       args.state_tolerance)
    if args.train:
        return eager_train(args.folder, args.model, args.steps)
    return eager(args.folder, args.model, args.steps)


if __name__ == "__main__":
    sys.exit(main())
