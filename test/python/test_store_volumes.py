"""The networked tensor store on this host's own network (docs/checkpoints.md,
"The tensor store over the network"): a volume (tdx-volume) holds what the
writers put, readers fetch the bytes of their boxes from it over UCX,
versions commit whole. Across hosts: test_store_network.py."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import tdx
from tdx.store import StaleVersion, Store, start_volume
from test_spmd import tdx_run

HERE = os.path.dirname(os.path.abspath(__file__))
READER = os.path.join(HERE, "store_reader.py")


@pytest.fixture
def volume():
    with start_volume(0, host="localhost") as v:
        yield v


def served(store):
    return sum(s["served"] for s in store.status().values())


def test_put_get_boxes_versions_and_delete_over_the_network(volume):
    store = Store([volume])
    assert store.networked and store.path == f"ucx://{volume.address}"
    torch.manual_seed(0)
    sd = {"w": torch.randn(64, 48), "b": torch.randn(48).to(torch.bfloat16),
          "steps": torch.tensor(7)}
    assert store.put("policy", sd) == 0
    got = store.get("policy")
    assert sorted(got) == sorted(sd) and all(torch.equal(got[k], sd[k]) for k in sd)
    assert store.tensors("policy")["w"] == (torch.Size([64, 48]), torch.float32)

    # A box moves only its own bytes (the file's header comes with the
    # first read of it): a quarter of w, split 2 x 2.
    before = served(store)
    box = store.get("policy", "w", mesh=(2, 2), placements=[tdx.Shard(0), tdx.Shard(1)],
                    coords=(1, 0))
    assert torch.equal(box, sd["w"][32:, :24])
    moved = served(store) - before
    assert 32 * 24 * 4 <= moved < 32 * 24 * 4 + 1024, moved

    # Versions: the newest two stay; an old one is gone by name.
    store.put("policy", {k: v + 1 for k, v in sd.items()})
    store.put("policy", {k: v + 2 for k, v in sd.items()})
    assert store.versions("policy") == [1, 2] and store.keys() == ["policy"]
    assert torch.equal(store.get("policy", "w", version=1), sd["w"] + 1)
    with pytest.raises(KeyError, match="has no version 0; it has \\[1, 2\\]"):
        store.get("policy", version=0)
    store.put("single", torch.arange(5))
    assert torch.equal(store.get("single"), torch.arange(5))
    store.delete("policy")
    assert store.keys() == ["single"] and not store.exists("policy")
    with pytest.raises(KeyError, match="has no key 'policy'"):
        store.get("policy")
    assert store.status()[volume.address]["committed"] == 1


def test_a_networked_store_names_bad_paths_and_a_volume_that_is_not_there(volume, monkeypatch):
    with pytest.raises(tdx.CheckpointError, match="'h1' in ucx://h1 is not a volume's HOST:PORT"):
        Store("ucx://h1").keys()
    with pytest.raises(tdx.CheckpointError, match="names no volume"):
        Store("ucx://").keys()
    with pytest.raises(tdx.CheckpointError, match="not a valid key|letters, digits"):
        Store([volume]).put("../up", torch.ones(1))
    # Nothing listens on the port: the error names the volume and its host.
    monkeypatch.setenv("TDX_STORE_TIMEOUT", "3")
    start = time.monotonic()
    with pytest.raises(tdx.CheckpointError,
                       match="the store volume localhost:1 on host 'localhost' "
                             "(is unreachable|did not answer)"):
        Store("ucx://localhost:1").keys()
    # TDX_STORE_TIMEOUT is what bounds it: at most two tries of 3 s (a
    # refused connection is tried once more on a new UCX worker) and the
    # workers' set-up on 2 busy cores, short of the default's two of 10 s.
    assert time.monotonic() - start < 15
    # A volume that ended: its reader is told, not left waiting.
    store = Store([volume])
    store.put("k", torch.ones(3))
    volume.stop()
    with pytest.raises(tdx.CheckpointError, match=f"the store volume {volume.address}"):
        store.get("k")
    assert issubclass(StaleVersion, tdx.CheckpointError)
    # Two volumes on one port: the second one names it.
    with start_volume(0, host="localhost") as first:
        port = int(first.address.rsplit(":", 1)[1])
        with pytest.raises(tdx.CheckpointError,
                           match=f"cannot listen on port {port}: .*pick another --port"):
            start_volume(port)


def test_four_readers_during_three_writes_never_see_a_mixed_version(volume, tmp_path):
    """A 2-rank job publishes 3 versions (keep=1: each older one is dropped
    as soon as the next commits) while 4 reader processes read the key
    whole in a loop: every state a reader saw is one the writer published,
    whole, and every reader saw all three."""
    store = Store([volume])
    readers = [subprocess.Popen([sys.executable, READER, "watch", store.path, "w", str(tmp_path),
                                 str(r)], stderr=subprocess.PIPE, text=True) for r in range(4)]
    try:
        done, _ = tdx_run("-n", "2", os.path.join(HERE, "store_writer.py"), store.path,
                          str(tmp_path), "3", "4", timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        for r in readers:
            assert r.wait(timeout=60) == 0, r.stderr.read()[-3000:]
    finally:
        for r in readers:
            r.kill()
    written = json.loads((tmp_path / "written.json").read_text())
    assert len(written) == 3 and len({json.dumps(w) for w in written}) == 3
    for r in range(4):
        seen = json.loads((tmp_path / f"reader-{r}.json").read_text())
        assert all(state in written for state in seen["seen"]), f"reader {r} saw a mixed version"
        assert len(seen["seen"]) == 3
    # Every rank put its own file, on this host's volume.
    assert store.versions("w") == [2]
    assert store.status()[volume.address]["files"] == 2


def test_a_binary_publishes_to_the_volumes(volume, tmp_path):
    """The standalone binary's --store ucx://... --publish KEY (2 ranks)."""
    from test_runner import compiled_step, start_state
    from test_training import batches

    exe = compiled_step("dp2")
    data = batches("mlp")[:5]
    files = {n: str(tmp_path / f"{n}.safetensors") for n in ("batches", "params", "state")}
    steps = exe._with_hyperparameters([tuple(b) for b in data], {"lr": [0.05] * len(data)})
    tdx.safetensors.save({f"{k}:input:{i}": x for k, b in enumerate(steps)
                          for i, x in enumerate(b)}, files["batches"])
    tdx.safetensors.save(start_state(), files["params"])
    store = Store([volume])
    done = subprocess.run(
        ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", exe.path, "--batches",
         files["batches"], "--steps", str(len(data)), "--params", files["params"],
         "--save-state", files["state"], "--store", store.path, "--publish", "mlp",
         "--publish-every", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # Published after steps 2, 4 and 5; the newest two kept.
    assert store.versions("mlp") == [1, 2]
    final = tdx.safetensors.load(files["state"])
    got = store.get("mlp")
    assert sorted(got) == sorted(k for k in final if not k.startswith("optimizer."))
    assert all(torch.equal(got[k], final[k]) for k in got)


def test_a_checkpoint_on_the_volumes_resumes_bitwise(volume):
    """runner.save to a key of a networked store (its version is the step,
    optimizer state included) and exe.start(params=...) from it: the resumed
    steps' losses are the uninterrupted run's, bitwise."""
    from test_runner import compiled_step, start_state
    from test_training import batches

    exe = compiled_step("dp2")
    data = batches("mlp")[:4]
    root = f"ucx://{volume.address}/ckpt"
    with exe.start(params=start_state()) as runner:
        for x, y in data[:2]:
            runner.train_step(x, y, lr=0.05)
        runner.save(root)
        straight = [runner.train_step(x, y, lr=0.05).item() for x, y in data[2:]]
    assert Store([volume]).versions("ckpt") == [2]
    assert any(n.startswith("optimizer.") for n in Store([volume]).tensors("ckpt"))
    with exe.start(params=root) as runner:
        assert runner.steps == 2
        resumed = [runner.train_step(x, y, lr=0.05).item() for x, y in data[2:]]
    assert resumed == straight
