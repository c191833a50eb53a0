"""mpi4torch's API, under mpi4torch's names, on tdx's runtime.

An mpi4torch script runs by changing its import::

    import tdx.mpi as mpi4torch
    comm = mpi4torch.COMM_WORLD
    loss = comm.Allreduce(local_loss, mpi4torch.MPI_SUM)
    loss.backward()                      # the adjoint collectives run too

in an SPMD job (``python3 -m tdx.run -n 4 script.py``, or ``mpirun``). Each
call runs on the job's MPI through the runtime model binaries use (its
groups over mesh axes, its deadline: a call that waits past
:func:`set_timeout`'s seconds raises :class:`CommunicationError` naming the
group, the peer and the source line, never hangs), under autograd, with
these adjoints:

====================  =====================================================
forward               backward
====================  =====================================================
Allreduce SUM         Allreduce SUM of the gradient
Allreduce MAX / MIN   the summed gradient to the ranks holding the extreme
                      value, split evenly among ties
Allreduce PROD        summed gradient times the product of the other ranks'
                      values (exact where values are zero)
Bcast_ (root)         Reduce_ SUM to the root (0 elsewhere)
Reduce_ (root)        Bcast_ of the root's gradient (then as Allreduce)
Gather (root)         Scatter from the root of this rank's slice
Scatter (root)        Gather to the root (0 for the other ranks' inputs)
Allgather             reduce-scatter: rank j gets the sum of every rank's
                      gradient slice j
Alltoall              Alltoall with the gather and scatter axes swapped
Isend / Irecv / Wait  reversed: the receiver sends the gradient back
====================  =====================================================

Logical and bitwise reductions take integer or bool tensors, which carry no
gradient. Every collective first checks that each rank of the group called
the same thing (the call, its source line, dtype, shapes, root, counts): a
mismatch raises the same :class:`tdx.InputError` on every rank, naming the
ranks and their source lines, instead of a hang or a wrong answer. Messages
carry their dtype and size: a receive that does not fit raises on the
receiver. Sends complete only once received, so a send nobody receives
times out naming its peer and tag.

Beyond mpi4torch: :func:`comm` makes a communicator over axes of a
:class:`tdx.DeviceMesh` (``tdx.mpi.comm(mesh, "dp")``), and uneven sizes
(Gatherv / Scatterv style) work in every call that gathers or scatters.
"""

import ctypes
import ctypes.util
import math

import torch

from . import collectives as _collectives
from . import _mpi_base as _base
from . import _mpi_traced as _traced
from ._mpi_base import (
    CommunicationError, MPI_BAND, MPI_BOR, MPI_BXOR, MPI_LAND, MPI_LOR, MPI_LXOR, MPI_MAX,
    MPI_MAXLOC, MPI_MIN, MPI_MINLOC, MPI_PROD, MPI_SUM, WaitHandle, _CALLS, _DTYPES, _HEADER,
    _HEADER_DTYPES, _comms, _counts, _fail, _int, _job_size, _library, _site,
    deactivate_cuda_aware_mpi_support, set_timeout)
from ._mpi_eager import (
    JoinDummies, JoinDummiesHandle, _Allgather, _Allreduce, _Alltoall, _Bcast, _Gather, _Irecv,
    _Isend, _Message, _Reduce, _Scatter, _Wait, _anchor, _dtype_name, _tag)
from .errors import InputError

__all__ = [
    "MPI_MAX", "MPI_MIN", "MPI_SUM", "MPI_PROD", "MPI_LAND", "MPI_BAND", "MPI_LOR", "MPI_BOR",
    "MPI_LXOR", "MPI_BXOR", "MPI_MINLOC", "MPI_MAXLOC", "WaitHandle", "JoinDummies",
    "JoinDummiesHandle", "MPI_Communicator", "COMM_WORLD", "comm", "set_timeout",
    "CommunicationError", "deactivate_cuda_aware_mpi_support",
]


