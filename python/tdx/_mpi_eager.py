"""tdx.mpi's calls run eagerly on MPI (outside a trace): the moves
through libtdx_comm.so, each call's autograd function with its adjoint
(the table in tdx.mpi's docstring), point-to-point messages, and
mpi4torch's JoinDummies."""

import ctypes
import math

import torch

from .errors import InputError

from ._mpi_base import (
    CommunicationError, MPI_MAX, MPI_MIN, MPI_PROD, MPI_SUM, WaitHandle, _CODE_NAMES, _DTYPES,
    _HALF, _HEADER_DTYPES, _OP_NAMES, _check_op, _counts, _dtype_code, _fail, _int, _library)



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
