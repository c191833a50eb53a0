"""Model binaries (tdx.compile) run under mpirun on CPU ranks and compute
what PyTorch eager computes on the same weights; sharded init gathers to the
same tensors on every mesh."""

import functools
import itertools
import json
import os
import shutil
import subprocess

import pytest
import re

import torch

import tdx
from models import GPT2, Llama
from test_sharding import GPT2_PLAN, LLAMA_PLAN

MODELS = {"gpt2": (GPT2, GPT2_PLAN), "llama": (Llama, LLAMA_PLAN)}
# name: (mesh shape, axis names, data-parallel axis or None)
MESHES = {
    "1": ((1,), ("tp",), None),
    "tp2": ((2,), ("tp",), None),
    "dp2": ((2,), ("dp",), "dp"),
    "2x2": ((2, 2), ("dp", "tp"), "dp"),
}
def state(module):
    """Every parameter and buffer (persistent or not) by qualified name."""
    return dict(itertools.chain(module.named_parameters(), module.named_buffers()))


IDS = torch.randint(0, 96, (4, 8), generator=torch.Generator().manual_seed(1))


@functools.lru_cache(maxsize=None)
def compiled(model, mesh):
    cls, plan = MODELS[model]
    shape, axes, dp = MESHES[mesh]
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(cls), IDS)
    tp_plan = plan if "tp" in axes else {}
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), tp_plan, data_parallel=dp)
    return tdx.compile(prog)


# Both models on 1, 2 (tensor- and data-parallel) and 4 (2x2) ranks.
FORWARD_CASES = [("gpt2", "1"), ("gpt2", "tp2"), ("gpt2", "dp2"), ("gpt2", "2x2"),
                 ("llama", "1"), ("llama", "tp2"), ("llama", "dp2"), ("llama", "2x2")]


@pytest.mark.parametrize("model,mesh", FORWARD_CASES)
def test_forward_matches_eager(model, mesh):
    exe = compiled(model, mesh)
    torch.manual_seed(0)
    eager = MODELS[model][0]()
    want = eager(IDS)
    (got,) = exe.run(IDS, params=state(eager))
    assert got.shape == want.shape
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 1e-5, f"{model} on {mesh}: relative error {rel}"


def test_sharded_init_is_bitwise_the_one_rank_init():
    one = compiled("gpt2", "1").materialize(seed=3)
    four = compiled("gpt2", "2x2").materialize(seed=3)
    assert one.keys() == four.keys() and len(one) > 0
    for name in one:
        assert torch.equal(one[name], four[name]), name
    assert not torch.equal(one["wte.weight"], compiled("gpt2", "1").materialize(seed=4)["wte.weight"])


def test_multi_op_init_programs_run_in_the_binary():
    """LLaMA's rotary tables are buffers made by arange, pow, div, outer, cos
    and sin: the binary evaluates those programs shard by shard, close to
    eager and bitwise the same on every mesh."""
    one = compiled("llama", "1").materialize(seed=0)
    four = compiled("llama", "2x2").materialize(seed=0)
    torch.manual_seed(0)
    eager = dict(Llama().named_buffers())
    assert {"rope_cos", "rope_sin"} <= eager.keys()
    for name in ("rope_cos", "rope_sin"):
        assert torch.equal(one[name], four[name]), name
        torch.testing.assert_close(one[name], eager[name], rtol=1e-6, atol=1e-6)


