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
import os

import torch

from . import collectives as _collectives
from . import _mpi_traced as _traced
from .errors import InputError, TdxError

__all__ = [
    "MPI_MAX", "MPI_MIN", "MPI_SUM", "MPI_PROD", "MPI_LAND", "MPI_BAND", "MPI_LOR", "MPI_BOR",
    "MPI_LXOR", "MPI_BXOR", "MPI_MINLOC", "MPI_MAXLOC", "WaitHandle", "JoinDummies",
    "JoinDummiesHandle", "MPI_Communicator", "COMM_WORLD", "comm", "set_timeout",
    "CommunicationError", "deactivate_cuda_aware_mpi_support",
]


class CommunicationError(TdxError, RuntimeError):
    """A call of tdx.mpi did not complete: a peer that never sent or
    received, a rank lost or stuck past the deadline, or MPI's own error;
    the message names the call, its source line, the group and the peer."""


# Reductions: the codes lib/Runtime/UserComm.cpp's mpiOp takes.
MPI_SUM, MPI_MAX, MPI_MIN, MPI_PROD, MPI_LAND, MPI_BAND, MPI_LOR, MPI_BOR, MPI_LXOR, MPI_BXOR = \
    range(10)
MPI_MINLOC, MPI_MAXLOC = 10, 11
_OP_NAMES = ["MPI_SUM", "MPI_MAX", "MPI_MIN", "MPI_PROD", "MPI_LAND", "MPI_BAND", "MPI_LOR",
             "MPI_BOR", "MPI_LXOR", "MPI_BXOR", "MPI_MINLOC", "MPI_MAXLOC"]
_ARITHMETIC = (MPI_SUM, MPI_MAX, MPI_MIN, MPI_PROD)

# Element types: UserComm.cpp's mpiType codes. Half types move as 16-bit
# words and reduce in float32.
_DTYPES = {torch.float32: 0, torch.float64: 1, torch.int8: 2, torch.uint8: 3, torch.int16: 4,
           torch.int32: 5, torch.int64: 6, torch.bool: 7, torch.float16: 8, torch.bfloat16: 8}
_HALF = (torch.float16, torch.bfloat16)
# A header names a dtype by its index here.
_HEADER_DTYPES = list(_DTYPES)
_CODE_NAMES = ["float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
               "float16/bfloat16"]

_timeout = float(os.environ.get("TDX_COLLECTIVE_TIMEOUT", "300"))
_comms = []


def set_timeout(seconds):
    """The deadline of every call from now on (default 300 s, or
    ``TDX_COLLECTIVE_TIMEOUT``): a call that waits longer raises
    :class:`CommunicationError` naming the group and peer."""
    global _timeout
    if not seconds > 0:
        raise InputError(f"set_timeout: {seconds!r} is not a positive number of seconds")
    _timeout = float(seconds)
    for c in _comms:
        if c._opened:
            _library().tdx_comm_set_timeout(c._opened[0], ctypes.c_double(_timeout))


def deactivate_cuda_aware_mpi_support():
    """mpi4torch's switch; tdx.mpi moves CPU tensors, so it does nothing."""


_LIB = None


def load_mpi_globally():
    """Loads Open MPI with its symbols global, once per process: its
    components look them up (a shared object loaded locally that links it
    would leave them unresolved). tdx.runner loads programs after it."""
    ctypes.CDLL(ctypes.util.find_library("mpi") or "libmpi.so.40", mode=os.RTLD_GLOBAL)


