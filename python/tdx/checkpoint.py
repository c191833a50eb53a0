"""Sharded checkpoints: the format model binaries save with ``--save`` and
resume from with ``--resume``, read and written from Python.

A checkpoint root holds one directory per saved step and ``LATEST``, which
names the newest committed one; each step directory holds one safetensors
file per writing rank and ``tdx.index.json`` (docs/checkpoints.md). Every
function here takes a root (its ``LATEST`` is followed) or a step directory.

    tdx.checkpoint.save(model.state_dict(), "ckpt")      # ckpt/step-00000000
    state = tdx.checkpoint.load("ckpt")                    # global tensors
    box = tdx.checkpoint.load_shard("ckpt", "fc.weight", mesh,
                                    [tdx.Shard(0), tdx.Replicate()], (1, 0))
"""

import json
import os

import torch

from . import _C
from .errors import CheckpointError

__all__ = ["save", "load", "load_shard", "verify", "latest", "step_of", "export_hf", "slice"]


def _existing(path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}")
    return path


def latest(path):
    """The committed step directory ``path`` names (a root's ``LATEST``, or
    ``path`` itself when it is a step directory)."""
    return _C.resolve_checkpoint(_existing(path))


def step_of(path):
    """The step of the checkpoint ``path`` names."""
    with open(os.path.join(latest(path), "tdx.index.json")) as f:
        return int(json.load(f)["step"])


def save(state_dict, path, *, step=None, keep=0, metadata=None):
    """Saves global tensors as checkpoint step ``step`` of the root ``path``
    (default: one past ``LATEST``'s step, 0 for a new root) and commits it
    atomically: a crash leaves the previous checkpoint, never half a new one.
    ``keep`` > 0 deletes all but the newest ``keep`` steps afterwards.
    Returns the step directory."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"save takes a dict of name to tensor (a state_dict), "
                        f"got {type(state_dict).__name__}")
    named = []
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state_dict['{name}'] is a {type(t).__name__}, not a tensor")
        named.append((str(name), t))
    path = os.fspath(path)
    if step is None:
        step = step_of(path) + 1 if os.path.isdir(path) and _C.is_checkpoint(path) else 0
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    return _save(path, int(step), named, meta, int(keep))


def _save(root, step, named, metadata, keep):
    """Commits the global tensors `named` ([(name, tensor)]) as step `step`
    (-1: the next) of `root`, written by this process alone."""
    pending = _C.begin_checkpoint(root, step)
    part = _C.write_checkpoint_file(pending, "rank-00000.safetensors",
                                    [(n, list(t.shape), [0] * t.dim(), t) for n, t in named])
    return _C.commit_checkpoint(pending, [part], metadata, keep)


def load(path, names=None):
    """The global tensors of a checkpoint (or of a safetensors file, or a
    directory of them, such as a Hugging Face export) by name; ``names``
    picks some. Each is read from the chunks that hold it, checked against
    their checksums."""
    store = _C.TensorStore(_existing(path))
    entries = store.tensors()
    for name in names or []:
        if name not in entries:
            raise CheckpointError(f"{store.path} has no tensor '{name}'; it has "
                                  f"{', '.join(sorted(entries)) or 'none'}")
    return {name: _read(store, name) for name in (entries if names is None else names)}


def _mesh_shape(mesh):
    if hasattr(mesh, "shape") and not isinstance(mesh, torch.Tensor):
        return list(mesh.shape)
    return [int(s) for s in mesh]


def _layout(placements):
    from .placements import Partial, Replicate, Shard
    for p in placements:
        if isinstance(p, Partial):
            raise CheckpointError("a checkpoint holds reduced tensors: load with Shard or "
                                  "Replicate placements, not Partial")
        if not isinstance(p, (Shard, Replicate)):
            raise TypeError(f"placements must be tdx.Shard or tdx.Replicate, got {p!r}")
    return "[" + ", ".join(str(p) for p in placements) + "]"


def _read(store, name, mesh=None, placements=None, coords=None):
    """Tensor ``name`` of an open ``_C.TensorStore``: whole without a mesh,
    else the box the device at ``coords`` holds under ``placements``."""
    shape = list(store.tensors()[name][0])
    if mesh is None:
        return store.read_box(name, [0] * len(shape), shape)
    mesh_shape = _mesh_shape(mesh)
    if len(placements) != len(mesh_shape):
        raise CheckpointError(f"{len(placements)} placements for a mesh of {len(mesh_shape)} "
                              f"axes; give one per axis")
    offset, size = _C.box_of(mesh_shape, list(coords), shape, _layout(placements))
    return store.read_box(name, offset, size)


def load_shard(path, name, mesh, placements, coords):
    """The box of tensor ``name`` that the device at ``coords`` of ``mesh``
    (a :class:`tdx.DeviceMesh` or a mesh shape) holds under ``placements``,
    one per mesh axis (uneven splits as torch.chunk makes them). Only the
    bytes of that box are read, whatever layout the checkpoint was saved in."""
    store = _C.TensorStore(_existing(path))
    if name not in store.tensors():
        raise CheckpointError(f"{store.path} has no tensor '{name}'")
    return _read(store, name, mesh, placements, coords)


def verify(path):
    """Reads every byte of a checkpoint and checks it against its index
    (sizes, checksums of files and chunks, chunks tiling each tensor);
    raises :class:`tdx.CheckpointError` naming the file, tensor and offset of
    a mismatch. Returns the number of bytes checked."""
    return _C.verify_checkpoint(_existing(path))


def export_hf(source, out_dir, *, max_shard_size="5GB", include_optimizer=False, config=None):
    """Writes a Hugging Face folder (tdx.hf.write, as ``runner.save(...,
    format="hf")`` does): ``model.safetensors``, or shards of at most
    ``max_shard_size`` each (bytes, or "300KB", "5GB"; a larger tensor
    gets a file of its own) named by ``model.safetensors.index.json``, and
    ``config.json`` from `config`. ``source`` is a checkpoint (root or step
    directory) or a state dict; optimizer state (``optimizer.*``) is left
    out unless ``include_optimizer``. Returns the index's path (the one
    file's for a single one)."""
    from . import hf
    tensors = dict(source) if isinstance(source, dict) else load(source)
    if not include_optimizer:
        tensors = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    return hf.write(os.fspath(out_dir), tensors, {}, config=config,
                    max_shard_size=hf.parse_size(max_shard_size))


def slice(tensor, num_partitions, dim=0):  # noqa: A001 (TorchShard's name)
    """The ``num_partitions`` pieces of ``tensor`` along ``dim`` that ranks
    hold under ``Shard(dim)``: torch.chunk's pieces (size ceil(n/k)), always
    exactly ``num_partitions`` of them, trailing ones short or empty."""
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise ValueError(f"num_partitions must be a positive int, got {num_partitions!r}")
    if not -tensor.dim() <= dim < tensor.dim():
        raise ValueError(f"dim {dim} is out of range for a tensor of {tensor.dim()} dims")
    dim %= tensor.dim()
    pieces = []
    for c in range(num_partitions):
        coords = [c]
        offset, size = _C.box_of([num_partitions], coords, list(tensor.shape), f"[Shard({dim})]")
        pieces.append(tensor.narrow(dim, offset[dim], size[dim]))
    return pieces