class MPI_Communicator:
    """A group of ranks: :data:`COMM_WORLD`, or one axis (or several) of a
    mesh from :func:`comm`. ``rank`` is this process's index in the group,
    ``size`` the group's size. Methods are mpi4torch's."""

    def __init__(self, mesh_shape, mesh_axes, group_axes, name, mesh_name="mesh"):
        self.name = name
        self._mesh = (mesh_name, tuple(mesh_shape), tuple(mesh_axes))
        self._group_axes = tuple(group_axes)
        self._size = math.prod(mesh_shape[mesh_axes.index(a)] for a in group_axes)
        self._needs_grad = self._any_grad = False
        self._opened = None
        # Opening is collective (every rank splits the world in one order),
        # so a mesh of the job's size opens now. A mesh of another size
        # (tracing a program for 8 ranks in one process) only records.
        if math.prod(mesh_shape) == _job_size():
            self._open()
        _comms.append(self)

    def _open(self):
        if self._opened is None:
            _, mesh_shape, mesh_axes = self._mesh
            handle = _library().tdx_comm_open(_counts(mesh_shape), len(mesh_shape),
                                              ",".join(mesh_axes).encode(),
                                              ",".join(self._group_axes).encode(),
                                              self.name.encode(), ctypes.c_double(_base._timeout))
            if not handle:
                _fail()
            self._opened = (handle, _library().tdx_comm_rank(handle))
        return self._opened

    @property
    def _handle(self):
        if self._opened is None:
            raise InputError(
                f"{self.name} is over a mesh of {math.prod(self._mesh[1])} ranks, but this job has "
                f"{_job_size()}: it runs inside a program tdx traces "
                f"(tdx.trace / tdx.trace_train_step) and compiles; eagerly, run the script "
                f"on as many ranks as the mesh has (python3 -m tdx.run -n N)")
        return self._opened[0]

    @property
    def _rank(self):
        self._handle
        return self._opened[1]

    @property
    def rank(self):
        """This process's rank in the communicator, 0 ... size-1. Inside a
        trace it is a value of the compiled program (each rank's own):
        arithmetic on it, ``dest``/``source`` of messages and tensor math
        with it compile; a Python branch on it does not."""
        if _collectives.recording() is not None:
            return _traced.Rank(self)
        return self._rank

    @property
    def size(self):
        """The number of processes in the communicator."""
        return self._size

    @property
    def bytes_sent(self):
        """Bytes this rank has sent through this communicator (payloads of
        collectives and messages, headers not counted)."""
        return int(_library().tdx_comm_bytes(self._handle))

    def __repr__(self):
        rank = self._opened[1] if self._opened else "?"
        return f"MPI_Communicator({self.name}: rank {rank} of {self.size})"

    # -- checks ------------------------------------------------------------

    def _rank_arg(self, value, name, call):
        value = _int(value, name, call)
        if not 0 <= value < self.size:
            raise InputError(f"{call}: {name} {value} is outside the communicator {self.name} "
                             f"(ranks 0 ... {self.size - 1})")
        return value

    def _agree(self, call, site, t, p1=0, p2=0, p3=0):
        """Every rank's header; raises the same InputError on every rank
        when they did not all make this call (naming each rank's line)."""
        dims = list(t.shape)
        if len(dims) > 9:
            folded = 1
            for d in dims[8:]:
                folded *= d
            dims = dims[:8] + [folded]
        dtype = _HEADER_DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1
        needs_grad, self._needs_grad = self._needs_grad, False
        mine = [_CALLS.index(call), int(needs_grad), dtype, t.dim(), p1, p2, p3] + dims + [-1] * (9 - len(dims))
        out = torch.empty(self.size * _HEADER, dtype=torch.int64)
        send = torch.tensor(mine, dtype=torch.int64)
        what = f"{call} at {site} (its check that every rank made the same call)".encode()
        if _library().tdx_comm_gatherv(self._handle, send.data_ptr(), out.data_ptr(),
                                       _counts([_HEADER] * self.size), 6, -1, what):
            _fail()
        headers = out.view(self.size, _HEADER).tolist()
        self._any_grad = any(h[1] for h in headers)
        if any(h[0] != mine[0] for h in headers):
            sites = self._sites(site, call)
            where = ", ".join(f"rank {r}: {_CALLS[h[0]]} at {sites[r]}"
                              for r, h in enumerate(headers))
            raise InputError(f"{call} at {site}: the ranks of {self.name} reached different "
                             f"calls ({where}); every rank of a communicator must make its "
                             f"collectives in one order")
        return headers

    def _sites(self, site, call):
        width = 160
        mine = site.encode()[:width].ljust(width, b"\0")
        send = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        out = torch.empty(self.size * width, dtype=torch.uint8)
        if _library().tdx_comm_gatherv(self._handle, send.data_ptr(), out.data_ptr(),
                                       _counts([width] * self.size), 3, -1,
                                       f"{call} at {site} (naming the ranks' lines)".encode()):
            _fail()
        raw = bytes(out.tolist())
        return [raw[r * width:(r + 1) * width].rstrip(b"\0").decode(errors="replace")
                for r in range(self.size)]

    def _mismatch(self, call, site, headers, what, describe):
        """Raises naming each rank's `describe(header)` if they differ."""
        seen = [describe(h) for h in headers]
        if any(s != seen[0] for s in seen):
            sites = self._sites(site, call)
            where = ", ".join(f"rank {r}: {s} at {sites[r]}" for r, s in enumerate(seen))
            raise InputError(f"{call} at {site}: the ranks of {self.name} disagree on {what} "
                             f"({where})")

    @staticmethod
    def _shape_of(h):
        return tuple(h[7:7 + min(h[3], 9)])

    def _same_tensor(self, call, site, headers):
        self._mismatch(call, site, headers, "the dtype", lambda h: _dtype_name(h[2]))
        self._mismatch(call, site, headers, "the shape", self._shape_of)

    # -- mpi4torch's calls -------------------------------------------------

    def Allreduce(self, tensor, op):
        """Combines every rank's ``tensor`` elementwise with ``op``; every
        rank gets the result."""
        if _collectives.recording() is not None:
            return _traced.Allreduce(self, tensor, op)
        return _Allreduce.apply(tensor, _anchor(), self, op, _site())

    def Bcast_(self, tensor, root):
        """The root's ``tensor`` on every rank (same shape everywhere)."""
        if _collectives.recording() is not None:
            return _traced.Bcast_(self, tensor, root)
        return _Bcast.apply(tensor, _anchor(), self, self._rank_arg(root, "root", "Bcast_"), _site())

    def Reduce_(self, tensor, op, root):
        """Combines every rank's ``tensor`` with ``op`` on the root; the
        other ranks get zeros of its shape."""
        if _collectives.recording() is not None:
            return _traced.Reduce_(self, tensor, op, root)
        return _Reduce.apply(tensor, _anchor(), self, op, self._rank_arg(root, "root", "Reduce_"), _site())

    def Gather(self, tensor, gatheraxis, root):
        """Every rank's ``tensor`` concatenated along ``gatheraxis`` in rank
        order, on the root (sizes along it may differ); zeros of that shape
        elsewhere."""
        if _collectives.recording() is not None:
            return _traced.Gather(self, tensor, gatheraxis, root)
        return _Gather.apply(tensor, _anchor(), self, _int(gatheraxis, "gatheraxis", "Gather"),
                             self._rank_arg(root, "root", "Gather"), _site())

    def Allgather(self, tensor, gatheraxis):
        """Every rank's ``tensor`` concatenated along ``gatheraxis`` in rank
        order, on every rank (sizes along it may differ)."""
        if _collectives.recording() is not None:
            return _traced.Allgather(self, tensor, gatheraxis)
        return _Allgather.apply(tensor, _anchor(), self, _int(gatheraxis, "gatheraxis", "Allgather"),
                                _site())

    def Scatter(self, tensor, scatteraxis, numelem, root):
        """This rank's ``numelem`` entries along ``scatteraxis`` of the
        root's ``tensor`` (in rank order; the numelems must add up to the
        root's size along it). Other ranks' ``tensor`` is not read."""
        if _collectives.recording() is not None:
            return _traced.Scatter(self, tensor, scatteraxis, numelem, root)
        return _Scatter.apply(tensor, _anchor(), self, _int(scatteraxis, "scatteraxis", "Scatter"),
                              _int(numelem, "numelem", "Scatter"),
                              self._rank_arg(root, "root", "Scatter"), _site())

    def Alltoall(self, tensor, gatheraxis, scatteraxis, numelem):
        """Rank j gets, from every rank k in order and concatenated along
        ``gatheraxis``, k's slice of ``scatteraxis`` that belongs to j (j's
        ``numelem`` entries, in rank order)."""
        if _collectives.recording() is not None:
            return _traced.Alltoall(self, tensor, gatheraxis, scatteraxis, numelem)
        return _Alltoall.apply(tensor, _anchor(), self, _int(gatheraxis, "gatheraxis", "Alltoall"),
                               _int(scatteraxis, "scatteraxis", "Alltoall"),
                               _int(numelem, "numelem", "Alltoall"), _site())

    def Isend(self, tensor, dest, tag):
        """Starts sending ``tensor`` to ``dest``; :meth:`Wait` on the handle
        returns the tensor once the peer received it."""
        if _collectives.recording() is not None:
            return _traced.Isend(self, tensor, dest, tag)
        call = "Isend"
        state = _Message(self, True, self._rank_arg(dest, "dest", call), _tag(tag, call),
                         _site(), tensor)
        return WaitHandle(_Isend.apply(tensor, state), state)

    def Irecv(self, tensor, source, tag):
        """Starts receiving a tensor of ``tensor``'s shape and dtype from
        ``source``; :meth:`Wait` on the handle returns it. ``tensor`` is a
        template (and an autograd dependency), never written."""
        if _collectives.recording() is not None:
            return _traced.Irecv(self, tensor, source, tag)
        call = "Irecv"
        state = _Message(self, False, self._rank_arg(source, "source", call), _tag(tag, call),
                         _site(), tensor)
        return WaitHandle(_Irecv.apply(tensor, _anchor(), state), state)

    def Wait(self, waithandle):
        """Completes a handle of :meth:`Isend` or :meth:`Irecv`."""
        if _collectives.recording() is not None:
            return _traced.Wait(self, waithandle)
        if not isinstance(waithandle, WaitHandle):
            raise InputError(f"Wait takes the WaitHandle of Isend or Irecv, got "
                             f"{type(waithandle).__name__}")
        return _Wait.apply(waithandle.dummy, waithandle._state)

    def Send(self, tensor, dest, tag):
        """Isend and Wait."""
        return self.Wait(self.Isend(tensor, dest, tag))

    def Recv(self, tensor, source, tag):
        """Irecv and Wait."""
        return self.Wait(self.Irecv(tensor, source, tag))


