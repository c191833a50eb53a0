"""Jobs across hosts (docs/cluster.md): hosts stood up on this machine as
network namespaces on a bridge (scripts/hosts.sh), each with its own
address, name and network stack; mpirun starts its daemons on them through
the rsh agent, and ranks on different hosts talk over TCP. Every test that
makes hosts removes them, also when it fails."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from test_spmd import tdx_run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
HOSTS = os.path.abspath(os.path.join(ROOT, "scripts", "hosts.sh"))
SCRIPT = os.path.join(HERE, "hosts_script.py")
NETWORK = "10.77.0.0/24"


def hosts_cmd(*args, check=True):
    return subprocess.run([HOSTS, *args], capture_output=True, text=True, timeout=120,
                          check=check)


def can_make_hosts():
    """Whether this machine lets the suite make network namespaces (root,
    iproute2): CI does."""
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(["ip", "netns", "add", "tdx-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "tdx-probe"], capture_output=True)
    return probe.returncode == 0


needs_hosts = pytest.mark.skipif(not can_make_hosts(),
                                 reason="making test hosts needs root and ip netns")


@pytest.fixture
def two_hosts():
    """Hosts h1 and h2, made for one test (a test of hosts.sh itself removes
    every host) and removed after it."""
    hosts_cmd("up", "2")
    try:
        yield ["h1", "h2"]
    finally:
        hosts_cmd("down", check=False)


ACROSS = ["--network", NETWORK, "--rsh", f"{HOSTS} rsh"]


@needs_hosts
def test_two_hosts_train_bitwise_like_one_host(two_hosts, tmp_path):
    """2 hosts x 2 ranks (dp x tp, tp inside a host) give bitwise the losses
    and state of 1 host x 4 ranks."""
    done, ranks = tdx_run("-n", "4", SCRIPT, str(tmp_path / "one.pt"))
    assert done.returncode == 0, done.stderr[-3000:]
    done, ranks = tdx_run("--hosts", "h1:2,h2:2", *ACROSS, SCRIPT, str(tmp_path / "two.pt"))
    assert done.returncode == 0, done.stderr[-3000:]
    # The default placement: consecutive ranks on a host, so the mesh's
    # last axis (tp) is inside a host and dp crosses the link.
    assert {r["rank"]: r["host"] for r in ranks} == {0: "h1", 1: "h1", 2: "h2", 3: "h2"}
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["losses"] == two["losses"]
    assert sorted(one["state"]) == sorted(two["state"])
    for name, value in one["state"].items():
        assert torch.equal(value, two["state"][name]), name


PLACES = """
import json, os, socket
print(json.dumps({"rank": int(os.environ["OMPI_COMM_WORLD_RANK"]),
                  "host": socket.gethostname()}), flush=True)