def _library():
    global _LIB
    if _LIB is None:
        load_mpi_globally()
        lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "libtdx_comm.so"))
        p, i64, i64p = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
        s, i = ctypes.c_char_p, ctypes.c_int
        lib.tdx_comm_error.restype = s
        lib.tdx_comm_open.restype = p
        lib.tdx_comm_open.argtypes = [i64p, i, s, s, s, ctypes.c_double]
        for name in ("rank", "size"):
            getattr(lib, f"tdx_comm_{name}").argtypes = [p]
        lib.tdx_comm_bytes.argtypes = [p]
        lib.tdx_comm_bytes.restype = ctypes.c_longlong
        lib.tdx_comm_set_timeout.argtypes = [p, ctypes.c_double]
        lib.tdx_comm_allreduce.argtypes = [p, p, p, i64, i, i, s]
        lib.tdx_comm_reduce.argtypes = [p, p, p, i64, i, i, i, s]
        lib.tdx_comm_bcast.argtypes = [p, p, i64, i, i, s]
        lib.tdx_comm_gatherv.argtypes = [p, p, p, i64p, i, i, s]
        lib.tdx_comm_scatterv.argtypes = [p, p, p, i64p, i, i, s]
        lib.tdx_comm_reduce_scatterv.argtypes = [p, p, p, i64p, i, i, s]
        lib.tdx_comm_alltoallv.argtypes = [p, p, i64p, p, i64p, i, s]
        for name in ("isend", "irecv"):
            f = getattr(lib, f"tdx_comm_{name}")
            f.argtypes = [p, p, i64, i, i, i, i, i]
            f.restype = ctypes.c_longlong
        lib.tdx_comm_wait.argtypes = [ctypes.c_longlong, i, i64, i64p]
        _LIB = lib
    return _LIB


def _job_size():
    """The job's ranks: the launcher's count (mpirun, tdx.run), else 1
    without starting MPI (a process tracing a program for a larger mesh
    needs none)."""
    for key in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    if any(k in os.environ for k in ("PMIX_RANK", "PMI_RANK", "SLURM_PROCID")):
        return _library().tdx_comm_world_size()   # launched, size not said: ask MPI
    return 1


def _fail():
    raise CommunicationError(_library().tdx_comm_error().decode())


def _counts(values):
    return (ctypes.c_int64 * len(values))(*[int(v) for v in values])


_site = _collectives.site   # the user's file:line, eagerly as in a trace


def _dtype_code(t, call):
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise InputError(f"{call}: tdx.mpi does not move {t.dtype} tensors; supported: "
                         f"{', '.join(str(d) for d in _DTYPES)} (convert it first, e.g. "
                         f"a complex tensor with torch.view_as_real)")
    if t.device.type != "cpu":
        raise InputError(f"{call}: the tensor is on {t.device}; tdx.mpi moves CPU tensors "
                         f"(.cpu() it, or compile the step for CUDA)")
    return code


def _check_op(op, t, call):
    if op in (MPI_MINLOC, MPI_MAXLOC):
        raise InputError(f"{call}: {_OP_NAMES[op]} reduces (value, index) pairs, which tdx.mpi "
                         f"does not take; use MPI_MAX or MPI_MIN (their gradients go to the "
                         f"ranks holding the extreme) or Allgather the values")
    if op not in range(10):
        raise InputError(f"{call}: {op!r} is not one of tdx.mpi's MPI_* reductions")
    if op in _ARITHMETIC and t.dtype == torch.bool:
        raise InputError(f"{call}: {_OP_NAMES[op]} of a bool tensor; use MPI_LOR / MPI_LAND, "
                         f"or convert it to an integer dtype")
    if op not in _ARITHMETIC and (t.is_floating_point() or t.is_complex()):
        raise InputError(f"{call}: {_OP_NAMES[op]} takes integer or bool tensors, not {t.dtype}")


def _int(value, name, call):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise InputError(f"{call}: {name} must be an int, got a tensor of shape "
                             f"{tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or int(value) != value:
        raise InputError(f"{call}: {name} must be an int, got {value!r}")
    return int(value)


# Each collective first all-gathers one header per rank and checks them:
# [call, site, dtype, ndim, p1, p2, p3, dims 0..8 (the last folds the rest)].
_HEADER = 16
_CALLS = ["Allreduce", "Bcast_", "Reduce_", "Gather", "Allgather", "Scatter", "Alltoall",
          "reduce_scatter"]


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
                                              self.name.encode(), ctypes.c_double(_timeout))
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


def _dtype_name(index):
    return str(_HEADER_DTYPES[index]) if 0 <= index < len(_HEADER_DTYPES) else \
        "an unsupported dtype"


def _tag(tag, call):
    tag = _int(tag, "tag", call)
    if not 0 <= tag <= 32767:
        raise InputError(f"{call}: tag {tag} is outside 0 ... 32767 (MPI's guaranteed range)")
    return tag


# -- raw collectives (no autograd) ------------------------------------------

