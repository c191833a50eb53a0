"""The GPU check's Python half (runs on the GPU machine with its PyTorch; no
tdx package needed): compares a program's outputs with the expected ones and
times PyTorch eager on the same model and weights.

    python3 check.py compare PROGRAM_DIR OUT.safetensors
    python3 check.py eager PROGRAM_DIR MODEL --steps N      # prints "eager_ms <ms>"
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


def compare(folder, output, tolerance):
    got = load(output)["output:0"].double()
    worst = 0.0
    for kind in ("eager", "cpu"):
        path = os.path.join(folder, f"expected.{kind}.safetensors")
        if not os.path.exists(path):
            continue
        want = load(path)["output:0"].double()
        if got.shape != want.shape:
            print(f"  shape {tuple(got.shape)} but {kind} has {tuple(want.shape)}")
            return 1
        rel = ((got - want).norm() / want.norm()).item()
        print(f"  relative error vs {kind}: {rel:.2e}")
        worst = max(worst, rel if rel == rel else float("inf"))
    return 0 if worst < tolerance else 1


def build(name):
    sys.path.insert(0, os.path.join(HERE, "models"))
    if name == "resnet18":
        from vision_models import IMAGES
        return IMAGES["resnet18"]().eval()
    import models
    return {"gpt2": models.GPT2, "llama": models.Llama}[name]()


def eager(folder, name, steps):
    model = build(name)
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    with torch.no_grad():
        for key, value in load(os.path.join(folder, "params.safetensors")).items():
            tensors[key].copy_(value)
    model = model.cuda()
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
    e = sub.add_parser("eager")
    e.add_argument("folder")
    e.add_argument("model")
    e.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if args.cmd == "compare":
        return compare(args.folder, args.output, args.tolerance)
    return eager(args.folder, args.model, args.steps)


if __name__ == "__main__":
    sys.exit(main())
