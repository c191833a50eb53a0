"""tdx.mpi's calls inside a trace: each records the ``tdx::`` collective
(python/tdx/collectives.py) that compiles to the dialect's op over the
communicator's mesh axes. One program serves every rank: ``comm.rank`` is a
value (:class:`Rank`), messages between ranks become one
``tdx::permute`` whose pairs the ranks' ``dest`` and ``source`` give, and
everything the ranks must agree on is checked here, at trace time, naming
the source lines involved."""

import operator

import torch

from . import collectives as _c
from .errors import CaptureError

_REDUCE = {0: "sum", 1: "max", 2: "min"}   # tdx.mpi's MPI_SUM, MPI_MAX, MPI_MIN
_PROD = 3


def _args(comm, site):
    rec = _c.recording()
    rec.use(*comm._mesh, site)
    return ",".join(comm._group_axes), comm.size, site


class Rank:
    """``comm.rank`` in a traced program. Python arithmetic on it (``+ - *
    // %``) stays a rank expression (each rank's value is known for the
    checks); with a tensor it becomes tensor math on ``tdx.mesh_coord``."""

    def __init__(self, comm, value=lambda r: r, tensor=lambda t: t):
        self._comm, self._value, self._tensor = comm, value, tensor

    def values(self):
        """This expression on each rank of the communicator."""
        return [self._value(r) for r in range(self._comm.size)]

    def as_tensor(self, like):
        site = _c.site()
        return self._tensor(torch.ops.tdx.rank(like, *_args(self._comm, site)))

    def _apply(self, other, fn):
        if isinstance(other, Rank):
            return Rank(self._comm, lambda r: fn(self._value(r), other._value(r)),
                        lambda t: fn(self._tensor(t), other._tensor(t)))
        if isinstance(other, torch.Tensor):
            return fn(self.as_tensor(other), other)
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return Rank(self._comm, lambda r: fn(self._value(r), other),
                        lambda t: fn(self._tensor(t), other))
        return NotImplemented

    def _swap(fn):
        return lambda a, b: fn(b, a)

    __add__ = lambda s, o: s._apply(o, operator.add)         # noqa: E731
    __radd__ = lambda s, o: s._apply(o, Rank._swap(operator.add))   # noqa: E731
    __sub__ = lambda s, o: s._apply(o, operator.sub)         # noqa: E731
    __rsub__ = lambda s, o: s._apply(o, Rank._swap(operator.sub))   # noqa: E731
    __mul__ = lambda s, o: s._apply(o, operator.mul)         # noqa: E731
    __rmul__ = lambda s, o: s._apply(o, Rank._swap(operator.mul))   # noqa: E731
    __floordiv__ = lambda s, o: s._apply(o, operator.floordiv)   # noqa: E731
    __mod__ = lambda s, o: s._apply(o, operator.mod)         # noqa: E731

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        like = next(a for a in list(args) + list((kwargs or {}).values())
                    if isinstance(a, torch.Tensor))
        args = [a.as_tensor(like) if isinstance(a, Rank) else a for a in args]
        kwargs = {k: v.as_tensor(like) if isinstance(v, Rank) else v
                  for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)

    def _refuse(self, *_):
        raise CaptureError(
            f"{_c.site()}: {self._comm.name}.rank is a value of the compiled program (each "
            f"rank's own), not a Python int, so Python cannot branch or index on it; compute "
            f"with it as a tensor (x * comm.rank, torch.where(...)), or run this part eagerly")

    __bool__ = __index__ = __int__ = __float__ = __hash__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse

    def __repr__(self):
        return f"<rank of {self._comm.name}: {self.values()}>"


def _static(value, name, call, site):
    if isinstance(value, Rank):
        raise CaptureError(f"{call} at {site}: {name} is {value!r}, a rank-dependent value; a "
                           f"compiled {call} takes one {name} for every rank")
    return int(value)


def _root(comm, root, call, site):
    root = _static(root, "root", call, site)
    if not 0 <= root < comm.size:
        raise CaptureError(f"{call} at {site}: root {root} is outside the communicator "
                           f"{comm.name} (ranks 0 ... {comm.size - 1})")
    return root


