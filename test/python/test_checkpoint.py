"""Sharded checkpoints (tdx.checkpoint, binaries' --save/--resume) and the
tensor store (tdx.store, --publish, --params store:KEY): every
layout saved is read back bitwise into every other, a training run resumed
on another mesh continues the loss curve, files are valid safetensors by an
independent reader, a corrupt or half-written checkpoint is caught, and a
store reader sees whole versions only."""

import functools
import json
import os
import re
import struct

import pytest
import torch

import tdx

from test_training import OPTIMIZERS, batches, mlp, mlp_loss


class Net(torch.nn.Module):
    """Sizes that split unevenly over 4 (10 -> 3, 3, 3, 1; 5 -> 2, 2, 1, 0)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 10)
        self.fc2 = torch.nn.Linear(10, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


S0, S1, R = tdx.Shard(0), tdx.Shard(1), tdx.Replicate()
# name -> (mesh shape, placements of fc1.weight, fc1.bias, fc2.weight, fc2.bias)
LAYOUTS = {
    "1": ((1,), [[R], [R], [R], [R]]),
    "shard0": ((2,), [[S0], [S0], [S0], [S0]]),
    "shard1": ((2,), [[S1], [R], [S1], [R]]),
    "2d": ((2, 2), [[S0, S1], [S0, R], [S1, S0], [R, S0]]),
    "uneven4": ((4,), [[S0], [S0], [S0], [S0]]),
    "three": ((3,), [[S1], [R], [S1], [R]]),
}
NAMES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


@functools.lru_cache(maxsize=None)
def net_binary(layout):
    shape, placements = LAYOUTS[layout]
    prog = tdx.trace(tdx.deferred_init(Net), torch.randn(3, 6))
    mesh = tdx.init_device_mesh("cpu", shape, [f"a{i}" for i in range(len(shape))])
    for name, p in zip(NAMES, placements):
        prog.annotate(name, mesh, p)
    prog.partition()
    return tdx.compile(prog)


def weights(seed):
    g = torch.Generator().manual_seed(seed)
    return {"fc1.weight": torch.randn(10, 6, generator=g), "fc1.bias": torch.randn(10, generator=g),
            "fc2.weight": torch.randn(5, 10, generator=g), "fc2.bias": torch.randn(5, generator=g)}


def assert_bitwise(got, want):
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """layout -> (checkpoint root, the global weights it saved)."""
    out = {}
    for i, layout in enumerate(LAYOUTS):
        root = tmp_path_factory.mktemp(f"ckpt-{layout}")
        w = weights(i)
        net_binary(layout).save_init(root, params=w)
        out[layout] = (root, w)
    return out


@pytest.mark.parametrize("source", list(LAYOUTS))
def test_every_layout_loads_every_other_bitwise(saved, source):
    root, want = saved[source]
    # Python reads the global tensors...
    assert_bitwise(tdx.checkpoint.load(root), want)
    assert tdx.checkpoint.verify(root) > 0
    for target in LAYOUTS:
        # ...and each binary reads its own boxes of them (a rank reads
        # exactly the bytes of its boxes).
        exe = net_binary(target)
        assert_bitwise(exe.materialize(params=str(root)), want)
        shape, placements = LAYOUTS[target]
        for name, p in zip(NAMES, placements):
            for coords in (tuple(c) for c in torch.cartesian_prod(
                    *[torch.arange(s) for s in shape]).reshape(-1, len(shape)).tolist()):
                box = tdx.checkpoint.load_shard(root, name, shape, p, coords)
                local = want[name]
                for axis, placement in enumerate(p):
                    if isinstance(placement, tdx.Shard):
                        local = tdx.slice(local, shape[axis], placement.dim)[coords[axis]]
                assert torch.equal(box, local), (name, coords)


def test_each_rank_reads_only_its_boxes(saved):
    root, want = saved["2d"]
    exe = net_binary("uneven4")
    exe.run(torch.randn(3, 6), params=str(root), verbose=True)
    reads = re.findall(r"rank (\d): read (\d+) bytes of \S+ for (\d+) bytes of state", exe.last_log)
    assert len(reads) == 4
    for rank, read, needed in reads:
        assert int(read) == int(needed), f"rank {rank} read {read} bytes for {needed}"
    assert sum(int(r[2]) for r in reads) == sum(t.numel() * 4 for t in want.values())


def test_replicated_boxes_are_written_once_and_spread(saved):
    root, _ = saved["2d"]
    step = tdx.checkpoint.latest(root)
    with open(os.path.join(step, "tdx.index.json")) as f:
        index = json.load(f)
    writers = set()
    for name, entry in index["tensors"].items():
        cells = sum(torch.Size(c["shape"]).numel() for c in entry["chunks"])
        assert cells == torch.Size(entry["shape"]).numel(), name
        writers.update(c["file"] for c in entry["chunks"])
    # fc1.bias [S0, R] lives on ranks (i, 0) and (i, 1): each half is
    # written once; so is each half of fc2.bias [R, S0]; all four ranks write.
    assert len(index["tensors"]["fc1.bias"]["chunks"]) == 2
    assert len(index["tensors"]["fc2.bias"]["chunks"]) == 2
    assert writers == {f"rank-{r:05d}.safetensors" for r in range(4)}


def parse_safetensors(path, align=64):
    """An independent reader, from the format's specification: u64 little
    endian header size N, N bytes of JSON, then the data; each entry's
    data_offsets are relative to the data, which they cover without gaps.
    The data starts `align`-aligned (tdx's writer: 64; the spec: 8)."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    assert raw[8 + n - 1:8 + n] in (b"}", b" ")
    data = raw[8 + n:]
    sizes = {"F32": 4, "F64": 8, "I64": 8, "I32": 4, "F16": 2, "BF16": 2, "BOOL": 1}
    kinds = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
             "BOOL": torch.bool}
    spans, out = [], {}
    for name, e in header.items():
        if name == "__metadata__":
            assert all(isinstance(v, str) for v in e.values())
            continue
        begin, end = e["data_offsets"]
        assert end - begin == torch.Size(e["shape"]).numel() * sizes[e["dtype"]]
        spans.append((begin, end))
        buf = bytearray(data[begin:end])
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(kinds[e["dtype"]]).reshape(e["shape"])
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert (8 + n) % align == 0
    return header, out


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def test_files_are_safetensors_and_the_index_checksums_them(saved):
    assert crc32c(b"123456789") == 0xE3069283
    root, want = saved["uneven4"]
    step = tdx.checkpoint.latest(root)
    index = json.load(open(os.path.join(step, "tdx.index.json")))
    assert index["format"] == "tdx.checkpoint" and index["step"] == 0
    pieces = {name: torch.zeros_like(t) for name, t in want.items()}
    for file, info in index["files"].items():
        raw = open(os.path.join(step, file), "rb").read()
        assert len(raw) == info["size"] and crc32c(raw) == info["crc32c"]
        header, tensors = parse_safetensors(os.path.join(step, file))
        assert header["__metadata__"] == {"tdx.checkpoint": index["id"], "tdx.file": file}
        for name, t in tensors.items():
            chunk, = [c for c in index["tensors"][name]["chunks"] if c["file"] == file]
            assert list(t.shape) == chunk["shape"]
            assert crc32c(t.contiguous().view(torch.uint8).reshape(-1).tolist()) == chunk["crc32c"]
            region = pieces[name]
            for d, (o, s) in enumerate(zip(chunk["offset"], chunk["shape"])):
                region = region.narrow(d, o, s)
            region.copy_(t)
    assert_bitwise(pieces, want)


