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
from .checkpoint import _read
from .errors import CheckpointError

__all__ = ["Store", "StaleVersion", "Volume", "start_volume"]

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

    from .compile import _tool

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
        path = f"{root}/step-{int(version):08d}"
        if not (int(version) in self.versions(key) if self.networked else os.path.isdir(path)):
            raise KeyError(f"key '{key}' has no version {version}; it has {self.versions(key)}")
        return _C.TensorStore(path)

    def get(self, key, name=None, *, mesh=None, placements=None, coords=None, version=None):
        """The newest version of ``key`` (or ``version``): what was put (a
        tensor, or a dict), or the tensor ``name`` of a dict. With ``mesh``,
        ``placements`` (a list, one per mesh axis, or a dict of name to such
        a list) and ``coords``, the box the device at ``coords`` holds under
        that layout instead of the global tensor. All tensors come from one
        version: on a networked store, a version dropped by its writer while
        it is read is read again at the newest."""
        for attempt in range(8):
            try:
                return self._get(key, name, mesh, placements, coords, version)
            except StaleVersion:
                if version is not None or attempt == 7:
                    raise

    def _get(self, key, name, mesh, placements, coords, version):
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

    def tensors(self, key, *, version=None):
        """What the newest version of ``key`` (or ``version``) holds: name to
        (global shape, dtype), read from its index alone."""
        store = self._open(key, version)
        return {n: (torch.Size(shape), dtype) for n, (shape, dtype) in store.tensors().items()}

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
