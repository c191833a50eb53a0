"""What tdx.mpi's eager calls and its traced ones share: the MPI_*
reductions, the element types and the communication library
(libtdx_comm.so), the deadline, the argument checks, and WaitHandle."""

import ctypes
import ctypes.util
import os

import torch

from . import collectives as _collectives
from .errors import InputError, TdxError


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


class WaitHandle:
    """What :meth:`MPI_Communicator.Isend` and ``Irecv`` return; pass it to
    ``Wait``. ``dummy`` is a tensor for the dummies of
    :func:`JoinDummies`."""

    def __init__(self, dummy, state):
        self.dummy = dummy
        self._state = state