def test_hugging_face_export_loads_and_equals_the_state(saved, tmp_path):
    root, want = saved["2d"]
    index = tdx.checkpoint.export_hf(root, tmp_path / "hf", max_shard_size=300)
    meta = json.load(open(index))
    files = sorted(set(meta["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert meta["metadata"]["total_size"] == sum(t.numel() * 4 for t in want.values())
    assert_bitwise(tdx.checkpoint.load(tmp_path / "hf"), want)
    for f in files:  # as Hugging Face writes them: {"format": "pt"}
        header, _ = parse_safetensors(tmp_path / "hf" / f, align=8)
        assert header["__metadata__"] == {"format": "pt"}
    # A model binary takes the export as --params.
    assert_bitwise(net_binary("shard1").materialize(params=str(tmp_path / "hf")), want)


def test_slice_has_torch_chunk_pieces_and_always_k_of_them():
    x = torch.arange(10).reshape(5, 2)
    pieces = tdx.slice(x, 4, dim=0)
    assert [p.shape[0] for p in pieces] == [2, 2, 1, 0]
    assert torch.equal(torch.cat(pieces), x)
    for a, b in zip(pieces, torch.chunk(x, 4)):
        assert torch.equal(a, b)
    assert [p.shape[1] for p in tdx.slice(x, 2, dim=-1)] == [1, 1]
    with pytest.raises(ValueError, match="num_partitions must be a positive int"):
        tdx.slice(x, 0)


# --- training: save, resume on another mesh ---------------------------------

MLP_PLAN = {"0": tdx.ColwiseParallel(), "2": tdx.RowwiseParallel()}
TRAIN_MESHES = {"1": ((1,), ("dp",), None, {}), "2x2": ((2, 2), ("dp", "tp"), "dp", MLP_PLAN),
                "4x1": ((4, 1), ("dp", "tp"), "dp", MLP_PLAN)}


@functools.lru_cache(maxsize=None)
def train_binary(mesh, zero=0):
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    optimizer = OPTIMIZERS["adamw"](deferred.parameters())
    prog = tdx.trace_train_step(deferred, optimizer, mlp_loss, *batches("mlp")[0])
    shape, axes, dp, plan = TRAIN_MESHES[mesh]
    if dp:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), plan, data_parallel=dp,
                        zero=zero)
    return tdx.compile(prog)


@pytest.fixture(scope="module")
def uninterrupted():
    return train_binary("2x2", 3).train(batches("mlp"), seed=3)


@pytest.mark.parametrize("target", ["4x1", "1"])
def test_resumed_run_continues_the_loss_curve_on_another_mesh(uninterrupted, target, tmp_path):
    losses, final = uninterrupted
    data = batches("mlp")
    exe = train_binary("2x2", 3)
    first, _ = exe.train(data[:4], seed=3, checkpoint=tmp_path, save_every=2)
    assert first == losses[:4]
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "step-00000002", "step-00000004"]
    rest, state = train_binary(target).train(data, checkpoint=tmp_path, save_every=4, resume=True)
    assert train_binary(target).first_step == 4 and len(rest) == len(data) - 4
    for k, (got, want) in enumerate(zip(rest, losses[4:])):
        assert abs(got - want) <= 1e-6 * abs(want), f"step {k + 4}: {got} vs {want}"
    for name, t in final.items():
        assert torch.allclose(state[name], t, rtol=1e-5, atol=1e-7), name
    # The resumed run saved its own steps, keeping two.
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "step-00000008", f"step-{len(data):08d}"]


