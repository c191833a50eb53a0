"""A tensor store: hands weights from one job to another job with another
layout (TorchStore's job), on a path you choose (``/dev/shm`` on one
machine, a shared file system across machines), or over the network with
no shared file system: ``ucx://h1:7070,h2:7070`` names the store's volumes,
one store process per host (``tdx-volume``, :func:`start_volume`), each
holding what its host's ranks put; readers fetch the bytes of the boxes
they ask for straight from the volumes that hold them (docs/checkpoints.md,
"The tensor store over the network").

Each key is a checkpoint root (tdx.checkpoint's format) whose steps are the
key's versions. A new version is committed atomically, so a reader sees a
whole version, old or new, never a mix; a reader keeps the files of the
version it opened even if a writer deletes that version meanwhile. Readers
read only the bytes of the boxes they ask for, straight into the result.

    store = tdx.store.Store("/dev/shm/weights")     # or "ucx://h1:7070,h2:7070"
    store.put("policy", model.state_dict())              # version 0, 1, ...
    box = store.get("policy", "fc.weight", mesh=(4,), placements=[tdx.Shard(0)],
                    coords=(2,))

Model binaries publish with ``--store PATH --publish KEY`` and read with
``--params store:KEY`` (docs/checkpoints.md).
"""

import os
import shutil
import subprocess
import uuid

import torch

from . import _C
from . import store_sharded
from .checkpoint import _read, _save
from .errors import CheckpointError

__all__ = ["Store", "StaleVersion", "Volume", "start_volume", "initialize", "put", "get",
           "put_state_dict", "get_state_dict", "aput", "aget", "keys", "exists", "delete"]

_TENSOR = "tensor"


class StaleVersion(CheckpointError):
    """A version of a networked store's key was dropped by its writer while
    it was being read (it keeps the newest ``keep``). ``get`` of the newest
    version starts again by itself; one asked for by number raises this."""


_C._set_stale_version_type(StaleVersion)


class Volume:
    """A volume (``tdx-volume``) this process started on its own host."""

    def __init__(self, process, address, log):
        self.process = process
        self.address = address
        self._log = log

    def __repr__(self):
        return f"tdx.store.Volume({self.address!r}, pid={self.process.pid})"

    def log(self):
        """What the volume wrote to its standard error so far: its warnings
        and the requests it refused, with the reason."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def stop(self):
        """Ends the volume; what it held is gone."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_volume(port=7070, *, host=None, bind=None, token=None, timeout=30):
    """Starts a volume of a networked store on this host, listening on
    ``port`` (0 picks a free one) of every address, or of ``bind`` only,
    and returns it once it serves; its address is ``host:port`` (``host``:
    ``bind`` or this host's name by default). ``token`` is the job's token
    the volume demands of every request (the token, or the absolute path of
    a file holding it; default this process's ``TDX_STORE_TOKEN``): this
    job's processes send theirs from ``TDX_STORE_TOKEN``. On a cluster, run
    ``tdx-volume --port PORT`` on every host instead."""
    import tempfile

    from .tools import _tool

    env = dict(os.environ)
    if token is not None:
        env["TDX_STORE_TOKEN"] = str(token)
    cmd = [_tool("tdx-volume"), "--port", str(int(port))]
    if bind is not None:
        cmd += ["--bind", str(bind)]
    # The volume's stderr goes to a file: a pipe nobody reads would stop it
    # once full.
    log = tempfile.TemporaryFile(mode="w+", prefix="tdx-volume-")
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    line = process.stdout.readline()
    if not line.startswith("tdx-volume: serving on "):
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.seek(0)
        raise CheckpointError(f"tdx-volume did not start: {(line + log.read()).strip()}")
    served = line.split()[3]
    name, _, bound = served.rpartition(":")
    return Volume(process, f"{host or name}:{bound}", log)