def _contiguous(t):
    return t.detach().contiguous()


def _reduce_dtype(t):
    return torch.float32 if t.dtype in _HALF else t.dtype


def _allreduce(comm, t, op, site, root=None):
    call = "Allreduce" if root is None else "Reduce_"
    _dtype_code(t, call)
    _check_op(op, t, call)
    headers = comm._agree(call, site, t, op, -1 if root is None else root)
    comm._same_tensor(call, site, headers)
    comm._mismatch(call, site, headers, "the reduction", lambda h: _OP_NAMES[h[4]])
    x = _contiguous(t).to(_reduce_dtype(t))
    out = torch.empty_like(x)
    what = f"{call} at {site}".encode()
    lib = _library()
    if root is None:
        rc = lib.tdx_comm_allreduce(comm._handle, x.data_ptr(), out.data_ptr(), x.numel(),
                                    _DTYPES[x.dtype], op, what)
    else:
        rc = lib.tdx_comm_reduce(comm._handle, x.data_ptr(), out.data_ptr(), x.numel(),
                                 _DTYPES[x.dtype], op, root, what)
        if comm._rank != root:
            out.zero_()
    if rc:
        _fail()
    return out.to(t.dtype)


def _bcast(comm, t, root, site):
    _dtype_code(t, "Bcast_")
    headers = comm._agree("Bcast_", site, t, root)
    comm._same_tensor("Bcast_", site, headers)
    comm._mismatch("Bcast_", site, headers, "the root", lambda h: h[4])
    out = _contiguous(t).clone()
    bits = _words(out)
    if _library().tdx_comm_bcast(comm._handle, bits.data_ptr(), bits.numel(),
                                 _DTYPES[t.dtype], root, f"Bcast_ at {site}".encode()):
        _fail()
    return out


def _axis(t, axis, call):
    if not -t.dim() <= axis < max(t.dim(), 1):
        raise InputError(f"{call}: axis {axis} is outside a {t.dim()}-D tensor of shape "
                         f"{tuple(t.shape)}")
    return axis % max(t.dim(), 1)


def _rows(t, axis):
    """`t` with `axis` first, dense, and the elements per entry of it."""
    x = _contiguous(t.movedim(axis, 0))
    return x, math.prod(x.shape[1:])


def _words(x):
    return x.view(torch.int16) if x.dtype in _HALF else x


def _others_agree(comm, call, site, headers, axis, what="every dim but the gather axis"):
    def rest(h):
        s = list(comm._shape_of(h))
        return tuple(s[:axis] + s[axis + 1:])
    comm._mismatch(call, site, headers, "the dtype", lambda h: _dtype_name(h[2]))
    comm._mismatch(call, site, headers, "the number of dims", lambda h: h[3])
    comm._mismatch(call, site, headers, what, rest)


def _gather(comm, t, axis, root, site):
    """Gather (root >= 0) or Allgather (root < 0) along `axis`."""
    call = "Gather" if root >= 0 else "Allgather"
    _dtype_code(t, call)
    axis = _axis(t, axis, call)
    headers = comm._agree(call, site, t, axis, root)
    _others_agree(comm, call, site, headers, axis)
    comm._mismatch(call, site, headers, "the axis", lambda h: h[4])
    sizes = [comm._shape_of(h)[axis] for h in headers]
    x, inner = _rows(t, axis)
    out = torch.zeros((sum(sizes),) + tuple(x.shape[1:]), dtype=t.dtype)
    if _library().tdx_comm_gatherv(comm._handle, _words(x).data_ptr(), _words(out).data_ptr(),
                                   _counts([s * inner for s in sizes]), _DTYPES[t.dtype], root,
                                   f"{call} at {site}".encode()):
        _fail()
    if 0 <= root != comm._rank:
        out.zero_()
    return out.movedim(0, axis), sizes