def test_resume_without_a_checkpoint_starts_fresh(uninterrupted, tmp_path):
    losses, _ = uninterrupted
    got, _ = train_binary("2x2", 3).train(batches("mlp")[:2], seed=3, checkpoint=tmp_path / "new",
                                         resume=True)
    assert got == losses[:2]
    assert tdx.checkpoint.step_of(tmp_path / "new") == 2


# --- bad input ----------------------------------------------------------------


@pytest.fixture
def copy_of(saved, tmp_path):
    import shutil

    def make(layout="2d"):
        root, want = saved[layout]
        dst = tmp_path / "copy"
        shutil.copytree(root, dst)
        return dst, tdx.checkpoint.latest(dst), want
    return make


def test_a_flipped_byte_is_caught_naming_file_tensor_and_offset(copy_of):
    root, step, _ = copy_of()
    path = os.path.join(step, "rank-00001.safetensors")
    raw = bytearray(open(path, "rb").read())
    raw[-3] ^= 0x10
    open(path, "wb").write(raw)
    with pytest.raises(tdx.CheckpointError,
                       match=r"checksum mismatch in .*rank-00001.safetensors: tensor '[\w.]+', "
                             r"the chunk at \[[\d, ]+\] \(file bytes \d+ to \d+\)"):
        tdx.checkpoint.load(root)
    with pytest.raises(tdx.CheckpointError, match="checksum mismatch"):
        tdx.checkpoint.verify(root)
    with pytest.raises(tdx.TdxError, match="checksum mismatch in .*rank-00001"):
        net_binary("2d").materialize(params=str(root))


def test_a_truncated_file_is_caught(copy_of):
    root, step, _ = copy_of()
    path = os.path.join(step, "rank-00002.safetensors")
    os.truncate(path, os.path.getsize(path) - 4)
    with pytest.raises(tdx.CheckpointError, match=r"rank-00002.safetensors has \d+ bytes but the "
                                                  r"index says \d+ \(truncated or replaced\)"):
        tdx.checkpoint.load(root)


def test_a_missing_file_is_caught(copy_of):
    root, step, _ = copy_of()
    os.remove(os.path.join(step, "rank-00003.safetensors"))
    with pytest.raises(tdx.CheckpointError, match="file rank-00003.safetensors is missing"):
        tdx.checkpoint.load(root)
    with pytest.raises(tdx.TdxError, match="file rank-00003.safetensors is missing"):
        net_binary("1").materialize(params=str(root))