def test_bad_command_lines_are_named():
    import subprocess
    exe = compiled("gpt2", "1")
    for args, message in [(["--seed", "abc"], "--seed needs a number"),
                          (["--steps"], "--steps needs a number"),
                          (["--threads", "0"], "--threads needs a count of at least 1"),
                          (["--threads", "x"], "--threads needs a number"),
                          (["--bogus"], "unknown option --bogus")]:
        done = subprocess.run([exe.path, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    done = subprocess.run([exe.path, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--params FILE|DIR" in done.stdout and "--profile" in done.stdout
    assert "--threads T" in done.stdout


def test_threads_per_rank_default_to_the_cores_a_rank_is_given():
    # --threads sets ATen's (and OpenBLAS's) threads. Without it (and without
    # OMP_NUM_THREADS) a rank bound to a core takes 1 thread, and an unbound
    # one this machine's cores over the ranks started on it.
    import os
    import subprocess
    exe = compiled("gpt2", "1")
    ids = torch.zeros(4, 8, dtype=torch.long)
    exe.run(ids, verbose=True, threads=3)
    assert re.search(r"rank 0: init .* 3 threads", exe.last_log), exe.last_log
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    dp2 = compiled("gpt2", "dp2")
    for binary, bind, ranks, want in [(exe, "core", 1, 1), (exe, "none", 1, os.cpu_count()),
                                      (dp2, "none", 2, max(1, os.cpu_count() // 2))]:
        done = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", bind,
                               "-np", str(ranks), binary.path, "--verbose"],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        lines = re.findall(r"rank \d+: init .* (\d+) threads", done.stdout)
        assert lines == [str(want)] * ranks, (bind, ranks, done.stdout)


def test_wrong_rank_count_is_refused():
    exe = compiled("gpt2", "tp2")
    with pytest.raises(tdx.TdxError, match="nprocs=2"):
        exe.run(IDS, nprocs=3)
    # The binary itself refuses a world that does not match its mesh.
    import subprocess
    done = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "3",
                           exe.path], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "mesh" in done.stderr


def test_save_and_load(tmp_path):
    exe = compiled("gpt2", "tp2")
    exe.save(tmp_path / "model")
    again = tdx.Executable.load(str(tmp_path / "model"), world_size=2)
    torch.manual_seed(0)
    eager = GPT2()
    (a,) = again.run(IDS, params=state(eager))
    assert torch.allclose(a, eager(IDS), rtol=1e-5, atol=1e-5)
    with pytest.raises(tdx.TdxError, match="no model binary"):
        tdx.Executable.load(str(tmp_path / "missing"), world_size=2)


def start_two_ranks(tmp_path, *options):
    """Starts the 2-rank GPT-2 binary in a long forward loop (launch_two)."""
    exe = compiled("gpt2", "tp2")
    tdx.safetensors.save({"input:0": IDS}, str(tmp_path / "in.safetensors"))
    return launch_two([exe.path, "--inputs", str(tmp_path / "in.safetensors"),
                       "--steps", "1000000", "--verbose", *options])


def launch_two(command):
    """Starts `command` (a model binary and its arguments, with --verbose)
    on 2 ranks; returns the mpirun process and the two rank pids once both
    are past their start-up (MPI_Init cannot time out: a rank stopped there
    would hang the other). The process's `stderr_lines` collects its
    stderr."""
    import subprocess
    import threading
    import time
    job = subprocess.Popen(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2",
                            *command],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = [], []
    readers = [threading.Thread(target=lambda: out.extend(job.stdout), daemon=True),
               threading.Thread(target=lambda: err.extend(job.stderr), daemon=True)]
    for r in readers:
        r.start()
    job.stderr_lines, job.readers = err, readers
    ranks, deadline = [], time.monotonic() + 60
    # --verbose prints each rank's "init" line (stdout) once it is set up.
    while time.monotonic() < deadline:
        ranks = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True,
                               text=True).stdout.split()
        if len(ranks) == 2 and sum(": init " in line for line in list(out)) == 2:
            break
        time.sleep(0.1)
    else:
        job.kill()
        pytest.fail("the ranks did not start: " + "".join(out + err)[-2000:])
    time.sleep(0.5)  # mid-run: both ranks are in their loop
    return job, [int(r) for r in ranks]


def end_within_30s(job, ranks):
    """Waits for mpirun to end; returns its stderr. Kills what is left."""
    import signal
    import subprocess
    import time
    try:
        start = time.monotonic()
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the job did not end within 30 s:\n" + "".join(job.stderr_lines)[-3000:])
        assert time.monotonic() - start < 30
        for r in job.readers:
            r.join(timeout=10)
        return "".join(job.stderr_lines)
    finally:
        if job.poll() is None:
            job.kill()
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def mpi_rank_of(pid):
    """The MPI rank of a rank process started by mpirun (its environment's
    OMPI_COMM_WORLD_RANK): pgrep's order of the ranks is not theirs."""
    environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return int([e.split(b"=")[1] for e in environ if e.startswith(b"OMPI_COMM_WORLD_RANK=")][0])


def test_a_lost_rank_ends_the_job_with_its_name(tmp_path):
    import re
    import signal
    job, ranks = start_two_ranks(tmp_path)
    rank = mpi_rank_of(ranks[1])
    os.kill(ranks[1], signal.SIGKILL)
    err = end_within_30s(job, ranks)
    assert job.returncode != 0
    assert re.search(rf"process rank {rank} with PID \d+ on node \S+ exited on signal 9", err), err


def test_a_stuck_rank_times_out_every_rank(tmp_path):
    import re
    # Rank 1 stops itself between two calls (TDX_FAULT_STOP_RANK), alive
    # but stuck: no process exits. A SIGSTOP from here could land inside an
    # MPI call holding a lock of Open MPI's shared memory, where rank 0
    # would spin past any deadline (seen once in 50 runs).
    os.environ["TDX_FAULT_STOP_RANK"] = "1:20"
    try:
        job, ranks = start_two_ranks(tmp_path, "--collective-timeout", "3")
    finally:
        del os.environ["TDX_FAULT_STOP_RANK"]
    err = end_within_30s(job, ranks)
    assert "tdx: rank 1 stops itself before call 20" in err, err
    assert job.returncode != 0
    # A rank times out in whichever collective it was waiting in when its
    # peer stopped (a step's all_reduce over {tp}, the logits' gather or a
    # request's barrier over {all}: timing's choice, not asserted), naming
    # its group: both ranks of the job, the stopped one among them.
    waiting = re.search(r"tdx: rank (\d) \(host \S+\): (.+?) over mesh axes \{([^}]*)\} did "
                        r"not complete in 3 s: a rank of its group \(ranks 0 on \S+, 1 on "
                        r"\S+\) is lost, stuck or cut off", err)
    assert waiting, err


def test_checkpoint_directory_matches_eager(tmp_path):
    """--params DIR: a checkpoint split over several files, each rank reading
    only its shards, gives eager's logits."""
    exe = compiled("gpt2", "2x2")
    torch.manual_seed(0)
    eager = GPT2()
    weights = state(eager)
    names = sorted(weights)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for part, chunk in enumerate((names[::2], names[1::2])):
        tdx.safetensors.save({n: weights[n] for n in chunk},
                             str(ckpt / f"model-{part + 1:05d}-of-00002.safetensors"))
    (got,) = exe.run(IDS, params=str(ckpt))
    torch.testing.assert_close(got, eager(IDS), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("from_file", [False, True], ids=["init", "params"])
def test_sharded_init_peak_memory_is_the_shard(tmp_path, from_file):
    """Each rank's peak memory grows by its shard (plus a bounded block), not
    by the global tensor: a 64 MiB weight over 4 ranks, made by sharded init
    or read from a checkpoint file that holds the global tensor."""
    import re
    import subprocess
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(torch.nn.Linear, 2048, 8192, bias=False),
                     torch.zeros(2, 2048))
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (4,), ("tp",)),
                    {"": tdx.ColwiseParallel()})
    exe = tdx.compile(prog)
    args = []
    if from_file:
        path = str(tmp_path / "weight.safetensors")
        tdx.safetensors.save({"weight": torch.randn(8192, 2048)}, path)
        args = ["--params", path]
    done = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "4",
                           exe.path, "--verbose", *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"local parameters ([\d.]+) MiB, peak RSS grew ([\d.]+) MiB", done.stdout)
    assert len(rows) == 4, done.stdout
    for local, grew in rows:
        local, grew = float(local), float(grew)
        assert local == 16.0
        assert 0.9 * local <= grew <= local + 4, (local, grew)  # the global tensor is 64 MiB


def test_bad_params_files_are_named(tmp_path):
    exe = compiled("gpt2", "tp2")
    torch.manual_seed(0)
    weights = state(GPT2())
    good = tmp_path / "params.safetensors"
    tdx.safetensors.save(weights, str(good))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(tdx.TdxError, match="do not match its shape \\(truncated or corrupt file\\)"):
        exe.run(IDS, params=str(cut))
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(tdx.TdxError, match="corrupt safetensors header"):
        exe.run(IDS, params=str(junk))
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        exe.run(IDS, params=str(tmp_path / "missing.safetensors"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(tdx.TdxError, match="directory without \\*.safetensors files"):
        exe.run(IDS, params=str(tmp_path / "empty"))
    twice = tmp_path / "twice"
    twice.mkdir()
    tdx.safetensors.save({"wpe.weight": weights["wpe.weight"]}, str(twice / "a.safetensors"))
    tdx.safetensors.save(weights, str(twice / "b.safetensors"))
    with pytest.raises(tdx.TdxError, match="'wpe.weight' is stored in two files"):
        exe.run(IDS, params=str(twice))
    # A parameter the file lacks starts from its init program, and the run
    # says so (a model's state_dict() lacks its non-persistent buffers).
    del weights["wte.weight"]
    with pytest.warns(tdx.TdxWarning, match="has no 'wte.weight'; it starts as its init program"):
        exe.run(IDS, params=weights)
    # A file that has none of them is the wrong file (names without the
    # model's prefix, say), not a partial one.
    renamed = {"model." + k: v for k, v in weights.items()}
    with pytest.raises(tdx.TdxError, match="has none of the program's parameters"):
        exe.run(IDS, params=renamed)


def test_unsupported_target_is_refused():
    with pytest.raises(tdx.TdxError, match="target 'tpu' is not supported; use target='cpu' or 'cuda'"):
        tdx.compile(tdx.trace(tdx.deferred_init(GPT2), IDS), target="tpu")


class Elementwise(torch.nn.Module):
    """Every elementwise op the backends fuse, in chains that share values,
    broadcast, change dtype and feed a non-elementwise op in the middle."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        a = torch.nn.functional.gelu(x * self.scale + 0.25)
        b = torch.nn.functional.gelu(a - x, approximate="tanh")
        c = torch.sigmoid(b) * torch.nn.functional.silu(a) / (torch.abs(x) + 1.0)
        d = torch.maximum(c, -a).pow(2.0) + torch.minimum(torch.relu(x), b)
        e = torch.exp(-d.abs()) + torch.log(d.abs() + 1.0) + torch.sqrt(d.abs() + 0.5)
        f = torch.rsqrt(e + 1.0) + torch.tanh(e) + torch.sin(e) * torch.cos(a)
        g = torch.where(x > 0.1, f, torch.neg(e))
        s = g.sum(-1, keepdim=True)  # not elementwise: the chain splits here
        h = (g.double() * 3.0 - s.double()).float()
        return h, a * 2.0


@pytest.mark.parametrize("mesh", ["1", "dp2"])
def test_fused_elementwise_kernels_match_eager(mesh):
    # dp2 splits a batch of 5 unevenly: kernels then take their shape at run time.
    x = torch.randn(5, 6, 8, generator=torch.Generator().manual_seed(2))
    model = Elementwise()
    prog = tdx.trace(tdx.deferred_init(Elementwise), x)
    shape, axes, dp = MESHES[mesh]
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), {}, data_parallel=dp)
    exe = tdx.compile(prog)
    got = exe.run(x, params=state(model))
    want = model(x)
    assert len(got) == 2
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_inputs_are_checked_against_the_program_before_launching():
    # The dp2 GPT-2 program traced for int64 ids of shape (4, 8): a wrong
    # dtype, shape or count is named in Python, with what the program takes,
    # before any rank starts (it used to run, or fail on every rank at once).
    exe = compiled("gpt2", "dp2")
    sig = exe.signature()
    assert sig["mesh"] == [2] and sig["axes"] == ["dp"]
    assert sig["inputs"] == [{"shape": [4, 8], "dtype": "I64", "layout": "[Shard(0)]"}]
    assert [o["shape"] for o in sig["outputs"]] == [[4, 8, 128]]  # GPT2's vocabulary
    want = "the program was traced for torch.int64 of shape (4, 8)"
    with pytest.raises(tdx.InputError, match=re.escape(
            f"run: input 0 is torch.float64 of shape (4, 8); {want}")):
        exe.run(IDS.double())
    with pytest.raises(tdx.InputError, match=re.escape(
            f"run: input 0 is torch.int64 of shape (4, 9); {want}")):
        exe.run(torch.zeros(4, 9, dtype=torch.int64))
    with pytest.raises(tdx.InputError, match=re.escape(
            "run has 2 input(s) but the program takes 1: input 0: torch.int64 of shape (4, 8)")):
        exe.run(IDS, IDS)
    with pytest.raises(tdx.InputError, match="input 0 is a list; the program takes a tensor"):
        exe.run([[1, 2]])
    # A binary tells its signature without mpirun.
    out = subprocess.run([exe.path, "--signature"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == sig


class NarrowDtypes(torch.nn.Module):
    """bf16 and f16 chains (each op in float, rounded to the type), 8- and
    16-bit integer arithmetic that wraps, uint8, and complex through ATen."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((6,), 1.5))

    def forward(self, x, i):
        h = (x * self.scale).bfloat16()
        bf = (h * 0.5).exp() + h
        f = x.half() * 3.0 + 1.0
        wrapped = (i * 3 + 100).to(torch.int8)       # wraps past 127
        short = i.to(torch.int16) * 300
        byte = (x.abs() * 40).to(torch.uint8)
        spectrum = torch.fft.rfft(x, dim=-1)
        return bf, f, wrapped, short, byte, spectrum.abs(), torch.view_as_real(spectrum)


def test_narrow_and_complex_dtypes_run_like_eager():
    g = torch.Generator().manual_seed(3)
    x, i = torch.randn(4, 6, generator=g), torch.randint(0, 60, (4, 6), generator=g)
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(NarrowDtypes), x, i)
    got = tdx.compile(prog, progress=False).run(x, i)
    want = NarrowDtypes()(x, i)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    # bf16/f16 round per op exactly as eager's kernels; integers are exact.
    for g_, w in zip(got[:5], want[:5]):
        assert torch.equal(g_, w), (g_, w)
    for g_, w in zip(got[5:], want[5:]):
        assert (g_ - w).abs().max() < 1e-5
    cuda = os.path.exists("/usr/local/cuda/bin/nvcc") or shutil.which("nvcc")
    if cuda:
        # The same kernels on CUDA's 16-bit types compile; complex stays on the CPU.
        class NoComplex(NarrowDtypes):
            def forward(self, x, i):
                return super().forward(x, i)[:5]
        torch.manual_seed(0)
        tdx.compile(tdx.trace(tdx.deferred_init(NoComplex), x, i), target="cuda", progress=False)


def test_opt_level_reaches_the_compiler_and_is_checked(tmp_path, monkeypatch):
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(NarrowDtypes), torch.randn(4, 6), torch.zeros(4, 6).long())
    with pytest.raises(ValueError, match="opt_level must be 0, 1, 2 or 3, not 5"):
        tdx.compile(prog, opt_level=5)
    # The default comes from TDX_OPT_LEVEL (the suite sets 0), checked too.
    with monkeypatch.context() as env:
        env.setenv("TDX_OPT_LEVEL", "fast")
        with pytest.raises(ValueError, match="TDX_OPT_LEVEL must be 0, 1, 2 or 3, not 'fast'"):
            tdx.compile(prog)
    exe = tdx.compile(prog, opt_level=0, progress=False)
    x, i = torch.randn(4, 6), torch.randint(0, 60, (4, 6))
    assert torch.equal(exe.run(x, i)[2], NarrowDtypes()(x, i)[2])
