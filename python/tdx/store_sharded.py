"""What a torch job puts in and gets from ``tdx.store`` beside whole tensors
(TorchStore's API, without a tdx program): DTensors, each rank storing only
its own shard and fetching only its own box, and state dicts, nested, with
picklable objects beside the tensors, filled into the user's tensors in
place.

A value is stored as one version of its key: its tensors (a DTensor as the
boxes its ranks hold, each written once: the replicas at coordinate 0 of a
``Replicate`` axis write it) and its skeleton, the structure with every
tensor replaced by its name, pickled. The version commits whole, after
every rank's file is in (TorchStore commits the mapping last; here the
index is that mapping).
"""

import pickle

import torch

from . import _C
from .errors import CheckpointError

SKELETON = "tdx.skeleton"


class _Leaf:
    """A tensor's place in a skeleton: its name in the version."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"_Leaf({self.name!r})"


def _is_dtensor(t):
    from torch.distributed.tensor import DTensor
    return isinstance(t, DTensor)


def flatten(value):
    """(skeleton, [(name, tensor or DTensor)]) of a nested value."""
    leaves, taken = [], set()

    def walk(v, path):
        if isinstance(v, torch.Tensor):
            name = "/".join(str(p) for p in path) or "tensor"
            while name in taken or name == SKELETON:
                name += "'"
            taken.add(name)
            leaves.append((name, v))
            return _Leaf(name)
        if isinstance(v, dict):
            return type(v)((k, walk(x, path + (k,))) for k, x in v.items())
        if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            return type(v)(walk(x, path + (i,)) for i, x in enumerate(v))
        return v

    return walk(value, ()), leaves


def _distributed():
    import torch.distributed as dist
    return dist if dist.is_available() and dist.is_initialized() else None


def _boxes(name, t, rank):
    """The boxes (name, global shape, offset, local tensor) this process
    writes of `t`: a plain tensor whole on rank 0; a DTensor's local shard
    where this rank is the first replica of it."""
    if not _is_dtensor(t):
        return [(name, list(t.shape), [0] * t.dim(), t.detach())] if rank == 0 else []
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    if any(p.is_partial() for p in t.placements):      # reduced first: a store holds values
        t = t.redistribute(placements=[Replicate() if p.is_partial() else p
                                       for p in t.placements])
    coord = t.device_mesh.get_coordinate()
    if coord is None:
        return []
    if t.numel() == 0:
        return [(name, list(t.shape), [0] * t.dim(), t.to_local().detach())] \
            if all(c == 0 for c in coord) else []
    if any(c != 0 for c, p in zip(coord, t.placements) if isinstance(p, Replicate)):
        return []
    local = t.to_local().detach()
    if local.numel() == 0:
        return []
    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return [(name, list(t.shape), list(offset), local)]


def put(root, value, keep, kind):
    """Commits `value` as the next version of the key at `root`. With a
    DTensor in it, every rank of the default process group calls this (a
    collective); otherwise one process does. Returns the version's path."""
    skeleton, leaves = flatten(value)
    dist = _distributed() if any(_is_dtensor(t) for _, t in leaves) else None
    rank = dist.get_rank() if dist else 0
    meta = {"tdx.store": kind}

    def everyone(result, error):
        # One rank's outcome to all: none is left waiting on a failed one.
        if dist is None:
            if error:
                raise CheckpointError(error)
            return result
        box = [(result, error)]
        dist.broadcast_object_list(box, src=0)
        if box[0][1]:
            raise CheckpointError(box[0][1])
        return box[0][0]

    pending, error, data = None, None, None
    if rank == 0:
        try:
            data = pickle.dumps(skeleton)
        except Exception as e:  # noqa: BLE001 (every rank hears of it)
            error = (f"put: the value holds an object that cannot be pickled ({e}); a store "
                     f"holds tensors, DTensors and picklable objects")
        if error is None:
            try:
                pending = _C.begin_checkpoint(root, -1)
            except CheckpointError as e:
                error = str(e)
    pending = everyone(pending, error)

    part, error = "", None
    try:
        boxes = [b for name, t in leaves for b in _boxes(name, t, rank)]
        if rank == 0:
            boxes.append((SKELETON, [len(data)], [0],
                          torch.frombuffer(bytearray(data), dtype=torch.uint8)))
        if boxes:
            part = _C.write_checkpoint_file(pending, f"rank-{rank:05d}.safetensors", boxes)
    except Exception as e:  # noqa: BLE001 (every rank hears of it)
        error = f"rank {rank}: {e}"
    parts = [(part, error)]
    if dist is not None:
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (part, error))
    result, error = None, next((e for _, e in parts if e), None)
    if rank == 0 and error is None:
        try:
            result = _C.commit_checkpoint(pending, [p for p, _ in parts if p], meta, keep)
        except CheckpointError as e:
            error = str(e)
    return everyone(result, error)