def _scatter(comm, t, axis, numelem, root, site):
    call = "Scatter"
    _dtype_code(t, call)
    if numelem < 0:
        raise InputError(f"Scatter at {site}: numelem {numelem} is negative")
    mine_root = comm._rank == root
    if mine_root:
        axis = _axis(t, axis, call)
    headers = comm._agree(call, site, t, axis, numelem, root)
    comm._mismatch(call, site, headers, "the root", lambda h: h[6])
    comm._mismatch(call, site, headers, "the axis", lambda h: h[4])
    counts = [h[5] for h in headers]
    top = headers[root]
    shape = list(comm._shape_of(top))
    if top[3] > 9:
        raise InputError(f"Scatter at {site}: the root's tensor has {top[3]} dims; tdx.mpi "
                         f"scatters at most 9")
    axis = _axis(torch.empty(shape, device="meta"), axis, call)
    if sum(counts) != shape[axis]:
        raise InputError(f"Scatter at {site}: the ranks' numelem ({counts}) add up to "
                         f"{sum(counts)}, but the root's tensor has {shape[axis]} entries along "
                         f"axis {axis} (shape {tuple(shape)})")
    dtype = _HEADER_DTYPES[top[2]]
    rest = shape[:axis] + shape[axis + 1:]
    inner = math.prod(rest)
    out = torch.empty([numelem] + rest, dtype=dtype)
    if mine_root:
        x, _ = _rows(t, axis)
        send = _words(x).data_ptr()
    else:
        send = None
    if _library().tdx_comm_scatterv(comm._handle, send, _words(out).data_ptr(),
                                    _counts([c * inner for c in counts]), _DTYPES[dtype], root,
                                    f"Scatter at {site}".encode()):
        _fail()
    return out.movedim(0, axis)


def _reduce_scatter(comm, t, axis, sizes, site):
    """The sum over ranks of `t`, rank r keeping its `sizes[r]` entries of
    `axis` (Allgather's adjoint)."""
    call = "reduce_scatter"
    headers = comm._agree(call, site, t, axis)
    comm._same_tensor(call, site, headers)
    x, inner = _rows(t, axis)
    x = x.to(_reduce_dtype(t))
    out = torch.empty((sizes[comm._rank],) + tuple(x.shape[1:]), dtype=x.dtype)
    if _library().tdx_comm_reduce_scatterv(comm._handle, x.data_ptr(), out.data_ptr(),
                                           _counts([s * inner for s in sizes]), _DTYPES[x.dtype],
                                           MPI_SUM, f"Allgather's backward at {site}".encode()):
        _fail()
    return out.to(t.dtype).movedim(0, axis)


def _alltoall(comm, t, gatheraxis, scatteraxis, numelem, site):
    call = "Alltoall"
    _dtype_code(t, call)
    gatheraxis = _axis(t, gatheraxis, call)
    scatteraxis = _axis(t, scatteraxis, call)
    if gatheraxis == scatteraxis:
        raise InputError(f"Alltoall at {site}: gatheraxis and scatteraxis are both {gatheraxis}")
    headers = comm._agree(call, site, t, gatheraxis, scatteraxis, numelem)
    comm._mismatch(call, site, headers, "the axes", lambda h: (h[4], h[5]))
    comm._mismatch(call, site, headers, "the dtype", lambda h: _dtype_name(h[2]))

    def rest(h):
        return tuple(d for i, d in enumerate(comm._shape_of(h)) if i != gatheraxis)
    comm._mismatch(call, site, headers, "every dim but the gather axis", rest)
    counts = [h[6] for h in headers]
    if sum(counts) != t.shape[scatteraxis]:
        raise InputError(f"Alltoall at {site}: the ranks' numelem ({counts}) add up to "
                         f"{sum(counts)}, but the tensor has {t.shape[scatteraxis]} entries along "
                         f"scatteraxis {scatteraxis} (shape {tuple(t.shape)})")
    gsizes = [comm._shape_of(h)[gatheraxis] for h in headers]
    x, inner = _rows(t, scatteraxis)          # rows: entries of scatteraxis
    inner_gather = math.prod(d for i, d in enumerate(t.shape) if i not in (gatheraxis, scatteraxis))
    out = torch.empty(sum(numelem * inner_gather * g for g in gsizes), dtype=t.dtype)
    recv_counts = [numelem * inner_gather * g for g in gsizes]
    if _library().tdx_comm_alltoallv(comm._handle, _words(x).data_ptr(),
                                     _counts([c * inner for c in counts]), _words(out).data_ptr(),
                                     _counts(recv_counts), _DTYPES[t.dtype],
                                     f"Alltoall at {site}".encode()):
        _fail()
    moved = list(x.shape)            # the layout of a block: scatteraxis first
    blocks, at = [], 0
    for g, n in zip(gsizes, recv_counts):
        shape = [numelem] + moved[1:]
        shape[1 + gatheraxis - (1 if gatheraxis > scatteraxis else 0)] = g
        blocks.append(out[at:at + n].view(shape).movedim(0, scatteraxis))
        at += n
    return torch.cat(blocks, dim=gatheraxis)