def _on_root(comm, y, root, site):
    """`y` on the root, zeros elsewhere."""
    mine = torch.ops.tdx.rank(y, *_args(comm, site)) == root
    return torch.where(mine, y, torch.zeros_like(y))


def _axis(t, axis, call, site):
    axis = _static(axis, "the axis", call, site)
    if not -t.dim() <= axis < max(t.dim(), 1):
        raise CaptureError(f"{call} at {site}: axis {axis} is outside a {t.dim()}-D tensor of "
                           f"shape {tuple(t.shape)}")
    return axis % max(t.dim(), 1)


def _share(comm, t, axis, numelem, call, site):
    numelem = _static(numelem, "numelem", call, site)
    if numelem * comm.size != t.shape[axis]:
        raise CaptureError(f"{call} at {site}: numelem {numelem} on each of {comm.size} ranks is "
                           f"{numelem * comm.size} entries, but the tensor has {t.shape[axis]} "
                           f"along axis {axis}; a compiled {call} splits evenly (uneven shares "
                           f"run eagerly)")


def Allreduce(comm, t, op):
    from ._mpi_base import _OP_NAMES
    site = _c.site()
    if op == _PROD:
        # The product of every rank's value, differentiated by torch's
        # prod (exact where values are zero).
        every = torch.ops.tdx.all_gather(t.unsqueeze(0), 0, *_args(comm, site))
        return every.prod(0)
    if op not in _REDUCE:
        raise CaptureError(f"Allreduce at {site}: a compiled program reduces with MPI_SUM, "
                           f"MPI_MAX, MPI_MIN or MPI_PROD, not {_OP_NAMES[op] if 0 <= op < len(_OP_NAMES) else op}; run the "
                           f"logical and bitwise reductions eagerly")
    return torch.ops.tdx.all_reduce(t, _REDUCE[op], *_args(comm, site))


def Bcast_(comm, t, root):
    site = _c.site()
    return torch.ops.tdx.broadcast(t, _root(comm, root, "Bcast_", site), *_args(comm, site))


def Reduce_(comm, t, op, root):
    site = _c.site()
    root = _root(comm, root, "Reduce_", site)
    return _on_root(comm, Allreduce(comm, t, op), root, site)


def Allgather(comm, t, gatheraxis):
    site = _c.site()
    axis = _axis(t, gatheraxis, "Allgather", site)
    return torch.ops.tdx.all_gather(t, axis, *_args(comm, site))


def Gather(comm, t, gatheraxis, root):
    site = _c.site()
    root = _root(comm, root, "Gather", site)
    axis = _axis(t, gatheraxis, "Gather", site)
    return _on_root(comm, torch.ops.tdx.all_gather(t, axis, *_args(comm, site)), root, site)


def Scatter(comm, t, scatteraxis, numelem, root):
    site = _c.site()
    root = _root(comm, root, "Scatter", site)
    axis = _axis(t, scatteraxis, "Scatter", site)
    _share(comm, t, axis, numelem, "Scatter", site)
    # The root's tensor, zeros elsewhere, reduce-scattered: each rank gets
    # its share of the root's (and the adjoint, an all_gather, sends every
    # share's gradient back to the root).
    return torch.ops.tdx.reduce_scatter(_on_root(comm, t, root, site), "sum", axis,
                                        *_args(comm, site))


def Alltoall(comm, t, gatheraxis, scatteraxis, numelem):
    site = _c.site()
    g = _axis(t, gatheraxis, "Alltoall", site)
    s = _axis(t, scatteraxis, "Alltoall", site)
    if g == s:
        raise CaptureError(f"Alltoall at {site}: gatheraxis and scatteraxis are both {g}")
    _share(comm, t, s, numelem, "Alltoall", site)
    return torch.ops.tdx.all_to_all(t, s, g, *_args(comm, site))


