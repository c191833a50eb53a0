"""The networked tensor store across hosts (docs/checkpoints.md, "The
tensor store over the network"): hosts stood up by scripts/hosts.sh, a
volume (tdx-volume) on each; removed also when the test fails. On one
host's own network: test_store_volumes.py."""

import os
import subprocess
import sys
import time

import pytest
import torch

import tdx
from tdx.compile import _tool
from tdx.store import Store
from test_cluster import ACROSS, HOSTS, needs_hosts, two_hosts  # noqa: F401
from test_spmd import tdx_run

HERE = os.path.dirname(os.path.abspath(__file__))
READER = os.path.join(HERE, "store_reader.py")


@needs_hosts
def test_published_across_hosts_read_on_another_host_in_another_layout(two_hosts, tmp_path,
                                                                       monkeypatch):
    """GPT-2 trained on 2 hosts x 2 ranks (dp x tp) publishes through the
    runner, each rank to its own host's volume; a job on h2 reads every
    tensor split 3 ways on its last dimension, bitwise the trainer's state.
    A host without a volume cannot write; a volume whose host is cut off is
    named to its reader."""
    volumes = []
    try:
        for h in two_hosts:
            p = subprocess.Popen([HOSTS, "rsh", h, _tool("tdx-volume"), "--port", "7070"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            volumes.append(p)
            assert p.stdout.readline().startswith(f"tdx-volume: serving on {h}:7070")
        store = Store("ucx://h1:7070,h2:7070")
        done, _ = tdx_run("--hosts", "h1:2,h2:2", *ACROSS, os.path.join(HERE, "hosts_script.py"),
                          str(tmp_path / "trained.pt"), store.path)
        assert done.returncode == 0, done.stderr[-3000:]
        status = store.status()
        assert status["h1:7070"]["files"] >= 1 and status["h2:7070"]["files"] >= 1

        read = subprocess.run([HOSTS, "rsh", "h2", sys.executable, READER, "layout", store.path,
                               "gpt2", str(tmp_path / "read.pt")],
                              capture_output=True, text=True, timeout=300)
        assert read.returncode == 0, read.stderr[-3000:]
        got = torch.load(tmp_path / "read.pt")
        want = {k: v for k, v in torch.load(tmp_path / "trained.pt")["state"].items()
                if not k.startswith("optimizer.")}
        assert got["host"] == "h2"
        # A tied weight (GPT-2's lm_head is wte) is published once.
        assert set(got["state"]) == set(want) - {"lm_head.weight"}
        assert all(torch.equal(got["state"][k], want[k]) for k in got["state"])

        # h2 has no volume of a store made of h1's alone.
        writer = tmp_path / "put.py"
        writer.write_text("import torch, tdx.store\n"
                          "tdx.store.Store('ucx://h1:7070').put('x', torch.ones(2))\n")
        put = subprocess.run([HOSTS, "rsh", "h2", sys.executable, str(writer)],
                             capture_output=True, text=True, timeout=300)
        assert put.returncode != 0
        assert "no volume of the store ucx://h1:7070 runs on this host ('h2')" in put.stderr

        # h2 cut off: its reader names the volume and host within the timeout.
        subprocess.run(["ip", "link", "set", "tdxh2", "down"], check=True)
        monkeypatch.setenv("TDX_STORE_TIMEOUT", "3")
        start = time.monotonic()
        with pytest.raises(tdx.CheckpointError, match="the store volume h2:7070 on host 'h2'"):
            store.get("gpt2")
        elapsed = time.monotonic() - start
        print(f"the cut-off volume was named to its reader after {elapsed:.1f} s")
        assert elapsed < 30
    finally:
        for p in volumes:
            p.kill()