def test_swapped_files_are_caught(copy_of):
    root, step, _ = copy_of("shard0")
    a, b = (os.path.join(step, f"rank-0000{r}.safetensors") for r in (0, 1))
    os.rename(a, a + ".x")
    os.rename(b, a)
    os.rename(a + ".x", b)
    with pytest.raises(tdx.CheckpointError, match=r"rank-0000[01].safetensors (has \d+ bytes but "
                                                  r"the index says|is not the file the index)"):
        tdx.checkpoint.load_shard(root, "fc1.weight", (2,), [tdx.Shard(0)], (0,))


def test_a_file_of_the_same_size_from_another_checkpoint_is_caught(tmp_path):
    tdx.checkpoint.save(weights(1), tmp_path / "a")
    tdx.checkpoint.save(weights(2), tmp_path / "b")
    file = "step-00000000/rank-00000.safetensors"
    os.replace(tmp_path / "b" / file, tmp_path / "a" / file)
    with pytest.raises(tdx.CheckpointError, match=r"rank-00000.safetensors is not the file the "
                                                  r"index names .* copied from another checkpoint"):
        tdx.checkpoint.load(tmp_path / "a", names=["fc2.bias"])


def test_a_corrupt_index_and_a_bad_latest_are_caught(copy_of):
    root, step, _ = copy_of()
    index = os.path.join(step, "tdx.index.json")
    text = open(index).read()
    open(index, "w").write(text[:len(text) // 2])
    with pytest.raises(tdx.CheckpointError, match="tdx.index.json is corrupt"):
        tdx.checkpoint.load(root)
    open(os.path.join(root, "LATEST"), "w").write("step-00000099\n")
    with pytest.raises(tdx.CheckpointError, match="LATEST names 'step-00000099', which is not a "
                                                  "committed checkpoint"):
        tdx.checkpoint.load(root)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        tdx.checkpoint.load(root / "nowhere")


def test_load_shard_and_resume_refuse_what_does_not_fit(saved, tmp_path):
    root, _ = saved["1"]
    with pytest.raises(tdx.CheckpointError, match="2 placements for a mesh of 1 axes"):
        tdx.checkpoint.load_shard(root, "fc1.weight", (2,), [S0, S1], (0,))
    with pytest.raises(tdx.CheckpointError, match="not Partial"):
        tdx.checkpoint.load_shard(root, "fc1.weight", (2,), [tdx.Partial()], (0,))
    with pytest.raises(tdx.CheckpointError, match="has no tensor 'nope'"):
        tdx.checkpoint.load_shard(root, "nope", (2,), [S0], (0,))
    with pytest.raises(tdx.CheckpointError, match="coordinate 2 is outside mesh axis 0"):
        tdx.checkpoint.load_shard(root, "fc1.weight", (2,), [S0], (2,))
    # A forward program's checkpoint is not a training run's.
    with pytest.raises(tdx.TdxError, match=r"has no '[\w.]+': it was saved by another program"):
        train_binary("1").train(batches("mlp")[:2], checkpoint=root, resume=True)


# --- crash safety ---------------------------------------------------------------

CRASH_STEPS = 12
# About how long the 12 saves of a run take here (kills land in that span).
SAVES_SECONDS = 0.12


@pytest.fixture(scope="module")
def reference_steps(tmp_path_factory):
    """Every step's state of an uninterrupted run (all checkpoints kept)."""
    root = tmp_path_factory.mktemp("reference")
    train_binary("2x2", 3).train(batches("mlp")[:1] * CRASH_STEPS, seed=3, checkpoint=root,
                                 save_every=1, keep=0)
    return {int(d[5:]): tdx.checkpoint.load(root / d)
            for d in os.listdir(root) if d.startswith("step-")}


def rank_pids(binary, launcher):
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == launcher:
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].decode(errors="replace") == binary:
            pids.append(int(pid))
    return pids


def temporaries(root):
    """(name, inode) of the temporary step directories of saves under way."""
    out = set()
    for n in os.listdir(root) if os.path.isdir(root) else []:
        if n.startswith(".step-"):
            try:
                out.add((n, os.stat(os.path.join(root, n)).st_ino))
            except FileNotFoundError:
                pass
    return out


def crash_trial(rng, exe, batch_file, root, timeout=60):
    """Starts a 4-rank run that saves every step, SIGKILLs one rank or all of
    them at a random time, and returns whether a save was under way (a
    temporary step directory was left)."""
    import signal
    import subprocess
    import time
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "4", exe.path,
           "--batches", batch_file, "--steps", str(CRASH_STEPS), "--save", str(root),
           "--save-every", "1", "--save-keep", "3", "--seed", "3"]
    if os.path.exists(os.path.join(root, "LATEST")):
        cmd[cmd.index("--seed"):cmd.index("--seed") + 2] = ["--resume", str(root)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    start = time.monotonic()
    # Wait until the first save of this run began (a temporary directory of
    # its own appeared) or the run ended, then kill at once (in the middle
    # of that save, on any machine) or at a random moment of its saving.
    stale = temporaries(root)
    while not temporaries(root) - stale and proc.poll() is None:
        time.sleep(0.001)
    if rng.random() < 0.5:
        time.sleep(rng.uniform(0.0, SAVES_SECONDS))
    pids = rank_pids(exe.path, proc.pid)
    victims = pids if rng.random() < 0.5 else pids[:1]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"a run that lost {len(victims)} rank(s) hung "
                             f"{time.monotonic() - start:.0f} s")
    return bool(temporaries(root) - stale)