class _Message:
    def __init__(self, comm, send, tensor, peer, tag, site):
        self.comm, self.send, self.tensor, self.tag, self.site = comm, send, tensor, tag, site
        self.call = "Isend" if send else "Irecv"
        self.peers = peer.values() if isinstance(peer, Rank) else [int(peer)] * comm.size
        for r, p in enumerate(self.peers):
            if not 0 <= p < comm.size:
                what = "dest" if send else "source"
                raise CaptureError(f"{self.call} at {site}: on rank {r} the {what} is {p}, "
                                   f"outside the communicator {comm.name} (ranks 0 ... "
                                   f"{comm.size - 1})")
        if not 0 <= int(tag) <= 32767:
            raise CaptureError(f"{self.call} at {site}: tag {tag} is outside 0 ... 32767")
        self.matched = False
        self.waited = False
        self.result = None


def _post(comm, send, t, peer, tag):
    """An Isend (send) or Irecv, posted: its handle, whose ``dummy`` is for
    JoinDummies as in mpi4torch."""
    from ._mpi_base import WaitHandle
    site = _c.site()
    _args(comm, site)
    m = _Message(comm, send, t, peer, tag, site)
    rec = _c.recording()
    (rec.sends if send else rec.recvs).append(m)
    # Once a message's send and receive are both posted its permutation is
    # recorded, where it stands: the runtime starts it there and waits
    # where the received value is first read (the Wait), so the compute in
    # between overlaps the transfer.
    for r in rec.recvs:
        if not r.matched and any(not s.matched and s.tag == r.tag and s.comm is r.comm
                                 for s in rec.sends):
            _match(r, site)
    dummy = t.new_zeros(0) if t.is_floating_point() else torch.zeros(0)
    return WaitHandle(dummy, m)


def Isend(comm, t, dest, tag):
    return _post(comm, True, t, dest, tag)


def Irecv(comm, t, source, tag):
    return _post(comm, False, t, source, tag)


def _match(recv, site):
    """The Isend `recv` receives: the first unmatched one with its tag, its
    ranks' peers the converse of the receivers'."""
    rec = _c.recording()
    sends = [s for s in rec.sends if not s.matched and s.tag == recv.tag and s.comm is recv.comm]
    if not sends:
        raise CaptureError(
            f"Wait at {site} for the Irecv at {recv.site} (tag {recv.tag}): no Isend with that "
            f"tag was posted before it, so every rank would block here (a deadlock); post "
            f"the Isend before waiting for the Irecv")
    send = sends[0]
    if tuple(send.tensor.shape) != tuple(recv.tensor.shape) or send.tensor.dtype != recv.tensor.dtype:
        raise CaptureError(
            f"the Isend at {send.site} sends {tuple(send.tensor.shape)} {send.tensor.dtype}, but "
            f"the Irecv at {recv.site} (tag {recv.tag}) receives {tuple(recv.tensor.shape)} "
            f"{recv.tensor.dtype}; sender and receiver must agree on shape and dtype")
    n = send.comm.size
    targets = {}
    for r in range(n):
        d = send.peers[r]
        if d in targets:
            raise CaptureError(
                f"Isend at {send.site} (tag {send.tag}): ranks {targets[d]} and {r} both send to "
                f"rank {d}; a compiled program's messages of one tag form a permutation "
                f"(e.g. dest=(comm.rank + 1) % comm.size)")
        targets[d] = r
    for d in range(n):
        s = recv.peers[d]
        if send.peers[s] != d:
            raise CaptureError(
                f"rank {d} receives from rank {s} (Irecv at {recv.site}), but rank {s} sends to "
                f"rank {send.peers[s]} (Isend at {send.site}, tag {send.tag}); each receive's "
                f"source must be the rank whose dest it is")
    send.matched = recv.matched = True
    pairs = [p for r in range(n) for p in (r, send.peers[r])]
    axes, group, _ = _args(send.comm, send.site)
    recv.result = torch.ops.tdx.permute(send.tensor, pairs, axes, group, recv.site)


def Wait(comm, handle):
    site = _c.site()
    m = getattr(handle, "_state", None)
    if not isinstance(m, _Message):
        raise CaptureError(f"Wait at {site} takes the WaitHandle of Isend or Irecv, got "
                           f"{type(handle).__name__}")
    if m.waited:
        raise CaptureError(f"Wait at {site}: the handle of {m.call} at {m.site} was already "
                           f"waited for")
    m.waited = True
    if m.send:
        return m.tensor.view_as(m.tensor)
    if not m.matched:
        _match(m, site)
    return m.result