class Store:
    """The tensor store at ``path``: a directory (made on the first put), or
    ``ucx://HOST:PORT[,HOST:PORT...]``, the volumes of a networked store
    (the first holds the keys' indexes; a writer puts its shards on its own
    host's volume). A networked store has one writer per key at a time."""

    def __init__(self, path):
        if isinstance(path, (list, tuple)):
            path = "ucx://" + ",".join(getattr(v, "address", v) for v in path)
        self.path = os.fspath(path)
        self.networked = _C.is_volume_path(self.path)

    def __repr__(self):
        return f"tdx.store.Store({self.path!r})"

    def _root(self, key):
        return _C.store_key_path(self.path, key)

    def put(self, key, value, *, keep=2):
        """Commits ``value`` as the next version of ``key``; afterwards all
        but the newest ``keep`` versions are deleted (0 keeps all). Returns
        the version.

        ``value``: a tensor, a dict of name to tensor (a state dict), or
        any nesting of dicts, lists and tuples of tensors, DTensors and
        picklable objects. A DTensor is stored as the boxes its ranks hold,
        each rank writing only its own shard (the first replica of a
        replicated one): with a DTensor in ``value``, every rank of the
        default process group calls ``put`` (TorchStore's
        ``put(key, dtensor)``)."""
        if isinstance(value, torch.Tensor) and not store_sharded._is_dtensor(value):
            named, kind = [(_TENSOR, value)], "tensor"
        elif isinstance(value, dict) and all(
                isinstance(t, torch.Tensor) and not store_sharded._is_dtensor(t)
                for t in value.values()):
            named, kind = list(value.items()), "dict"
        else:
            return _version_of(store_sharded.put(self._root(key), value, int(keep), "value"))
        return _version_of(_save(self._root(key), -1, [(str(n), t) for n, t in named],
                                 {"tdx.store": kind}, int(keep)))

    def put_state_dict(self, state_dict, key, *, keep=2):
        """TorchStore's ``put_state_dict(state_dict, key)``: ``put`` of a
        (nested) state dict, a model's or an optimizer's, DTensors stored
        shard by shard and objects (``param_groups``) beside the tensors;
        committed whole. Returns the version."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"put_state_dict takes a dict, got {type(state_dict).__name__}")
        return _version_of(store_sharded.put(self._root(key), state_dict, int(keep), "value"))

    def get_state_dict(self, key, user_state_dict=None, *, version=None):
        """TorchStore's ``get_state_dict(key, user_state_dict)``: the newest
        version of ``key`` (or ``version``) read into ``user_state_dict`` in
        place (each tensor copied into, each DTensor's own box only, objects
        replaced) and returned; without it, the state dict stored, its
        tensors whole. A key the user's dict has and the store lacks, or a
        tensor of another shape or dtype, is an error naming it."""
        def read(opened):
            if user_state_dict is None:
                return store_sharded.build(opened, self._skeleton(opened))
            return store_sharded.fill(opened, self._skeleton(opened), user_state_dict)
        return self._newest(key, version, read)

    async def aput(self, key, value, *, keep=2):
        """``put`` for asyncio code: runs in a worker thread."""
        import asyncio
        return await asyncio.to_thread(self.put, key, value, keep=keep)

    async def aget(self, key, name=None, *, like=None, version=None):
        """``get`` for asyncio code: runs in a worker thread."""
        import asyncio
        return await asyncio.to_thread(self.get, key, name, like=like, version=version)

    async def aput_state_dict(self, state_dict, key, *, keep=2):
        import asyncio
        return await asyncio.to_thread(self.put_state_dict, state_dict, key, keep=keep)

    async def aget_state_dict(self, key, user_state_dict=None, *, version=None):
        import asyncio
        return await asyncio.to_thread(self.get_state_dict, key, user_state_dict,
                                       version=version)

    @staticmethod
    def _skeleton(opened):
        kind = opened.store.metadata.get("tdx.store")
        if kind != "value":
            # A tensor or a flat dict put whole: its skeleton is its names.
            return store_sharded._Leaf(_TENSOR) if kind == "tensor" else \
                {n: store_sharded._Leaf(n) for n in opened.entries}
        return store_sharded.skeleton_of(opened)

    def _newest(self, key, version, read):
        """``read(version)`` of the open `version` of `key` (the newest by
        default), opened again at the newest when its writer dropped it
        meanwhile."""
        for attempt in range(8):
            try:
                return read(store_sharded.Version(self._open(key, version), key))
            except StaleVersion:
                if version is not None or attempt == 7:
                    raise

    def _open(self, key, version):
        root = self._root(key)
        if not self.exists(key):
            raise KeyError(f"the store {self.path} has no key '{key}'")
        if version is None:
            return _C.TensorStore(root)
        path = f"{root}/step-{int(version):08d}"
        if not (int(version) in self.versions(key) if self.networked else os.path.isdir(path)):
            raise KeyError(f"key '{key}' has no version {version}; it has {self.versions(key)}")
        return _C.TensorStore(path)

    def get(self, key, name=None, *, like=None, mesh=None, placements=None, coords=None,
            version=None):
        """The newest version of ``key`` (or ``version``): what was put (a
        tensor, a dict, a nested value with its objects), or the tensor
        ``name`` of a dict. With ``like`` (a tensor or DTensor of the stored
        shape and dtype; TorchStore's ``get(key, like=dtensor)``), the
        tensor laid out as ``like``: a DTensor's own box only is read, on
        its mesh. With ``mesh``, ``placements`` (a list, one per mesh axis,
        or a dict of name to such a list) and ``coords``, the box the
        device at ``coords`` holds under that layout instead of the global
        tensor. All tensors come from one version: on a networked store, a
        version dropped by its writer while it is read is read again at the
        newest."""
        return self._newest(key, version, lambda opened: self._get(
            opened, name, like, mesh, placements, coords))

    def _get(self, opened, name, like, mesh, placements, coords):
        store, key, entries = opened.store, opened.key, opened.entries
        kind = store.metadata.get("tdx.store")
        if like is not None or kind == "value":
            if name is not None or mesh is not None:
                raise CheckpointError("get: like= (or a value put whole) takes neither a name "
                                      "nor mesh, placements and coords")
            if kind == "value":
                return store_sharded.get(opened, like)
            skeleton = self._skeleton(opened)
            if not isinstance(skeleton, store_sharded._Leaf):
                raise CheckpointError(f"key '{key}' holds a dict of tensors: get one with "
                                      f"get(key, name), or fill them with get_state_dict")
            return store_sharded.read_like(opened, skeleton.name, like)
        single = kind == "tensor"
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

    def tensors(self, key, *, version=None):
        """What the newest version of ``key`` (or ``version``) holds: name to
        (global shape, dtype), read from its index alone."""
        store = self._open(key, version)
        return {n: (torch.Size(shape), dtype) for n, (shape, dtype) in store.tensors().items()
                if n != store_sharded.SKELETON}

    def keys(self):
        """The keys with a committed version, sorted."""
        if self.networked:
            return _C.volume_keys(self.path)
        if not os.path.isdir(self.path):
            return []
        return sorted(k for k in os.listdir(self.path)
                      if not k.startswith(".") and _C.is_checkpoint(os.path.join(self.path, k)))

    def exists(self, key):
        if self.networked:
            return bool(self.versions(key))
        root = self._root(key)
        return os.path.isdir(root) and _C.is_checkpoint(root)

    def versions(self, key):
        """The committed versions of ``key``, oldest first."""
        root = self._root(key)
        if self.networked:
            return _C.volume_versions(self.path, key)
        if not os.path.isdir(root):
            return []
        return sorted(int(d[5:]) for d in os.listdir(root)
                      if d.startswith("step-") and os.path.exists(os.path.join(root, d,
                                                                               "tdx.index.json")))

    def delete(self, key):
        """Deletes every version of ``key``: it disappears at once (renamed
        out of sight), then its files go."""
        root = self._root(key)
        if self.networked:
            if not self.exists(key):
                raise KeyError(f"the store {self.path} has no key '{key}'")
            _C.volume_delete(self.path, key)
            return
        if not os.path.isdir(root):
            raise KeyError(f"the store {self.path} has no key '{key}'")
        hidden = os.path.join(self.path, f".{key}.deleted-{uuid.uuid4().hex}")
        os.rename(root, hidden)
        shutil.rmtree(hidden)

    def status(self):
        """A networked store's volumes: ``{"h1:7070": {"host": "h1", "keys":
        1, "files": 2, "bytes": ..., "committed": 2}, ...}``."""
        import json

        if not self.networked:
            raise CheckpointError(f"{self.path} is a directory store; status() is for "
                                  f"networked stores (ucx://...)")
        return {a: json.loads(r) for a, r in _C.volume_status(self.path).items()}


def _version_of(step):
    """The version number of a committed step directory (".../step-00000003")."""
    return int(os.path.basename(step)[5:])


# TorchStore's module-level API over one store this process chose.
_default = None


def initialize(path):
    """Chooses the store the module-level functions use (a directory, or
    ``ucx://HOST:PORT,...``; a list of volumes too) and returns it:
    ``tdx.store.initialize("ucx://h1:7070"); tdx.store.put("w", dtensor)``."""
    global _default
    _default = path if isinstance(path, Store) else Store(path)
    return _default


def _store():
    if _default is None:
        raise CheckpointError("tdx.store: no store chosen: call tdx.store.initialize(path) "
                              "first, or use tdx.store.Store(path)")
    return _default


def put(key, value, *, keep=2):
    """:meth:`Store.put` on the store :func:`initialize` chose."""
    return _store().put(key, value, keep=keep)


def get(key, name=None, *, like=None, version=None):
    """:meth:`Store.get` on the store :func:`initialize` chose."""
    return _store().get(key, name, like=like, version=version)


def put_state_dict(state_dict, key, *, keep=2):
    """:meth:`Store.put_state_dict` on the store :func:`initialize` chose."""
    return _store().put_state_dict(state_dict, key, keep=keep)


def get_state_dict(key, user_state_dict=None, *, version=None):
    """:meth:`Store.get_state_dict` on the store :func:`initialize` chose."""
    return _store().get_state_dict(key, user_state_dict, version=version)


async def aput(key, value, *, keep=2):
    return await _store().aput(key, value, keep=keep)


async def aget(key, name=None, *, like=None, version=None):
    return await _store().aget(key, name, like=like, version=version)


def keys():
    return _store().keys()


def exists(key):
    return _store().exists(key)


def delete(key):
    return _store().delete(key)
