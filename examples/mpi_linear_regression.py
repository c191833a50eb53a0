"""A least-squares fit written with mpi4torch's calls, run on tdx.mpi: each
rank holds an uneven share of the points, the loss is summed with
Allreduce, and LBFGS steps the parameters from autograd's gradient (the
Allreduce's adjoint sums every rank's part). Written as an mpi4torch script
would be; only the import names tdx.

    python3 -m tdx.run -n 3 examples/mpi_linear_regression.py

prints the fitted coefficients of y = c2 x^2 + c1 x + c0 (the data's are
0.1, 1.0, -2.0) and the loss, as JSON, on rank 0.
"""

import json

import torch

import tdx.mpi as mpi4torch

comm = mpi4torch.COMM_WORLD
torch.manual_seed(42)

# Every rank draws the same points and keeps its contiguous share; the
# first `extra` ranks take one more (uneven whenever size does not divide).
points = 10000
share, extra = divmod(points, comm.size)
start = comm.rank * share + min(comm.rank, extra)
stop = start + share + (comm.rank < extra)
x = 2.0 * torch.rand(points, dtype=torch.double)[start:stop]


def quadratic(inp, c):
    return (c[2] * inp + c[1]) * inp + c[0]


truth = torch.tensor([0.1, 1.0, -2.0], dtype=torch.double)
y = quadratic(x, truth)


def loss_of(c):
    # Every rank starts from the mean of the ranks' coefficients.
    c = comm.Allreduce(c, mpi4torch.MPI_SUM) / comm.size
    local = torch.sum(torch.square(y - quadratic(x, c)))
    return comm.Allreduce(local, mpi4torch.MPI_SUM)


coefficients = torch.arange(3, dtype=torch.double).requires_grad_()
optimizer = torch.optim.LBFGS([coefficients], lr=1)


def closure():
    optimizer.zero_grad()
    loss = loss_of(coefficients)
    loss.backward()
    return loss


optimizer.step(closure)
final = loss_of(coefficients.detach()).item()
if comm.rank == 0:
    print(json.dumps({"coefficients": coefficients.detach().tolist(), "loss": final,
                      "ranks": comm.size, "bytes_sent": comm.bytes_sent}))