# -- autograd ---------------------------------------------------------------

def _extreme_grad(comm, x, y, summed, site):
    """MAX / MIN's adjoint: the summed gradient to the ranks whose value is
    the result, split evenly among ties."""
    hit = (x == y).to(summed.dtype)
    ties = _Allreduce.apply(hit, None, comm, MPI_SUM, site)
    return summed * hit / ties


def _prod_grad(comm, x, summed, site):
    """PROD's adjoint: the summed gradient times the product of the other
    ranks' values (no division: exact where a value is zero)."""
    every, _ = _gather(comm, x.unsqueeze(0), 0, -1, site + " (backward)")
    others = torch.cat([every[:comm._rank], every[comm._rank + 1:]]).prod(dim=0)
    return summed * others


def _anchor():
    """A leaf every differentiable call takes as an input: a call's result
    can need a gradient because another rank's input does (the root's of a
    Bcast_, a sender's), which this rank's own inputs cannot tell autograd."""
    return _ANCHOR if torch.is_grad_enabled() else None


_ANCHOR = torch.zeros(0, requires_grad=True)


def _start(ctx, comm):
    """Tells the call's header whether this rank's input needs a gradient."""
    comm._needs_grad = bool(ctx.needs_input_grad[0])


def _finish(ctx, comm, y):
    """`y`, differentiable where any rank's input needs a gradient: every
    rank then runs the adjoint in its backward (as its peers do)."""
    if not comm._any_grad:
        ctx.mark_non_differentiable(y)
    return y


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anchor, comm, op, site):
        _start(ctx, comm)
        y = _allreduce(comm, x, op, site)
        ctx.comm, ctx.op, ctx.site = comm, op, site
        if op in (MPI_MAX, MPI_MIN, MPI_PROD):
            ctx.save_for_backward(x, y)
        return _finish(ctx, comm, y)

    @staticmethod
    def backward(ctx, g):
        comm, op, site = ctx.comm, ctx.op, ctx.site + " (backward)"
        summed = _Allreduce.apply(g, None, comm, MPI_SUM, site)
        if op == MPI_SUM:
            return summed, None, None, None, None
        x, y = ctx.saved_tensors
        if op == MPI_PROD:
            return _prod_grad(comm, x, summed, site), None, None, None, None
        return _extreme_grad(comm, x, y, summed, site), None, None, None, None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anchor, comm, op, root, site):
        _start(ctx, comm)
        y = _allreduce(comm, x, op, site, root=root)
        ctx.comm, ctx.op, ctx.root, ctx.site = comm, op, root, site
        if op in (MPI_MAX, MPI_MIN, MPI_PROD):
            # The non-root ranks need the result for the adjoint.
            any_grad = comm._any_grad
            ctx.save_for_backward(x, _bcast(comm, y, root, site + " (kept for the backward)"))
            comm._any_grad = any_grad
        return _finish(ctx, comm, y)

    @staticmethod
    def backward(ctx, g):
        comm, op, site = ctx.comm, ctx.op, ctx.site + " (backward)"
        root_grad = _Bcast.apply(g, None, comm, ctx.root, site)
        if op == MPI_SUM:
            return root_grad, None, None, None, None, None
        x, y = ctx.saved_tensors
        if op == MPI_PROD:
            return _prod_grad(comm, x, root_grad, site), None, None, None, None, None
        return _extreme_grad(comm, x, y, root_grad, site), None, None, None, None, None


