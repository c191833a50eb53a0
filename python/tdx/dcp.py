"""torch.distributed.checkpoint (DCP) folders: read into a program's state
(``exe.start(params=folder)``), written from a runner's
(``runner.save(folder, format="dcp")``).

Names map as torch's own writers lay them out: a model's state by its
qualified names, bare or under ``model.`` (``dcp.save(model.state_dict())``,
or ``{"model": ..., "optim": ...}`` as FSDP2 scripts and torchtitan write
it); optimizer state ``optim.state.<param>.<key>`` (``get_optimizer_state_dict``'s
layout under ``optim``, or ``optimizer``) is the program's
``optimizer.<param>.<key>``. The optimizer's ``param_groups`` are not state:
the program has its hyperparameters.
"""

import os

import torch

from .errors import CheckpointError

_MODEL = ("", "model.")
_OPTIMIZER = ("optim.state.", "optimizer.state.", "state.")
_GROUPS = ("optim.param_groups.", "optimizer.param_groups.", "param_groups.")


def is_dcp(path):
    """Whether `path` is a DCP checkpoint folder (it has DCP's ``.metadata``)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, ".metadata"))


def _torch_dtype(name):
    from . import _C
    for _ir, dtype, _runs, stored in _C.dtypes():
        if stored == name:
            return dtype
    raise CheckpointError(f"no torch dtype for the program's element type {name}")


def _program_name(key, state, tied):
    """The program's state name for DCP key `key`; None for a tied name
    (the one it shares is read); raises for a key that maps to nothing."""
    for prefix in _MODEL:
        name = key[len(prefix):] if key.startswith(prefix) else None
        if name in state:
            return name
        if name in tied:
            return None
    for prefix in _OPTIMIZER:
        if key.startswith(prefix) and f"optimizer.{key[len(prefix):]}" in state:
            return f"optimizer.{key[len(prefix):]}"
    raise CheckpointError(
        f"DCP key {key} maps to no state of this program (its state is named as "
        f"model.state_dict() names it, optionally under 'model.', and the optimizer's as "
        f"'optim.state.<param>.<key>'); rename it, or load the checkpoint into the model it "
        f"was saved from")


def read(path, signature):
    """The state of DCP folder `path` by the program's names, each tensor of
    the program's shape and element type (`signature`: ``exe.signature()``).
    Every parameter and persistent buffer must be there; optimizer state
    that is not is left to the program's init."""
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    reader = FileSystemReader(os.fspath(path))
    try:
        metadata = reader.read_metadata()
    except Exception as e:  # noqa: BLE001 (torch raises what the file system or pickle does)
        raise CheckpointError(f"{path}: DCP's .metadata cannot be read ({e}); the checkpoint "
                              f"is incomplete or not a DCP folder") from None
    from .tools import required_state
    state = {p["name"]: p for p in signature["params"]}
    tied = signature.get("tied", {})
    buffers, names = {}, {}
    for key, meta in sorted(metadata.state_dict_metadata.items()):
        if key.startswith(_GROUPS):
            continue
        if not isinstance(meta, TensorStorageMetadata):
            raise CheckpointError(f"{path}: {key} is not a tensor ({type(meta).__name__}); "
                                  f"tdx reads tensors of a model's and an optimizer's state")
        name = _program_name(key, state, tied)
        if name is None:
            continue
        want = tuple(state[name]["shape"])
        if tuple(meta.size) != want:
            raise CheckpointError(f"{path}: {key} has shape {tuple(meta.size)}; the program's "
                                  f"{name} is {want}")
        buffers[key] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        names[key] = name
    found = set(names.values())
    missing = [n for n in required_state(signature) if n not in found]
    if missing:
        raise CheckpointError(f"{path}: no tensor for {missing[0]}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                              + "; a DCP checkpoint of this model names every parameter and "
                                "persistent buffer")
    from torch.distributed.checkpoint.api import CheckpointException
    try:
        load(buffers, storage_reader=reader, no_dist=True)
    # A missing or short shard file; DCP's own exception is a BaseException.
    except (Exception, CheckpointException) as e:  # noqa: BLE001
        detail = (str(e).strip().splitlines() or [type(e).__name__])[-1]  # the cause's line
        raise CheckpointError(f"{path}: reading the DCP shards failed ({detail}); a shard file "
                              f"is missing or truncated") from None
    return {names[k]: t.to(_torch_dtype(state[names[k]]["dtype"]))
            for k, t in buffers.items()}


def write(path, state):
    """Writes `state` (a runner's ``state_dict(optimizer=True)``) as a DCP
    folder at `path`, laid out as ``{"model": model_state, "optim": {"state":
    ...}}``: ``model.<name>`` and ``optim.state.<param>.<key>``."""
    from torch.distributed.checkpoint import FileSystemWriter, save
    if os.path.exists(path) and os.listdir(path):
        raise CheckpointError(f"{path} exists and is not empty; DCP writes a new folder")
    flat = {}
    for name, t in state.items():
        if name.startswith("optimizer."):
            flat[f"optim.state.{name[len('optimizer.'):]}"] = t
        else:
            flat[f"model.{name}"] = t
    save(flat, storage_writer=FileSystemWriter(os.fspath(path)), no_dist=True)