class Version:
    """An open version of `key` (a ``_C.TensorStore``) with its index's
    entries, read once for every tensor taken from it."""

    def __init__(self, store, key):
        self.store, self.key = store, key
        self.entries = store.tensors()


def skeleton_of(version):
    """The unpickled structure of an open version (objects from the store
    are unpickled: read only stores you trust)."""
    data = version.store.read_box(SKELETON, [0], list(version.entries[SKELETON][0]))
    return pickle.loads(data.numpy().tobytes())


def read_like(version, name, like):
    """Tensor `name` of an open version as `like` holds it: a DTensor's own
    box (only its bytes read) on its mesh, a tensor whole."""
    store, key = version.store, version.key
    if name not in version.entries:
        raise KeyError(f"key '{key}' has no tensor '{name}'")
    shape, dtype = version.entries[name]
    if like is None:
        return store.read_box(name, [0] * len(shape), list(shape))
    if list(like.shape) != list(shape) or like.dtype != dtype:
        raise CheckpointError(f"key '{key}': tensor '{name}' is stored as {list(shape)} "
                              f"{dtype}, but the tensor to fill is {list(like.shape)} "
                              f"{like.dtype}; fill one of its shape and dtype")
    if not _is_dtensor(like):
        return store.read_box(name, [0] * len(shape), list(shape))
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    if any(p.is_partial() for p in like.placements):
        raise CheckpointError(f"get: the DTensor to fill for '{name}' is Partial; a store "
                              f"holds reduced values: give it Shard or Replicate placements")
    size, offset = compute_local_shape_and_global_offset(like.shape, like.device_mesh,
                                                         like.placements)
    local = store.read_box(name, list(offset), list(size)) if all(size) \
        else torch.empty(list(size), dtype=dtype)
    return DTensor.from_local(local, like.device_mesh, like.placements, shape=like.shape,
                              stride=like.stride())


def get(version, like):
    """The value of an open version: its structure rebuilt with its tensors;
    with `like` (a tensor or DTensor of the stored shape and dtype), the
    tensor as `like` holds it (a DTensor: only this rank's box read)."""
    skeleton = skeleton_of(version)
    if like is None:
        return build(version, skeleton)
    if not isinstance(like, torch.Tensor):
        raise TypeError(f"get: like= takes a tensor or a DTensor, got {type(like).__name__} "
                        f"(fill a state dict in place with get_state_dict)")
    if not isinstance(skeleton, _Leaf):
        raise CheckpointError(f"key '{version.key}' holds a {type(skeleton).__name__}, not a "
                              f"tensor: get it without like=, or fill it with get_state_dict")
    return read_like(version, skeleton.name, like)


def fill(version, skeleton, user):
    """`user` (a tensor, DTensor or nested structure) filled in place from
    the version: tensors copied into, objects replaced. Returns it."""
    key = version.key

    def into(s, u, path):
        where = "/".join(str(p) for p in path) or "the value"
        if isinstance(u, torch.Tensor):
            if not isinstance(s, _Leaf):
                raise CheckpointError(f"key '{key}': {where} is stored as a "
                                      f"{type(s).__name__}, not a tensor")
            got = read_like(version, s.name, u)
            with torch.no_grad():
                (u.to_local() if _is_dtensor(u) else u).copy_(
                    got.to_local() if _is_dtensor(got) else got)
            return u
        if isinstance(u, dict):
            if not isinstance(s, dict):
                raise CheckpointError(f"key '{key}': {where} is stored as a "
                                      f"{type(s).__name__}, not a dict")
            missing = [k for k in u if k not in s]
            if missing:
                raise CheckpointError(f"key '{key}' has no {missing[:5]} under {where} "
                                      f"(it has {list(s)[:5]}...)")
            for k in list(u):
                u[k] = into(s[k], u[k], path + (k,))
            return u
        if isinstance(u, list):
            if not isinstance(s, (list, tuple)) or len(s) != len(u):
                raise CheckpointError(f"key '{key}': {where} is stored as "
                                      f"{type(s).__name__}, not a list of {len(u)}")
            for i in range(len(u)):
                u[i] = into(s[i], u[i], path + (i,))
            return u
        return build(version, s)            # an object (or what replaces it) as stored

    return into(skeleton, user, ())


def build(version, skeleton):
    """The stored structure with its tensors read whole."""
    if isinstance(skeleton, _Leaf):
        return read_like(version, skeleton.name, None)
    if isinstance(skeleton, dict):
        return type(skeleton)((k, build(version, x)) for k, x in skeleton.items())
    if isinstance(skeleton, (list, tuple)) and not hasattr(skeleton, "_fields"):
        return type(skeleton)(build(version, x) for x in skeleton)
    return skeleton