"""


@needs_hosts
def test_map_by_node_puts_the_first_axis_inside_a_host(two_hosts, tmp_path):
    script = tmp_path / "places.py"
    script.write_text(PLACES)
    done, ranks = tdx_run("--hosts", "h1:2,h2:2", "--map-by", "node", *ACROSS, str(script),
                       timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {r["rank"]: r["host"] for r in ranks} == {0: "h1", 1: "h2", 2: "h1", 3: "h2"}


def test_hosts_option_misuse_is_named(tmp_path, capsys):
    from tdx.run import main
    script = tmp_path / "s.py"
    script.write_text("")
    for args, message in [
            (["--hosts", "h1:0", str(script)], "h1 has 0 ranks"),
            (["--hosts", "h1:2,h1:2", str(script)], "h1 is named twice"),
            (["--hosts", "h1:x", str(script)], "'h1:x' is not HOST or HOST:RANKS"),
            (["-n", "3", "--hosts", "h1:2,h2:2", str(script)], "-n 3 but --hosts"),
            (["-n", "2", "--map-by", "node", str(script)], "give --hosts"),
            ([str(script)], "give -n N")]:
        with pytest.raises(SystemExit) as ended:
            main(args)
        assert ended.value.code == 2 and message in capsys.readouterr().err, args


@needs_hosts
def test_hosts_come_up_named_rate_limited_and_go_down_whole():
    hosts_cmd("down", check=False)
    try:
        hosts_cmd("up", "3", "--rate", "1gbit")
        assert hosts_cmd("list").stdout.split() == ["h1", "10.77.0.1", "h2", "10.77.0.2",
                                                    "h3", "10.77.0.3"]
        # Each host resolves from the root namespace and from the others,
        # and runs a command under its own name, as `ssh host cmd` does.
        assert subprocess.run(["getent", "hosts", "h3"], capture_output=True,
                              text=True).stdout.split()[0] == "10.77.0.3"
        there = subprocess.run([HOSTS, "rsh", "h2", "hostname; getent hosts h1; "
                                "ip -o -4 addr show eth0; tc qdisc show dev eth0"],
                               capture_output=True, text=True, timeout=60)
        assert there.returncode == 0, there.stderr
        assert there.stdout.startswith("h2\n10.77.0.1")
        assert "10.77.0.2/24" in there.stdout and "tbf" in there.stdout
        missing = subprocess.run([HOSTS, "rsh", "h9", "true"], capture_output=True, text=True)
        assert missing.returncode == 255 and "host h9 is not up" in missing.stderr
    finally:
        hosts_cmd("down", check=False)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "tdx-h" not in names
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "tdxbr0" not in links and "tdxh" not in links
    assert "tdx test hosts" not in open("/etc/hosts").read()


# Faults of a cluster: the job on h1 and h2 (one dp rank each) saves a
# checkpoint after every step; a fault lands mid-run.
FAULT_SCRIPT = os.path.join(HERE, "fault_script.py")
COLLECTIVE_TIMEOUT = "6"


class Job:
    """`python3 -m tdx.run ARGS fault_script.py CKPT STEPS ...` in the
    background, its stdout's steps collected as they come."""

    def __init__(self, launch, ckpt, steps, pace="0"):
        import threading
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tdx.run", *launch, FAULT_SCRIPT, str(ckpt), str(steps),
             COLLECTIVE_TIMEOUT, pace], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.losses, self.err = {}, []
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=lambda: self.err.extend(self.proc.stderr),
                                          daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith('{"step"'):
                got = json.loads(line)
                self.losses[got["step"]] = got["loss"]

    def wait_for_step(self, step, timeout=300):
        deadline = time.monotonic() + timeout
        while max(self.losses, default=0) < step:
            assert self.proc.poll() is None, "".join(self.err)[-3000:]
            assert time.monotonic() < deadline, f"no step {step} in {timeout} s"
            time.sleep(0.05)

    def wait(self, timeout):
        """The job's exit, and when it ended (time.monotonic())."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the job did not end in {timeout} s:\n"
                                 + "".join(self.err)[-3000:])
        ended = time.monotonic()
        # A cut-off host's daemon may hold the job's pipes until the host is
        # removed: its output so far is what there is.
        for t in self._threads:
            t.join(timeout=2)
        return code, ended


TWO_HOSTS = ["--hosts", "h1:1,h2:1", *ACROSS]


def ranks_left():
    """The fault script's processes still alive on any test host."""
    left = []
    for ns in ("tdx-h1", "tdx-h2"):
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"fault_script" in f.read():
                        left.append((ns, pid))
            except OSError:
                pass
    return left


def committed(ckpt):
    from tdx.checkpoint import latest, step_of
    return step_of(latest(ckpt))


def uninterrupted(tmp_path, steps):
    """The same job's losses run start to end on one host."""
    job = Job(["-n", "2"], tmp_path / "uninterrupted", steps)
    code, _ = job.wait(600)
    assert code == 0, "".join(job.err)[-3000:]
    return job.losses


def resume_on(launch, ckpt, steps, want):
    """Resumes the job from `ckpt` with `launch` (another host count) up to
    `steps`: its losses go on as the uninterrupted run's."""
    first = committed(ckpt)
    job = Job(launch, ckpt, steps)
    code, _ = job.wait(600)
    assert code == 0, "".join(job.err)[-3000:]
    assert sorted(job.losses) == list(range(first + 1, steps + 1))
    for k, loss in job.losses.items():
        assert abs(loss - want[k]) <= 1e-5 * abs(want[k]), (k, loss, want[k])
    return first


