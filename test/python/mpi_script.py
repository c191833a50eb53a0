"""tdx.mpi's cases, run by test_mpi.py under ``python3 -m tdx.run -n N``:
every rank runs every case in order and prints one JSON line per case,
{"case", "rank", "ok", "detail"}. A case that fails on one rank still lets
the others go on (each case ends in collectives every rank makes)."""

import json
import sys
import traceback

import torch

import tdx
import tdx.mpi as mpi4torch

comm = mpi4torch.COMM_WORLD
rank, size = comm.rank, comm.size
torch.manual_seed(1000 + rank)
CASES = []


def case(f):
    CASES.append(f)
    return f


def ones(t):
    return torch.ones_like(t)


# -- mpi4torch's own tests' closed forms -------------------------------------

@case
def allreduce_grad_is_size():
    x = torch.rand(10, dtype=torch.double).requires_grad_()
    comm.Allreduce(x, mpi4torch.MPI_SUM).sum().backward()
    assert (x.grad == size).all(), x.grad


@case
def reduce_grad_is_one():
    x = torch.rand(10, dtype=torch.double).requires_grad_()
    y = comm.Reduce_(x, mpi4torch.MPI_SUM, 0)
    if rank != 0:
        assert (y == 0).all()
    y.sum().backward()
    assert (x.grad == 1).all(), x.grad


@case
def bcast_grad_size_on_root():
    x = torch.rand(10, dtype=torch.double).requires_grad_()
    y = comm.Bcast_(x, 0)
    y.sum().backward()
    assert (x.grad == (size if rank == 0 else 0)).all(), x.grad


@case
def gather_and_allgather():
    numdim = 4
    t = torch.rand([2, 5, numdim, 2, 3], dtype=torch.double)
    t[0, 0, :, 0, 0] = rank
    g = comm.Gather(t, 2, 0)
    if rank == 0:
        assert g[0, 0, :, 0, 0].sum() == numdim * (size - 1) * size // 2
    a = comm.Allgather(t, 2)
    assert a[0, 0, :, 0, 0].sum() == numdim * (size - 1) * size // 2
    x = t.clone().requires_grad_()
    comm.Gather(x, 2, 0).sum().backward()
    assert (x.grad == 1).all()
    x = t.clone().requires_grad_()
    comm.Allgather(x, 2).sum().backward()
    assert (x.grad == size).all()


@case
def scatter_and_round_trips():
    if rank == 0:
        t = torch.rand([2, 5, size, 2, 3], dtype=torch.double)
        for i in range(size):
            t[0, 0, i, 0, 0] = i
    else:
        t = torch.rand([1], dtype=torch.double)
    s = comm.Scatter(t, 2, 1, 0)
    assert (s[0, 0, :, 0, 0] == rank).all()
    back = comm.Gather(s, 2, 0)
    if rank == 0:
        assert (back == t).all()
    x = t.clone().requires_grad_()
    comm.Scatter(x, 2, 1, 0).sum().backward()
    assert (x.grad == (1 if rank == 0 else 0)).all()


@case
def alltoall_equivalences():
    t = torch.rand([3, 4, 1, 4, size, 2], dtype=torch.double)
    assert (comm.Scatter(comm.Gather(t, 2, 0), 4, 1, 0) == comm.Alltoall(t, 2, 4, 1)).all()
    t = torch.rand([3, 4, 2, 4, 3 * size, 2], dtype=torch.double)
    assert (comm.Alltoall(comm.Alltoall(t, 2, 4, 3), 4, 2, 2) == t).all()
    x = torch.rand([3, 4, 2, 4, size, 2], dtype=torch.double).requires_grad_()
    comm.Alltoall(x, 2, 4, 1).sum().backward()
    assert (x.grad == 1).all()


@case
def nonblocking_ring_10m_doubles():
    tmp = torch.rand(10_000_000, dtype=torch.double).requires_grad_()
    req = comm.Isend(tmp, (rank + 1) % size, 0)
    req2 = comm.Irecv(mpi4torch.JoinDummies(torch.empty_like(tmp), [req.dummy]),
                      (rank + size - 1) % size, 0)
    res = comm.Wait(mpi4torch.JoinDummiesHandle(req, [req2.dummy]))
    res2 = comm.Wait(mpi4torch.JoinDummiesHandle(req2, [res]))
    (res2 * rank).sum().backward()
    assert (tmp.grad == (rank + 1) % size).all(), tmp.grad[:4]


# -- gradients of the distributed function against finite differences --------

