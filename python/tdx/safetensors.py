"""Reading and writing safetensors files (the format model binaries use for
inputs, outputs and parameters), without the `safetensors` package."""

import json
import struct

import torch

from .errors import TdxError

_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
           torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.bool: "BOOL"}
_BY_NAME = {v: k for k, v in _DTYPES.items()}


def save(tensors, path):
    """Writes a dict of name to tensor."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise TdxError(f"cannot store '{name}' of dtype {t.dtype} in safetensors; "
                           f"use one of {', '.join(str(d) for d in _DTYPES)}")
        data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() \
            if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load(path):
    """Reads a safetensors file into a dict of name to tensor."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise TdxError(f"{path} is not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", raw[:8])
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise TdxError(f"{path} has a corrupt safetensors header: {e}") from None
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        data = bytearray(raw[8 + n + begin:8 + n + end])
        dtype = _BY_NAME[entry["dtype"]]
        t = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dtype).reshape(entry["shape"]).clone()
    return out