def fault_ends_the_job(fault, tmp_path):
    """Runs the job on two hosts, applies `fault` mid-run, and checks every
    rank ended within 30 s, naming a host and rank, with the checkpoints
    committed before the fault still there."""
    ckpt = tmp_path / "ckpt"
    job = Job(TWO_HOSTS, ckpt, 100000, pace="0.2")
    job.wait_for_step(3)
    before = committed(ckpt)
    start = time.monotonic()
    fault()
    code, end = job.wait(60)
    ended = end - start
    err = "".join(job.err)
    print(f"{fault.__name__}: the job ended {ended:.1f} s after the fault (step {before} "
          f"committed before it)")
    assert code != 0
    assert ended < 30, f"the job took {ended:.1f} s to end:\n{err[-3000:]}"
    if fault.__name__ != "stop":
        # A rank cut off from mpirun ends on its own clock (its own
        # collective timeout, then MPI_Abort's grace), which races tdx.run's
        # return: every rank gone within 30 s of the fault, polled.
        while ranks_left() and time.monotonic() < start + 30:
            time.sleep(0.2)
        assert ranks_left() == [], ranks_left()
    assert committed(ckpt) >= before  # nothing committed is lost
    return err, ckpt


@needs_hosts
def test_a_cut_link_ends_every_rank_naming_it_and_the_job_resumes_on_other_host_counts(
        two_hosts, tmp_path):
    def cut():
        subprocess.run(["ip", "link", "set", "tdxh2", "down"], check=True)
    try:
        err, ckpt = fault_ends_the_job(cut, tmp_path)
    finally:
        subprocess.run(["ip", "link", "set", "tdxh2", "up"], check=True)
    # Which collective a rank waits in when the link goes down (a step's
    # all_reduce over {dp}, the loss's gather or a checkpoint's over {all})
    # is timing's choice: any, naming the group across both hosts.
    assert re.search(r"tdx: rank \d \(host h[12]\): .+? over mesh axes \{(dp|all)\} did not "
                     r"complete in 6 s: a rank of its group \(ranks 0 on h1, 1 on h2\)", err), err
    # 2 hosts -> 1 (two ranks on h1's machine), then 1 -> 2.
    steps = committed(ckpt) + 4
    want = uninterrupted(tmp_path, steps)
    resume_on(["-n", "2"], ckpt, steps - 2, want)
    resume_on(TWO_HOSTS, ckpt, steps, want)


def rank_pid(ns):
    """The fault script's rank process on test host `ns`."""
    for found, pid in ranks_left():
        if found == ns:
            return int(pid)
    raise AssertionError(f"no rank on {ns}")


# slow (25 s): mpirun's own detection of a dead rank; TDX_SLOW=1 runs it.
@pytest.mark.slow
@needs_hosts
def test_a_hosts_killed_ranks_end_the_job_naming_host_and_rank(two_hosts, tmp_path):
    def kill():
        os.kill(rank_pid("tdx-h2"), signal.SIGKILL)
    err, ckpt = fault_ends_the_job(kill, tmp_path)
    assert re.search(r"process rank 1 with PID \d+ on node h2", err.replace("\n", " ")), err
    steps = committed(ckpt) + 2
    resume_on(["-n", "2"], ckpt, steps, uninterrupted(tmp_path, steps))


@needs_hosts
def test_a_stopped_host_ends_the_other_ranks_and_its_own_once_it_runs(two_hosts, tmp_path):
    """SIGSTOP on every process of h2: the ranks elsewhere end within 30 s,
    naming the group with h2; h2's own rank ends once continued."""
    stopped = []

    def stop():
        pids = subprocess.run(["ip", "netns", "pids", "tdx-h2"], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            os.kill(int(pid), signal.SIGSTOP)
            stopped.append(int(pid))
    try:
        err, ckpt = fault_ends_the_job(stop, tmp_path)
        assert re.search(r"tdx: rank 0 \(host h1\): .* did not complete in 6 s: a rank of its "
                         r"group \(ranks 0 on h1, 1 on h2\)", err), err
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 30
    while ranks_left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ranks_left() == [], "h2's rank did not end within 30 s of running again"