def distributed_gradcheck(f, x, eps=1e-6):
    """Checks f's backward as one function of every rank's input: with a
    random gradient w_r on every rank, L = sum_r <w_r, f(x)_r>; rank j's
    x.grad must be dL/dx_j by central differences, perturbing one element of
    one rank at a time (every rank steps in lockstep). torch's own gradcheck
    perturbs only a rank's local input and would miss the other ranks'
    terms. Returns the largest error."""
    x = x.detach().clone()
    w = torch.randn_like(f(x.clone()))
    xr = x.clone().requires_grad_()
    (f(xr) * w).sum().backward()
    analytic = xr.grad if xr.grad is not None else torch.zeros_like(x)

    def loss(v):
        local = (f(v) * w).sum().reshape(1)
        return comm.Allreduce(local, mpi4torch.MPI_SUM).item()

    count = comm.Allreduce(torch.tensor([x.numel()]), mpi4torch.MPI_MAX).item()
    numeric = torch.zeros_like(x).reshape(-1)
    for j in range(size):
        for i in range(count):
            mine = rank == j and i < x.numel()
            sides = []
            for sign in (1, -1):
                v = x.clone().reshape(-1)
                if mine:
                    v[i] += sign * eps
                sides.append(loss(v.reshape(x.shape)))
            if mine:
                numeric[i] = (sides[0] - sides[1]) / (2 * eps)
    error = (analytic.reshape(-1) - numeric).abs().max().item() if x.numel() else 0.0
    assert error < 1e-6, (error, analytic, numeric)
    return error


def rand(*shape):
    return torch.randn(*shape, dtype=torch.double)


