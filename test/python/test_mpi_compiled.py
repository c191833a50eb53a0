"""tdx.mpi's calls and torch's functional collectives compiled: traced into
one program for every rank (the collectives the dialect's, over the
communicator's mesh axis), compiled, and run from the user's SPMD loop on
2, 3 and 4 ranks, against the same calls run eagerly in the same job (tdx.mpi
eagerly; torch's on gloo). Trace-time checks of the messages the ranks
exchange name both source lines."""

import json
import os
import socket

import pytest
import torch

import tdx
from test_spmd import rerun_on_gloo_abort, tdx_run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "mpi_compiled_script.py")
FUNCOL = os.path.join(HERE, "funcol_script.py")
CASES = ["allreduce_sum", "allreduce_max", "allreduce_min", "allreduce_prod", "bcast", "reduce",
         "gather", "allgather", "scatter", "alltoall", "ring"]


def spmd(nprocs, script, *args, timeout=600):
    done, _ = tdx_run("-n", str(nprocs), script, *args, timeout=timeout,
                      env={"TDX_COLLECTIVE_TIMEOUT": "120"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


@pytest.fixture(scope="module", params=[2, 3, 4])
def job(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("mpi") / "out.json"
    spmd(request.param, SCRIPT, ",".join(CASES + ["closed", "linreg"]), str(out))
    with open(out) as f:
        return request.param, json.load(f)


@pytest.mark.parametrize("name", CASES)
def test_compiled_call_has_eagers_loss_and_gradient_on_every_rank(job, name):
    n, results = job
    r = results[name]
    compiled, eager = r["loss"]
    assert abs(compiled - eager) <= 1e-10 * max(1.0, abs(eager)), r
    # float64: the compiled adjoint sums in another order than tdx.mpi's.
    assert r["grad_error"] <= 1e-10 * max(1.0, r["grad_scale"]), r
    assert r["grad_scale"] > 0, r


def test_mpi4torch_closed_forms_compiled(job):
    n, results = job
    got = results["closed"]
    assert got["allreduce_sum"] == [float(n)] * n            # Allreduce: grad == size
    assert got["bcast"] == [0.0] * (n - 1) + [float(n)]      # n on the root (n - 1), 0 elsewhere
    assert got["ring"] == [float((r + 1) % n) for r in range(n)]


def test_mpi4torch_ring_of_10m_doubles_compiled(tmp_path):
    out = tmp_path / "out.json"
    spmd(2, SCRIPT, "ring10m", str(out))
    with open(out) as f:
        r = json.load(f)["ring10m"]
    assert r == {"max_error": 0.0, "elements": 10_000_000}


def test_mpi4torch_linear_regression_step_compiled_like_eager(job):
    n, results = job
    r = results["linreg"]
    assert r["compiled"] == pytest.approx(r["eager"], rel=1e-10, abs=1e-12)
    assert r["compiled"][-1] < r["compiled"][0]
    assert r["param_error"] < 1e-10, r


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("nprocs,group", [(2, "mesh"), (4, "ranks")])
def test_functional_collectives_model_compiles_and_trains_like_gloo(nprocs, group, tmp_path):
    out = tmp_path / "out.json"
    rerun_on_gloo_abort(lambda: spmd(nprocs, FUNCOL, str(free_port()), group, str(out)))
    with open(out) as f:
        r = json.load(f)
    assert r["compiled"] == pytest.approx(r["eager"], rel=1e-5, abs=1e-6), r
    assert r["param_error"] < 1e-5, r
    assert {"all_gather", "reduce_scatter", "all_to_all", "all_reduce"} <= set(r["collectives"])


# -- trace-time checks (one process, a mesh of 4: no MPI job needed) ---------

MESH = tdx.init_device_mesh("cpu", (4,), ("cp",))


class _Wrap(torch.nn.Module):
    def __init__(self, body, comm):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(4, 2))
        self.body, self.comm = body, comm

    def forward(self, x):
        return self.body(self.comm, self.p + x)


def trace(body):
    import tdx.mpi as mpi
    comm = mpi.comm(MESH, "cp")
    return tdx.trace(tdx.deferred_init(_Wrap, body, comm), torch.zeros(4, 2))


def test_a_traced_ring_is_one_program_with_a_permutation():
    def body(comm, v):
        s = comm.Isend(v, (comm.rank + 1) % comm.size, 7)
        r = comm.Irecv(torch.zeros_like(v), (comm.rank - 1) % comm.size, 7)
        return comm.Wait(r) * comm.rank + comm.Wait(s)
    prog = trace(body)
    text = prog.copy().partition().mlir
    assert "tdx.collective_permute" in text and "pairs = [0, 1, 1, 2, 2, 3, 3, 0]" in text
    assert "tdx.mesh_coord @mesh axis = \"cp\"" in text


def test_a_send_nobody_receives_names_its_line():
    def body(comm, v):
        comm.Isend(v, (comm.rank + 1) % comm.size, 3)
        return v
    with pytest.raises(tdx.CaptureError, match=r"Isend at test_mpi_compiled.py:\d+ \(tag 3\) is "
                                               r"never received"):
        trace(body)


def test_a_wait_before_the_send_is_a_deadlock_naming_both_lines():
    def body(comm, v):
        r = comm.Irecv(torch.zeros_like(v), (comm.rank - 1) % comm.size, 1)
        got = comm.Wait(r)
        comm.Isend(v, (comm.rank + 1) % comm.size, 1)
        return got
    with pytest.raises(tdx.CaptureError, match=r"Wait at test_mpi_compiled.py:\d+ for the Irecv "
                                               r"at test_mpi_compiled.py:\d+ \(tag 1\).*deadlock"):
        trace(body)


def test_peers_that_disagree_name_both_lines():
    def body(comm, v):
        s = comm.Isend(v, (comm.rank + 1) % comm.size, 0)
        r = comm.Irecv(torch.zeros_like(v), (comm.rank + 1) % comm.size, 0)
        comm.Wait(s)
        return comm.Wait(r)
    with pytest.raises(tdx.CaptureError, match=r"rank 0 receives from rank 1 \(Irecv at "
                                               r"test_mpi_compiled.py:\d+\), but rank 1 sends to "
                                               r"rank 2 \(Isend at test_mpi_compiled.py:\d+"):
        trace(body)


def test_sender_and_receiver_shapes_must_agree():
    def body(comm, v):
        s = comm.Isend(v, (comm.rank + 1) % comm.size, 0)
        r = comm.Irecv(torch.zeros(3), (comm.rank - 1) % comm.size, 0)
        comm.Wait(s)
        return comm.Wait(r)
    with pytest.raises(tdx.CaptureError, match=r"sends \(4, 2\) torch.float32, but the Irecv at "
                                               r"test_mpi_compiled.py:\d+ \(tag 0\) receives \(3,\)"):
        trace(body)


def test_branching_on_the_rank_is_refused_with_the_fix():
    def body(comm, v):
        return v * 2 if comm.rank == 0 else v
    with pytest.raises(tdx.CaptureError, match=r"rank is a value of the compiled program"):
        trace(body)


def test_a_root_outside_the_communicator_is_named():
    with pytest.raises(tdx.CaptureError, match=r"Bcast_ at test_mpi_compiled.py:\d+: root 4 is "
                                               r"outside the communicator cp"):
        trace(lambda comm, v: comm.Bcast_(v, 4))


def test_uneven_shares_are_refused_in_a_compiled_scatter():
    with pytest.raises(tdx.CaptureError, match=r"Scatter at .*numelem 3 on each of 4 ranks"):
        trace(lambda comm, v: comm.Scatter(v, 0, 3, 0))


def test_bitwise_reductions_run_eagerly_only():
    import tdx.mpi as mpi
    with pytest.raises(tdx.CaptureError, match=r"not MPI_BOR; run the logical and bitwise"):
        trace(lambda comm, v: comm.Allreduce(v, mpi.MPI_BOR))


def test_a_user_communication_program_is_not_placed_by_tdx():
    prog = trace(lambda comm, v: comm.Allreduce(v, 0))
    with pytest.raises(tdx.CaptureError, match=r"communication is the user's"):
        tdx.parallelize(prog, MESH, {}, data_parallel="cp")


def test_the_comm_report_lists_the_users_collectives():
    import tdx.mpi as mpi
    prog = trace(lambda comm, v: comm.Allgather(comm.Allreduce(v, mpi.MPI_SUM), 0))
    kinds = [c["kind"] for c in prog.comm_report()]
    assert kinds == ["all_reduce", "all_gather"], kinds


def test_the_compute_between_isend_and_wait_overlaps_the_message():
    # Issue 54, point 5: the message starts where both ends are posted
    # (tdx.start) and is waited for where the received value is first
    # read (tdx.wait), so the matmuls between run during the transfer.
    def body(comm, v):
        s = comm.Isend(v, (comm.rank + 1) % comm.size, 7)
        r = comm.Irecv(torch.zeros_like(v), (comm.rank - 1) % comm.size, 7)
        busy = torch.tanh(v @ v.t()) @ v
        got = comm.Wait(r)
        comm.Wait(s)
        return busy + got
    low = tdx.collectives.lowered(trace(body))
    ops = [line.split("=", 1)[-1].split()[0] for line in
           low.run_pipeline("tdx-backend").mlir.splitlines() if " = tdx." in line]
    start, wait = ops.index("tdx.start"), ops.index("tdx.wait")
    assert ops[start + 1] == "tdx.collective_permute", ops
    between = ops[start + 2:wait]
    assert between.count("tdx.matmul") == 2, ops