def check_committed(root, reference):
    """Whatever is visible is committed, complete and bitwise the reference."""
    if not os.path.isdir(root):
        return []
    visible = sorted(d for d in os.listdir(root) if d.startswith("step-"))
    for d in visible:
        state = tdx.checkpoint.load(root / d)
        tdx.checkpoint.verify(root / d)
        assert set(state) == set(reference[int(d[5:])])
        for name, t in state.items():
            assert torch.equal(t, reference[int(d[5:])][name]), (d, name)
    if visible:
        latest = tdx.checkpoint.latest(root)
        assert os.path.basename(latest) in visible
    return visible


def run_crash_trials(trials, reference, tmp_path):
    import random
    rng = random.Random(1234)
    exe = train_binary("2x2", 3)
    batch_file = str(tmp_path / "batches.safetensors")
    tdx.safetensors.save({f"{k}:input:{i}": x for k in range(CRASH_STEPS)
                          for i, x in enumerate(batches("mlp")[0])}, batch_file)
    root = tmp_path / "ckpt"
    during_save, newest = 0, -1
    for _ in range(trials):
        during_save += crash_trial(rng, exe, batch_file, root)
        visible = check_committed(root, reference)
        if visible:
            step = int(os.path.basename(tdx.checkpoint.latest(root))[5:])
            # The last committed step never goes back.
            assert step >= newest
            newest = step
        if newest == CRASH_STEPS:
            import shutil
            shutil.rmtree(root)
            newest = -1
    return during_save


def test_sigkill_during_saves_never_loses_the_committed_checkpoint(reference_steps, tmp_path):
    """10 runs killed at random (one rank or all): the committed checkpoint
    always loads bitwise, a new one is complete or invisible; the killed
    runs end with an error instead of hanging, and resume from the newest."""
    during_save = run_crash_trials(10, reference_steps, tmp_path)
    print(f"{during_save} of 10 kills hit a save under way")


@pytest.mark.slow
def test_sigkill_during_saves_50_trials(reference_steps, tmp_path):
    # Half the kills land the moment a save's temporary directory appears,
    # so a save is under way in most of those whatever the machine's speed.
    during_save = run_crash_trials(50, reference_steps, tmp_path)
    assert during_save >= 5, f"only {during_save} kills hit a save under way"


def test_python_saves_commit_steps_and_keep_the_newest(tmp_path):
    root = tmp_path / "ckpt"
    for i in range(4):
        assert tdx.checkpoint.save(weights(i), root, keep=2).endswith(f"step-{i:08d}")
    assert sorted(os.listdir(root)) == ["LATEST", "step-00000002", "step-00000003"]
    assert_bitwise(tdx.checkpoint.load(root), weights(3))
    assert_bitwise(tdx.checkpoint.load(root / "step-00000002"), weights(2))
    # Saving a step again replaces it whole (LATEST names it throughout).
    tdx.checkpoint.save(weights(9), root, step=3)
    assert sorted(os.listdir(root)) == ["LATEST", "step-00000002", "step-00000003"]
    assert_bitwise(tdx.checkpoint.load(root), weights(9))
    with pytest.raises(TypeError, match="state_dict\\['x'\\] is a int, not a tensor"):
        tdx.checkpoint.save({"x": 1}, root)
    with pytest.raises(tdx.CheckpointError, match="cannot store dtype"):
        tdx.checkpoint.save({"x": torch.zeros(2, dtype=torch.complex32)}, root)
    assert_bitwise(tdx.checkpoint.load(root), weights(9))