@case
def gradcheck_every_call():
    uneven = rank + 1            # rank r holds r+1 rows: uneven on every size
    checks = {
        "Allreduce SUM": (lambda v: comm.Allreduce(v, mpi4torch.MPI_SUM), rand(3, 2)),
        "Allreduce MAX": (lambda v: comm.Allreduce(v, mpi4torch.MPI_MAX), rand(3, 2)),
        "Allreduce MIN": (lambda v: comm.Allreduce(v, mpi4torch.MPI_MIN), rand(3, 2)),
        "Allreduce PROD": (lambda v: comm.Allreduce(v, mpi4torch.MPI_PROD), rand(3, 2)),
        "Reduce_ SUM": (lambda v: comm.Reduce_(v, mpi4torch.MPI_SUM, size - 1), rand(3, 2)),
        "Reduce_ MAX": (lambda v: comm.Reduce_(v, mpi4torch.MPI_MAX, 0), rand(3, 2)),
        "Reduce_ PROD": (lambda v: comm.Reduce_(v, mpi4torch.MPI_PROD, 0), rand(3, 2)),
        "Bcast_": (lambda v: comm.Bcast_(v, size - 1), rand(2, 3)),
        "Gather": (lambda v: comm.Gather(v, 1, size - 1), rand(2, uneven)),
        "Allgather": (lambda v: comm.Allgather(v, 0), rand(uneven, 2)),
        "Scatter": (lambda v: comm.Scatter(v, 1, uneven, 0),
                    rand(2, size * (size + 1) // 2) if rank == 0 else rand(1)),
        "Alltoall": (lambda v: comm.Alltoall(v, 0, 1, uneven),
                     rand(uneven, size * (size + 1) // 2)),
        "Isend/Irecv/Wait": (ring, rand(4)),
        "Send/Recv": (send_recv, rand(3)),
    }
    errors = {}
    for name, (f, x) in checks.items():
        errors[name] = distributed_gradcheck(f, x)
    return errors


def ring(v):
    """Each rank's value to the next rank, squared there."""
    req = comm.Isend(v, (rank + 1) % size, 5)
    got = comm.Wait(comm.Irecv(mpi4torch.JoinDummies(torch.empty_like(v), [req.dummy]),
                               (rank - 1) % size, 5))
    sent = comm.Wait(mpi4torch.JoinDummiesHandle(req, [got]))
    return got * got + sent


def send_recv(v):
    """Rank 0 sends to the last rank, which sends 3x back (the rest pass)."""
    last = size - 1
    if rank == 0:
        out = comm.Send(v, last, 1)
        return out + comm.Recv(torch.empty_like(v), last, 2)
    if rank == last:
        got = comm.Recv(torch.empty_like(v), 0, 1)
        sent = comm.Send(3 * got, 0, 2)
        # The send's result joins the output: autograd then runs its
        # backward, which receives rank 0's gradient (mpi4torch's rule).
        return mpi4torch.JoinDummies(got.sin(), [sent])
    return v * 2


@case
def prod_with_a_zero_and_max_ties():
    # PROD: rank 0 holds a zero; d/dx_0 is the others' product, not 0/0.
    x = torch.full((2,), 0.0 if rank == 0 else 2.0, dtype=torch.double).requires_grad_()
    comm.Allreduce(x, mpi4torch.MPI_PROD).sum().backward()
    expected = 2.0 ** (size - 1) * size if rank == 0 else 0.0
    assert torch.equal(x.grad, torch.full((2,), expected, dtype=torch.double)), x.grad
    # MAX: every rank holds the maximum; the summed gradient splits evenly.
    x = torch.full((3,), 5.0, dtype=torch.double).requires_grad_()
    comm.Allreduce(x, mpi4torch.MPI_MAX).sum().backward()
    assert torch.allclose(x.grad, torch.ones(3, dtype=torch.double)), x.grad


@case
def integer_and_bool_reductions():
    v = torch.tensor([rank + 1, 1 << rank, rank % 2], dtype=torch.int64)
    assert comm.Allreduce(v, mpi4torch.MPI_SUM).tolist()[0] == size * (size + 1) // 2
    assert comm.Allreduce(v, mpi4torch.MPI_BOR)[1].item() == (1 << size) - 1
    assert comm.Allreduce(v, mpi4torch.MPI_MAX)[0].item() == size
    b = torch.tensor([rank == 0, True])
    assert comm.Allreduce(b, mpi4torch.MPI_LAND).tolist() == [size == 1, True]
    assert comm.Allreduce(b, mpi4torch.MPI_LOR).tolist() == [True, True]
    h = torch.full((4,), float(rank), dtype=torch.bfloat16)
    assert comm.Allreduce(h, mpi4torch.MPI_SUM).dtype == torch.bfloat16
    assert comm.Bcast_(h, size - 1).tolist() == [float(size - 1)] * 4


@case
def mesh_axis_communicators():
    if size != 4:
        return "needs 4 ranks"
    mesh = tdx.DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
    dp, tp = mpi4torch.comm(mesh, "dp"), mpi4torch.comm(mesh, "tp")
    assert (dp.rank, tp.rank, dp.size) == (rank // 2, rank % 2, 2)
    got = dp.Allreduce(torch.tensor([float(rank)]), mpi4torch.MPI_SUM).item()
    assert got == (rank % 2) * 2 + 2, got       # ranks {0,2} or {1,3}
    got = tp.Allgather(torch.tensor([rank]), 0).tolist()
    assert got == [rank - rank % 2, rank - rank % 2 + 1], got


# -- bad input ----------------------------------------------------------------

def raises(kind, fragments, f):
    try:
        f()
    except kind as e:
        text = str(e)
        for frag in fragments:
            assert frag in text, (frag, text)
        return text
    raise AssertionError(f"no {kind.__name__}")


@case
def bad_input_is_a_typed_error():
    out = {}
    out["root"] = raises(tdx.InputError, ["root", str(size), "outside"],
                         lambda: comm.Bcast_(torch.ones(2), size))
    out["dtype"] = raises(tdx.InputError, ["complex64", "view_as_real"],
                          lambda: comm.Allreduce(torch.ones(2, dtype=torch.complex64),
                                                 mpi4torch.MPI_SUM))
    out["minloc"] = raises(tdx.InputError, ["MPI_MAXLOC"],
                           lambda: comm.Allreduce(torch.ones(2), mpi4torch.MPI_MAXLOC))
    out["bitwise float"] = raises(tdx.InputError, ["MPI_BAND", "integer or bool"],
                                  lambda: comm.Allreduce(torch.ones(2), mpi4torch.MPI_BAND))
    # Every rank sees every rank's header: the same error everywhere.
    out["numelem"] = raises(tdx.InputError, ["numelem", "add up to"],
                            lambda: comm.Scatter(torch.ones(size + 1, 2), 0, 1, 0))
    out["shapes"] = raises(tdx.InputError, ["disagree on the shape", "rank 0: (2,)",
                                            "mpi_script.py:"],
                           lambda: comm.Allreduce(torch.ones(2 + (rank > 0)), mpi4torch.MPI_SUM))
    return out


@case
def collectives_out_of_order_name_both_lines():
    if size < 2:
        return "needs 2 ranks"
    if rank == 0:
        f = lambda: comm.Allreduce(torch.ones(2), mpi4torch.MPI_SUM)   # noqa: E731
    else:
        f = lambda: comm.Bcast_(torch.ones(2), 0)   # noqa: E731
    return raises(tdx.InputError, ["reached different calls", "rank 0: Allreduce at mpi_script.py:",
                                   "rank 1: Bcast_ at mpi_script.py:"], f)


@case
def messages_that_do_not_fit_or_never_come():
    if size < 2:
        return "needs 2 ranks"
    out = {}
    # The receiver expects 3 floats; 4 come.
    if rank == 0:
        comm.Send(torch.ones(4), 1, 11)
    elif rank == 1:
        out["size"] = raises(tdx.InputError, ["holds 4 elements of float32", "receives 3",
                                              "rank 0"],
                             lambda: comm.Recv(torch.empty(3), 0, 11))
    # A send nobody receives: its wait times out naming the peer and tag.
    mpi4torch.set_timeout(2)
    if rank == 0:
        out["unreceived"] = raises(mpi4torch.CommunicationError,
                                   ["Isend to rank 1 of communicator COMM_WORLD with tag 32001",
                                    "never received", "mpi_script.py:"],
                                   lambda: comm.Send(torch.ones(100), 1, 32001))
    if rank == 1:
        out["never sent"] = raises(mpi4torch.CommunicationError,
                                   ["Irecv from rank 0", "tag 32002", "never sent"],
                                   lambda: comm.Recv(torch.empty(2), 0, 32002))
    mpi4torch.set_timeout(300)
    comm.Allreduce(torch.ones(1), mpi4torch.MPI_SUM)   # every rank past the waits
    return out


def main():
    only = sys.argv[1:]
    for f in CASES:
        if only and f.__name__ not in only:
            continue
        try:
            detail = f()
            ok = True
        except Exception:
            detail, ok = traceback.format_exc(), False
        print(json.dumps({"case": f.__name__, "rank": rank, "ok": ok, "detail": detail}),
              flush=True)


main()
