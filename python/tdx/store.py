"""A tensor store: hands weights from one job to another job with another
layout (TorchStore's job), on a path you choose (``/dev/shm`` on one
machine, a shared file system across machines).

Each key is a checkpoint root (tdx.checkpoint's format) whose steps are the
key's versions. A new version is committed atomically, so a reader sees a
whole version, old or new, never a mix; a reader keeps the files of the
version it opened even if a writer deletes that version meanwhile. Readers
read only the bytes of the boxes they ask for, straight into the result.

    store = tdx.store.Store("/dev/shm/weights")
    store.put("policy", model.state_dict())              # version 0, 1, ...
    box = store.get("policy", "fc.weight", mesh=(4,), placements=[tdx.Shard(0)],
                    coords=(2,))

Model binaries publish with ``--store PATH --publish KEY`` and read with
``--params store:KEY`` (docs/checkpoints.md).
"""

import os
import shutil
import uuid

import torch

from . import _C
from .checkpoint import _read
from .errors import CheckpointError

__all__ = ["Store"]

_TENSOR = "tensor"


class Store:
    """The tensor store at ``path`` (a directory; made on the first put)."""

    def __init__(self, path):
        self.path = os.fspath(path)

    def __repr__(self):
        return f"tdx.store.Store({self.path!r})"

    def _root(self, key):
        return _C.store_key_path(self.path, key)

    def put(self, key, value, *, keep=2):
        """Commits ``value`` (a tensor, or a dict of name to tensor: a state
        dict) as the next version of ``key``; afterwards all but the newest
        ``keep`` versions are deleted (0 keeps all). Returns the version."""
        if isinstance(value, torch.Tensor):
            named, kind = [(_TENSOR, value)], "tensor"
        elif isinstance(value, dict):
            named, kind = list(value.items()), "dict"
            for name, t in named:
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"put: value['{name}'] is a {type(t).__name__}, not a tensor")
        else:
            raise TypeError(f"put takes a tensor or a dict of tensors, got {type(value).__name__}")
        step = _C.save_checkpoint(self._root(key), -1, [(str(n), t) for n, t in named],
                                  {"tdx.store": kind}, int(keep))
        return int(os.path.basename(step)[5:])

    def _open(self, key, version):
        root = self._root(key)
        if not self.exists(key):
            raise KeyError(f"the store {self.path} has no key '{key}'")
        if version is None:
            return _C.TensorStore(root)
        path = os.path.join(root, f"step-{int(version):08d}")
        if not os.path.isdir(path):
            raise KeyError(f"key '{key}' has no version {version}; it has {self.versions(key)}")
        return _C.TensorStore(path)

    def get(self, key, name=None, *, mesh=None, placements=None, coords=None, version=None):
        """The newest version of ``key`` (or ``version``): what was put (a
        tensor, or a dict), or the tensor ``name`` of a dict. With ``mesh``,
        ``placements`` (a list, one per mesh axis, or a dict of name to such
        a list) and ``coords``, the box the device at ``coords`` holds under
        that layout instead of the global tensor. All tensors come from one
        version."""
        store = self._open(key, version)
        entries = store.tensors()
        single = store.metadata.get("tdx.store") == "tensor"
        names = [_TENSOR] if single else list(entries) if name is None else [name]
        for n in names:
            if n not in entries:
                raise KeyError(f"key '{key}' has no tensor '{n}'; it has {', '.join(entries)}")
        if (mesh is None) != (placements is None) or (mesh is None) != (coords is None):
            raise CheckpointError("get: give mesh, placements and coords together (a local "
                                  "box), or none of them (global tensors)")
        out = {n: _read(store, n, mesh, placements[n] if isinstance(placements, dict)
                        else placements, coords) for n in names}
        return out[names[0]] if single or name is not None else out

    def keys(self):
        """The keys with a committed version, sorted."""
        if not os.path.isdir(self.path):
            return []
        return sorted(k for k in os.listdir(self.path)
                      if not k.startswith(".") and _C.is_checkpoint(os.path.join(self.path, k)))

    def exists(self, key):
        root = self._root(key)
        return os.path.isdir(root) and _C.is_checkpoint(root)

    def versions(self, key):
        """The committed versions of ``key``, oldest first."""
        root = self._root(key)
        if not os.path.isdir(root):
            return []
        return sorted(int(d[5:]) for d in os.listdir(root)
                      if d.startswith("step-") and os.path.exists(os.path.join(root, d,
                                                                               "tdx.index.json")))

    def delete(self, key):
        """Deletes every version of ``key``: it disappears at once (renamed
        out of sight), then its files go."""
        root = self._root(key)
        if not os.path.isdir(root):
            raise KeyError(f"the store {self.path} has no key '{key}'")
        hidden = os.path.join(self.path, f".{key}.deleted-{uuid.uuid4().hex}")
        os.rename(root, hidden)
        shutil.rmtree(hidden)