class _Bcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anchor, comm, root, site):
        _start(ctx, comm)
        ctx.comm, ctx.root, ctx.site = comm, root, site
        return _finish(ctx, comm, _bcast(comm, x, root, site))

    @staticmethod
    def backward(ctx, g):
        return _Reduce.apply(g, None, ctx.comm, MPI_SUM, ctx.root, ctx.site + " (backward)"), \
            None, None, None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anchor, comm, axis, root, site):
        _start(ctx, comm)
        ctx.comm, ctx.root, ctx.site = comm, root, site
        ctx.axis = _axis(x, axis, "Gather")
        ctx.numelem = x.shape[ctx.axis] if x.dim() else 1
        return _finish(ctx, comm, _gather(comm, x, axis, root, site)[0])

    @staticmethod
    def backward(ctx, g):
        return _Scatter.apply(g, None, ctx.comm, ctx.axis, ctx.numelem, ctx.root,
                              ctx.site + " (backward)"), None, None, None, None, None


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anchor, comm, axis, site):
        _start(ctx, comm)
        ctx.comm, ctx.site = comm, site
        ctx.axis = _axis(x, axis, "Allgather")
        y, ctx.sizes = _gather(comm, x, axis, -1, site)
        return _finish(ctx, comm, y)

    @staticmethod
    def backward(ctx, g):
        return _ReduceScatter.apply(g, None, ctx.comm, ctx.axis, ctx.sizes,
                                    ctx.site + " (backward)"), None, None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, anchor, comm, axis, sizes, site):
        _start(ctx, comm)
        ctx.comm, ctx.axis, ctx.site = comm, axis, site
        return _finish(ctx, comm, _reduce_scatter(comm, g, axis, sizes, site))

    @staticmethod
    def backward(ctx, h):
        return _Allgather.apply(h, None, ctx.comm, ctx.axis, ctx.site), None, None, None, None, None


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anchor, comm, axis, numelem, root, site):
        _start(ctx, comm)
        ctx.comm, ctx.axis, ctx.root, ctx.site = comm, axis, root, site
        ctx.input_shape, ctx.dtype = x.shape, x.dtype
        return _finish(ctx, comm, _scatter(comm, x, axis, numelem, root, site))

    @staticmethod
    def backward(ctx, g):
        full = _Gather.apply(g, None, ctx.comm, ctx.axis, ctx.root, ctx.site + " (backward)")
        if ctx.comm._rank != ctx.root:
            full = full.new_zeros(ctx.input_shape)
        return full, None, None, None, None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anchor, comm, gatheraxis, scatteraxis, numelem, site):
        _start(ctx, comm)
        ctx.comm, ctx.site = comm, site
        ctx.gatheraxis, ctx.scatteraxis = _axis(x, gatheraxis, "Alltoall"), \
            _axis(x, scatteraxis, "Alltoall")
        ctx.numelem = x.shape[ctx.gatheraxis]
        return _finish(ctx, comm, _alltoall(comm, x, gatheraxis, scatteraxis, numelem, site))

    @staticmethod
    def backward(ctx, g):
        return _Alltoall.apply(g, None, ctx.comm, ctx.scatteraxis, ctx.gatheraxis, ctx.numelem,
                               ctx.site + " (backward)"), None, None, None, None, None, None


# -- messages ---------------------------------------------------------------

class _Message:
    """One Isend or Irecv and, once autograd reaches it, its reverse."""

    def __init__(self, comm, send, peer, tag, site, tensor):
        call = "Isend" if send else "Irecv"
        self.code = _dtype_code(tensor, call)
        self.comm, self.send, self.peer, self.tag, self.site = comm, send, peer, tag, site
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype
        self.call = call
        self.buffer = None     # what the forward sends or receives into
        self.request = None
        self.waited = False
        self.reverse = None    # the backward's message: (request, buffer)
        self.result_grad = None
        self.flags = 0         # the sender's: 1 when its input needs a gradient

    def start(self, buffer, backward=False):
        lib = _library()
        start = lib.tdx_comm_isend if (self.send != backward) else lib.tdx_comm_irecv
        words = _words(buffer)
        request = start(self.comm._handle, words.data_ptr(), words.numel(), self.code, self.peer,
                        self.tag, int(backward), 0 if backward else self.flags)
        if request == 0:
            _fail()
        return request

    def wait(self, request, buffer, backward=False):
        got = (ctypes.c_int64 * 3)(-1, -1, 0)
        if _library().tdx_comm_wait(request, self.code, buffer.numel(), got):
            receiving = self.send == backward
            if receiving and got[0] >= 0:
                kind = "the gradient for " if backward else ""
                raise InputError(
                    f"{self.call} at {self.site}: {kind}the message from rank {self.peer} with "
                    f"tag {self.tag} holds {got[1]} elements of {_CODE_NAMES[got[0]]}, but this "
                    f"rank receives {buffer.numel()} of {self.dtype} (shape {self.shape}); the "
                    f"sender's and receiver's tensors must match")
            raise CommunicationError(f"{self.call} at {self.site}: "
                                     f"{_library().tdx_comm_error().decode()}")
        return got