# --- tensor store -----------------------------------------------------------------


def test_two_rank_producer_publishes_and_a_three_rank_consumer_gets_its_boxes(tmp_path):
    store = tdx.store.Store(tmp_path / "store")
    want = weights(7)
    net_binary("shard0").publish(store, "net", params=want)
    net_binary("shard0").publish(store, "net", params=weights(8))
    assert store.keys() == ["net"] and store.versions("net") == [0, 1]
    # A version holds the parameters the producer's ranks wrote, nothing else.
    assert_bitwise(store.get("net", version=0), want)
    assert_bitwise(store.get("net"), weights(8))
    # The consumer binary on 3 ranks with another layout reads its boxes.
    assert_bitwise(net_binary("three").materialize(params="store:net", store=store), weights(8))
    shape, placements = LAYOUTS["three"]
    for c in range(3):
        boxes = store.get("net", mesh=shape, placements=dict(zip(NAMES, placements)),
                          coords=(c,))
        for name, p in zip(NAMES, placements):
            local = weights(8)[name]
            if isinstance(p[0], tdx.Shard):
                local = tdx.slice(local, 3, p[0].dim)[c]
            assert torch.equal(boxes[name], local), (name, c)
    store.delete("net")
    assert store.keys() == [] and not store.exists("net")
    with pytest.raises(KeyError, match="has no key 'net'"):
        store.get("net")


def test_training_publishes_parameters_without_optimizer_state(tmp_path):
    exe = train_binary("1")
    _, final = exe.train(batches("mlp")[:3], store=tmp_path, publish="policy", publish_every=2)
    store = tdx.store.Store(tmp_path)
    assert store.versions("policy") == [0, 1]
    got = store.get("policy")
    assert set(got) == {k for k in final if not k.startswith("optimizer.")}
    assert_bitwise(got, {k: final[k] for k in got})


def test_a_reader_racing_a_writer_sees_whole_versions(tmp_path):
    import threading
    import time
    store = tdx.store.Store(tmp_path)
    store.put("w", {"a": torch.zeros(256, 1024), "b": torch.zeros(1024)})
    stop, seen, errors = threading.Event(), [], []

    def write():
        # Each version is put while the readers go on reading, and the next
        # once a reader has seen it (or 10 s passed): the readers overlap
        # every put, however the threads are scheduled.
        for v in range(1, 30):
            store.put("w", {"a": torch.full((256, 1024), float(v)), "b": torch.full((1024,), float(v))},
                      keep=2)
            deadline = time.monotonic() + 10
            while v not in seen and not stop.is_set() and time.monotonic() < deadline:
                time.sleep(0.001)
        stop.set()

    def read():
        try:
            while not stop.is_set():
                got = store.get("w")
                values = {float(got["a"][0, 0]), float(got["b"][-1])}
                assert len(values) == 1 and bool((got["a"] == got["b"][0]).all()), values
                seen.append(values.pop())
        except Exception as e:  # reported below
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert set(range(1, 30)) <= set(seen), "the readers did not see every version"
    assert store.versions("w") == [28, 29]


def test_store_refuses_bad_keys_and_values(tmp_path):
    store = tdx.store.Store(tmp_path)
    with pytest.raises(tdx.CheckpointError, match="store key '../x' is not valid"):
        store.put("../x", torch.zeros(1))
    # Any picklable value beside tensors is stored (TorchStore's API); what
    # cannot be pickled is named.
    assert store.put("list", [1, torch.ones(2), {"a": "b"}]) == 0
    got = store.get("list")
    assert got[0] == 1 and torch.equal(got[1], torch.ones(2)) and got[2] == {"a": "b"}
    with pytest.raises(tdx.CheckpointError, match="cannot be pickled"):
        store.put("k", [lambda: 0])
    assert not store.exists("k")
    assert store.put("k", torch.arange(3)) == 0
    assert torch.equal(store.get("k"), torch.arange(3))
    with pytest.raises(KeyError, match="key 'k' has no version 5; it has \\[0\\]"):
        store.get("k", version=5)
    with pytest.raises(tdx.CheckpointError, match="give mesh, placements and coords together"):
        store.get("k", mesh=(2,))
    with pytest.raises(tdx.TdxError, match="no tensor store given for key 'k'"):
        net_binary("1").materialize(params="store:k")
