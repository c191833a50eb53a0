"""Meshes and DTensor-style placements: ``DeviceMesh``,
``init_device_mesh``, ``Shard``, ``Replicate``, ``Partial``; what the
sharding passes, the plans and the checkpoints all name (docs/sharding.md)."""

import torch

__all__ = ["DeviceMesh", "init_device_mesh", "Shard", "Replicate", "Partial"]


class DeviceMesh:
    """An N-D mesh of devices, like torch.distributed.DeviceMesh.

    ``mesh`` holds the ranks; tdx lays ranks out row-major, so it must be
    ``arange(n).reshape(shape)``. ``mesh_dim_names`` name the axes (default
    ``dim0``, ``dim1``, ...)."""

    def __init__(self, device_type, mesh, mesh_dim_names=None, *, name="mesh"):
        ranks = torch.as_tensor(mesh, dtype=torch.long) if not isinstance(mesh, torch.Tensor) \
            else mesh.to(torch.long)
        if ranks.dim() == 0 or ranks.numel() == 0:
            raise ValueError("a DeviceMesh needs at least one device")
        expected = torch.arange(ranks.numel()).reshape(ranks.shape)
        if not torch.equal(ranks, expected):
            raise ValueError(f"tdx meshes lay ranks out row-major: the mesh must be "
                             f"{expected.tolist()}, got {ranks.tolist()}")
        self.device_type = device_type
        self.shape = tuple(ranks.shape)
        names = tuple(mesh_dim_names) if mesh_dim_names is not None else \
            tuple(f"dim{i}" for i in range(len(self.shape)))
        if len(names) != len(self.shape):
            raise ValueError(f"mesh_dim_names has {len(names)} names for a {len(self.shape)}-D mesh")
        if len(set(names)) != len(names):
            raise ValueError(f"mesh_dim_names must be unique, got {names}")
        self.mesh_dim_names = names
        self.name = name

    @property
    def ndim(self):
        return len(self.shape)

    def size(self, dim=None):
        if dim is None:
            n = 1
            for s in self.shape:
                n *= s
            return n
        return self.shape[dim]

    def axis(self, name):
        if name not in self.mesh_dim_names:
            raise ValueError(f"mesh has no axis {name!r}; its axes are {self.mesh_dim_names}")
        return self.mesh_dim_names.index(name)

    def get_local_rank(self, mesh_dim=None):
        """This rank's coordinate on ``mesh_dim`` (a name or an index; the
        only axis of a 1-D mesh by default), as torch's
        ``DeviceMesh.get_local_rank``. Inside a program tdx traces (a manual
        region's body, a step calling tdx.mpi) it is a 0-D int64 tensor of
        the compiled program, each rank's own (``tdx.mesh_coord``): compute
        with it (masks, offsets), Python cannot branch on it."""
        from . import collectives as _c
        if mesh_dim is None:
            if self.ndim != 1:
                raise ValueError(f"get_local_rank of a {self.ndim}-D mesh needs the mesh_dim "
                                 f"(one of {self.mesh_dim_names})")
            mesh_dim = 0
        axis = self.mesh_dim_names[mesh_dim] if isinstance(mesh_dim, int) else mesh_dim
        size = self.shape[self.axis(axis)]
        rec = _c.recording()
        if rec is None:
            raise RuntimeError("tdx.DeviceMesh.get_local_rank is a value of a program tdx "
                               "traces (call it inside tdx.trace / tdx.trace_train_step, e.g. "
                               "in a tdx.local_map region); in an eager job use tdx.mpi's "
                               "comm(mesh, axis).rank")
        site = _c.site()
        rec.use(self.name, self.shape, self.mesh_dim_names, site)
        return torch.ops.tdx.rank(torch.zeros(()), axis, size, site)

    def __repr__(self):
        return f"DeviceMesh({self.device_type!r}, shape={self.shape}, mesh_dim_names={self.mesh_dim_names})"


def init_device_mesh(device_type, mesh_shape, mesh_dim_names=None):
    """A DeviceMesh of ``mesh_shape`` over ranks 0..n-1 in row-major order."""
    n = 1
    for s in mesh_shape:
        n *= s
    return DeviceMesh(device_type, torch.arange(n).reshape(tuple(mesh_shape)), mesh_dim_names)


class Shard:
    def __init__(self, dim):
        if not isinstance(dim, int) or dim < 0:
            raise ValueError(f"Shard dim must be a non-negative int, got {dim!r}")
        self.dim = dim

    def __str__(self):
        return f"Shard({self.dim})"

    __repr__ = __str__

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim


class Replicate:
    def __str__(self):
        return "Replicate"

    def __repr__(self):
        return "Replicate()"

    def __eq__(self, other):
        return isinstance(other, Replicate)


class Partial:
    def __init__(self, reduce_op="sum"):
        if reduce_op not in ("sum", "avg", "max", "min"):
            raise ValueError(f"Partial reduce_op must be sum, avg, max or min, got {reduce_op!r}")
        self.reduce_op = reduce_op

    def __str__(self):
        return f"Partial({self.reduce_op})"

    __repr__ = __str__

    def __eq__(self, other):
        return isinstance(other, Partial) and other.reduce_op == self.reduce_op