_WORLD = None


def comm(mesh, axis):
    """The communicator over ``axis`` (a name, or a tuple of names) of a
    :class:`tdx.DeviceMesh` (or torch's DeviceMesh, with mesh_dim_names):
    the ranks that differ from this one only there, ``rank`` its coordinate.
    Every rank makes it, in one order with its other communicators."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    ranks = getattr(mesh, "mesh", None)   # torch's DeviceMesh holds its ranks
    shape = tuple(ranks.shape) if isinstance(ranks, torch.Tensor) else tuple(mesh.shape)
    if not names:
        raise InputError("tdx.mpi.comm: the mesh has no axis names; give mesh_dim_names")
    axes = (axis,) if isinstance(axis, str) else tuple(axis)
    for a in axes:
        if a not in names:
            raise InputError(f"tdx.mpi.comm: the mesh has no axis {a!r} (its axes: {names})")
    return MPI_Communicator(shape, names, axes, ",".join(axes), getattr(mesh, "name", "mesh"))


def __getattr__(name):
    global _WORLD
    if name == "COMM_WORLD":
        if _WORLD is None:
            size = _library().tdx_comm_world_size()
            if size <= 0:
                _fail()
            _WORLD = MPI_Communicator((size,), ("world",), ("world",), "COMM_WORLD", "world")
        return _WORLD
    raise AttributeError(f"module 'tdx.mpi' has no attribute {name!r}")