def _dummy(like):
    return torch.zeros(0, dtype=like.dtype if like.is_floating_point() else torch.float32)


class _Isend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, state):
        ctx.state = state
        state.flags = int(ctx.needs_input_grad[0])
        state.buffer = _contiguous(x)
        state.request = state.start(state.buffer)
        dummy = _dummy(x)
        if not state.flags:
            ctx.mark_non_differentiable(dummy)
        return dummy

    @staticmethod
    def backward(ctx, _):
        s = ctx.state
        if s.reverse is None:      # the Wait's result was not in the graph
            buffer = torch.zeros(s.shape, dtype=s.dtype)
            s.reverse = (s.start(buffer, backward=True), buffer)
        request, buffer = s.reverse
        s.wait(request, buffer, backward=True)
        grad = buffer if s.result_grad is None else buffer + s.result_grad
        return grad, None


class _Irecv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, template, anchor, state):
        ctx.state = state
        state.buffer = torch.empty(state.shape, dtype=state.dtype)
        state.request = state.start(state.buffer)
        return _dummy(template)

    @staticmethod
    def backward(ctx, _):
        s = ctx.state
        if s.reverse is not None:  # the gradient sent back must arrive
            s.wait(*s.reverse, backward=True)
        return torch.zeros(s.shape, dtype=s.dtype), None, None


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dummy, state):
        if state.waited:
            raise InputError(f"Wait: the handle of {state.call} at {state.site} was already "
                             f"waited for")
        state.waited = True
        ctx.state = state
        got = state.wait(state.request, state.buffer)
        # Differentiable where the sender's input needs a gradient (the
        # receiver then sends one back).
        out = state.buffer.detach().clone() if state.send else state.buffer
        if not (state.flags if state.send else got[2]):
            ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx, g):
        s = ctx.state
        if s.send:   # the peer sends this value's gradient back
            s.result_grad = g
            buffer = torch.zeros(s.shape, dtype=s.dtype)
            s.reverse = (s.start(buffer, backward=True), buffer)
        else:        # send the gradient of what was received to its sender
            buffer = _contiguous(g).to(s.dtype)
            s.reverse = (s.start(buffer, backward=True), buffer)
        return _dummy(torch.empty(0, dtype=s.dtype)), None


class WaitHandle:
    """What :meth:`MPI_Communicator.Isend` and ``Irecv`` return; pass it to
    ``Wait``. ``dummy`` is a tensor for the dummies of
    :func:`JoinDummies`."""

    def __init__(self, dummy, state):
        self.dummy = dummy
        self._state = state


class _JoinDummies(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loopthrough, *dummies):
        ctx.shapes = [(d.shape, d.dtype) for d in dummies]
        return loopthrough.view_as(loopthrough)

    @staticmethod
    def backward(ctx, g):
        return (g,) + tuple(torch.zeros(s, dtype=d) for s, d in ctx.shapes)


def JoinDummies(loopthrough, dummies):
    """``loopthrough`` unchanged, with ``dummies`` as dependencies autograd
    sees: the backward runs their graphs (each gets a zero gradient) before
    it goes on from here. mpi4torch's way to order communication."""
    dummies = [d.dummy if isinstance(d, WaitHandle) else d for d in dummies]
    if not any(d.requires_grad for d in dummies):
        return loopthrough
    return _JoinDummies.apply(loopthrough, *dummies)


def JoinDummiesHandle(handle, dummies):
    """:func:`JoinDummies` for a :class:`WaitHandle`."""
    return WaitHandle(JoinDummies(handle.dummy, dummies), handle._state)


# -- communicators ----------------------------------------------------------

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
