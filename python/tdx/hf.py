"""Hugging Face checkpoint folders: ``model.safetensors``, or shards named by
``model.safetensors.index.json``, with the model's own state names, as
transformers' ``save_pretrained`` writes them and ``from_pretrained`` reads
them.

Read: ``exe.start(params=folder)`` (and ``exe.run``/``exe.train``) check the
folder's names and shapes against the program first (a name that is no state
of the program, a tensor of another shape or a missing parameter is named
before any rank starts), then each rank reads its shard of each tensor. A
tied name (``lm_head.weight`` beside ``transformer.wte.weight``) may be
there or not, as save_pretrained leaves it out.

Written: ``runner.save(folder, format="hf")`` (:func:`write`): the model's
state without tied aliases and non-persistent buffers, in shards of at most
``max_shard_size`` bytes with an index when it is larger, each file with
``{"format": "pt"}`` metadata, and the model's ``config.json`` when
``config=`` is given, so ``AutoModel*.from_pretrained(folder)`` loads it.
"""

import json
import os
import tempfile

from .errors import CheckpointError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def is_hf(path):
    """Whether `path` is a Hugging Face checkpoint folder."""
    return os.path.isdir(path) and (os.path.isfile(os.path.join(path, SINGLE)) or
                                    os.path.isfile(os.path.join(path, INDEX)))


def _files(path):
    """The folder's safetensors files, as its index names them."""
    index = os.path.join(path, INDEX)
    if not os.path.isfile(index):
        return [SINGLE]
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index} is not a safetensors index ({e})") from None
    files = sorted(set(weight_map.values()))
    for name in files:
        if not os.path.isfile(os.path.join(path, name)):
            raise CheckpointError(f"{index} names {name}, which is not in {path} (a shard "
                                  f"is missing: copy the whole folder)")
    return files


def headers(files):
    """Name -> (shape, file's name) of every tensor in safetensors `files`
    (paths), from their headers alone."""
    from safetensors import safe_open
    found = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for key in f.keys():
                    found[key] = (tuple(f.get_slice(key).get_shape()), os.path.basename(file))
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{file} is not a readable safetensors file ({e})") from None
    return found


def check(path, signature, tied):
    """Raises a CheckpointError naming the first tensor of HF folder `path`
    that the program (``exe.signature()``) cannot take: a name that is no
    state of it, another shape, or a parameter or persistent buffer the
    folder lacks."""
    state = {p["name"]: p for p in signature["params"]}
    found = headers([os.path.join(path, name) for name in _files(path)])
    for key, (shape, file) in sorted(found.items()):
        name = tied.get(key, key)
        if name not in state:
            raise CheckpointError(
                f"{os.path.join(path, file)}: {key} is no state of this program (its names "
                f"are the traced model's state_dict() names, e.g. "
                f"{', '.join(sorted(n for n in state if not n.startswith('optimizer.'))[:3])});"
                f" load the checkpoint into the model class it was saved from")
        if shape != tuple(state[name]["shape"]):
            raise CheckpointError(f"{os.path.join(path, file)}: {key} has shape {shape}; the "
                                  f"program's {name} is {tuple(state[name]['shape'])} (a "
                                  f"checkpoint of another config)")
    have = {tied.get(k, k) for k in found}
    from .tools import required_state
    missing = sorted(n for n in required_state(signature) if n not in have)
    if missing:
        raise CheckpointError(f"{path} has no {', '.join(missing[:3])}"
                              f"{' (and more)' if len(missing) > 3 else ''}: state of this "
                              f"program (a parameter or persistent buffer) that the checkpoint "
                              f"lacks")


def parse_size(size):
    """Bytes of `size`: a number, or text such as "300KB", "5GB", "1MiB"."""
    if size is None or isinstance(size, int):
        return size
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    text = str(size).strip().upper()
    try:
        for unit, factor in sorted(units.items(), key=lambda u: -len(u[0])):
            if text.endswith(unit):
                return int(float(text[:-len(unit)]) * factor)
        return int(text)
    except ValueError:
        raise ValueError(f"max_shard_size is bytes or text such as '5GB', got {size!r}") from None


def _size(shard):
    return sum(t.numel() * t.element_size() for t in shard.values())


def write(path, state, tied, *, config=None, max_shard_size=None):
    """Writes the model state `state` (a runner's ``state_dict()``) as a
    Hugging Face folder at `path`: tied aliases (named in `tied`, or the
    same tensor as a name before them) left out as save_pretrained leaves
    them, shards of at most `max_shard_size` bytes (default: one
    file) with ``model.safetensors.index.json``, and ``config.json`` from
    `config` (anything with ``save_pretrained(folder)`` or ``to_dict()``).
    The files are written beside their names and renamed into place, so a
    failed write leaves no partial checkpoint under them. Returns the
    index's path (the one file's for a single one)."""
    from safetensors.torch import save_file
    if os.path.isfile(os.path.join(path, SINGLE)) or os.path.isfile(os.path.join(path, INDEX)):
        raise CheckpointError(f"{path} already holds a Hugging Face checkpoint; write to a new "
                              f"folder (tdx does not overwrite a saved checkpoint)")
    max_shard_size = parse_size(max_shard_size)
    if max_shard_size is not None and max_shard_size < 1:
        raise ValueError(f"max_shard_size is a positive number of bytes, got {max_shard_size!r}")
    tensors, seen = {}, set()
    for k, v in state.items():
        # A tied alias, named or sharing the tensor of a name before it
        # (model.state_dict()'s lm_head.weight): left out, as HF leaves it.
        same = (v.data_ptr(), tuple(v.shape), v.stride(), v.dtype) if v.numel() else None
        if k in tied or (same is not None and same in seen):
            continue
        seen.add(same)
        tensors[k] = v.contiguous()
    shards, current = [], {}
    for name, t in tensors.items():
        if current and max_shard_size and _size(current) + t.numel() * t.element_size() > \
                max_shard_size:
            shards.append(current)
            current = {}
        current[name] = t
    shards.append(current)
    os.makedirs(path, exist_ok=True)
    names = [SINGLE] if len(shards) == 1 else \
        [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    files = {}
    with tempfile.TemporaryDirectory(dir=path, prefix=".tdx-hf-") as tmp:
        for name, shard in zip(names, shards):
            save_file(shard, os.path.join(tmp, name), metadata={"format": "pt"})
            files[name] = os.path.join(tmp, name)
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(_size(s) for s in shards)},
                     "weight_map": {k: n for n, s in zip(names, shards) for k in s}}
            with open(os.path.join(tmp, INDEX), "w") as f:
                json.dump(index, f, indent=2, sort_keys=True)
            files[INDEX] = os.path.join(tmp, INDEX)
        if config is not None:
            if hasattr(config, "save_pretrained"):
                config.save_pretrained(tmp)
            else:
                with open(os.path.join(tmp, "config.json"), "w") as f:
                    json.dump(config.to_dict(), f, indent=2)
            files["config.json"] = os.path.join(tmp, "config.json")
        # The index last: a reader never sees it name a shard not yet there.
        for name in sorted(files, key=lambda n: n == INDEX):
            os.replace(files[name], os.path.join(path, name))
    return os.path.join(path, INDEX if len(shards) > 1 else SINGLE)
