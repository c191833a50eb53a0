"""Jobs across hosts (docs/cluster.md): hosts stood up on this machine as
network namespaces on a bridge (scripts/hosts.sh), each with its own
address, name and network stack; mpirun starts its daemons on them through
the rsh agent, and ranks on different hosts talk over TCP. Every test that
makes hosts removes them, also when it fails."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

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


@pytest.fixture(scope="module")
def two_hosts():
    hosts_cmd("up", "2")
    try:
        yield ["h1", "h2"]
    finally:
        hosts_cmd("down", check=False)


def spmd(*args, timeout=600):
    """`python3 -m tdx.run ARGS`: its exit, output, and the JSON lines the
    ranks printed."""
    done = subprocess.run([sys.executable, "-m", "tdx.run", *args], capture_output=True,
                          text=True, timeout=timeout)
    decoder, lines = json.JSONDecoder(), []
    for line in done.stdout.splitlines():
        at = 0
        while line.startswith("{", at):
            value, at = decoder.raw_decode(line, at)
            lines.append(value)
    return done, lines


ACROSS = ["--network", NETWORK, "--rsh", f"{HOSTS} rsh"]


@needs_hosts
def test_two_hosts_train_bitwise_like_one_host(two_hosts, tmp_path):
    """2 hosts x 2 ranks (dp x tp, tp inside a host) give bitwise the losses
    and state of 1 host x 4 ranks."""
    done, ranks = spmd("-n", "4", SCRIPT, str(tmp_path / "one.pt"))
    assert done.returncode == 0, done.stderr[-3000:]
    done, ranks = spmd("--hosts", "h1:2,h2:2", *ACROSS, SCRIPT, str(tmp_path / "two.pt"))
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
    done, ranks = spmd("--hosts", "h1:2,h2:2", "--map-by", "node", *ACROSS, str(script),
                       timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {r["rank"]: r["host"] for r in ranks} == {0: "h1", 1: "h2", 2: "h1", 3: "h2"}


def test_hosts_option_misuse_is_named(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    for args, message in [
            (["--hosts", "h1:0", str(script)], "h1 has 0 ranks"),
            (["--hosts", "h1:2,h1:2", str(script)], "h1 is named twice"),
            (["--hosts", "h1:x", str(script)], "'h1:x' is not HOST or HOST:RANKS"),
            (["-n", "3", "--hosts", "h1:2,h2:2", str(script)], "-n 3 but --hosts"),
            (["-n", "2", "--map-by", "node", str(script)], "give --hosts"),
            ([str(script)], "give -n N")]:
        done = subprocess.run([sys.executable, "-m", "tdx.run", *args], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


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
