"""Reading and writing safetensors files (the format model binaries use for
inputs, outputs and parameters) with the runtime's own reader and writer,
without the `safetensors` package."""

import os

from . import _C


def save(tensors, path):
    """Writes a dict of name to tensor (float32/64, float16, bfloat16,
    int64/32 or bool) to ``path``, atomically (a temporary file renamed)."""
    _C.write_safetensors(os.fspath(path), [(str(k), v) for k, v in tensors.items()])


def load(path):
    """Reads a safetensors file (or a directory of them, or a checkpoint)
    into a dict of name to tensor."""
    from .checkpoint import load as load_all
    return load_all(path)
