"""A store only its job can use (docs/checkpoints.md, "A store only its job
can use"): a volume started with a job token refuses every request without
it, listens where --bind says, and survives malformed requests (a fuzz run)
with every stored version intact."""

import json
import os
import random
import socket
import subprocess
import time

import pytest
import torch

import tdx
from tdx import _C
from tdx.compile import _tool
from tdx.store import Store, start_volume

TOKEN = "job-7f3a9c0e5b1d"


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 48, generator=g), "b": torch.randn(48, generator=g),
            "steps": torch.tensor(seed)}


def same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_volume_with_a_job_token_refuses_any_other_request_and_changes_nothing(monkeypatch):
    """With the job's token, put/get/versions/delete work; without it or
    with another job's, every operation is refused with an error naming
    TDX_STORE_TOKEN, the volume logs why, and what it holds is unchanged."""
    monkeypatch.setenv("TDX_STORE_TOKEN", TOKEN)
    with start_volume(0, host="localhost") as volume:
        store = Store([volume])
        assert store.put("policy", state(1)) == 0
        assert same(store.get("policy"), state(1))
        before = store.status()[volume.address]

        attempts = [lambda: store.put("policy", state(2)), lambda: store.get("policy"),
                    lambda: store.versions("policy"), lambda: store.keys(),
                    lambda: store.delete("policy"), lambda: store.status()]
        for token, why in [(None, "no job token"), ("job-other", "not this volume's job token")]:
            if token is None:
                monkeypatch.delenv("TDX_STORE_TOKEN")
            else:
                monkeypatch.setenv("TDX_STORE_TOKEN", token)
            for attempt in attempts:
                with pytest.raises(tdx.CheckpointError, match=f"refused .*{why}.*TDX_STORE_TOKEN"):
                    attempt()
        monkeypatch.setenv("TDX_STORE_TOKEN", TOKEN)
        after = store.status()[volume.address]
        assert after["refused"] == 2 * len(attempts)
        assert {k: after[k] for k in ("keys", "files", "bytes", "committed", "received")} == \
            {k: before[k] for k in ("keys", "files", "bytes", "committed", "received")}
        assert store.versions("policy") == [0] and same(store.get("policy"), state(1))
        log = volume.log()
        assert log.count("it carries no job token") == len(attempts)
        assert log.count("a token that is not this volume's job token") == len(attempts)
        assert TOKEN not in log and "job-other" not in log


def test_the_token_may_be_a_file_the_variable_names(tmp_path, monkeypatch):
    """TDX_STORE_TOKEN=/path: the token is the file's first line (kept out
    of the environment a process listing shows); a file that cannot be read
    or holds no token is named."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with start_volume(0, host="localhost", token=str(token_file)) as volume:
        store = Store([volume])
        monkeypatch.setenv("TDX_STORE_TOKEN", TOKEN)      # the same token, given as text
        store.put("k", state(3))
        monkeypatch.setenv("TDX_STORE_TOKEN", str(token_file))
        assert same(store.get("k"), state(3))
        monkeypatch.setenv("TDX_STORE_TOKEN", str(tmp_path / "missing"))
        with pytest.raises(tdx.CheckpointError, match="TDX_STORE_TOKEN names the file .*missing"):
            store.versions("k")
        (tmp_path / "empty").write_text("\n")
        monkeypatch.setenv("TDX_STORE_TOKEN", str(tmp_path / "empty"))
        with pytest.raises(tdx.CheckpointError, match="first line is empty"):
            store.versions("k")
    # A volume without a token warns that anyone can reach it.
    monkeypatch.delenv("TDX_STORE_TOKEN")
    with start_volume(0, host="localhost") as open_volume:
        assert "warning: no job token" in open_volume.log()


def _other_address():
    """An IPv4 address of this host other than loopback, or None."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("10.255.255.255", 1))
        address = s.getsockname()[0]
        s.close()
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_bind_listens_on_that_address_only(monkeypatch):
    """--bind 127.0.0.1 serves on loopback; a client of the host's other
    address does not reach it (told so within TDX_STORE_TIMEOUT); a --bind
    that is no address of the host is named."""
    monkeypatch.setenv("TDX_STORE_TOKEN", TOKEN)
    with start_volume(0, bind="127.0.0.1") as volume:
        assert volume.address.startswith("127.0.0.1:")
        store = Store([volume])
        store.put("k", state(4))
        assert same(store.get("k"), state(4))
        other = _other_address()
        if other is not None:
            monkeypatch.setenv("TDX_STORE_TIMEOUT", "3")
            port = volume.address.rsplit(":", 1)[1]
            with pytest.raises(tdx.CheckpointError, match=f"{other}:{port}.*(unreachable|did not)"):
                Store(f"ucx://{other}:{port}").versions("k")
    bad = subprocess.run([_tool("tdx-volume"), "--port", "0", "--bind", "no-such-host.invalid"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "cannot listen on 'no-such-host.invalid'" in bad.stderr


def _malformed(rng, key, version, file, size, good_bytes):
    """A request (header text, payload) a client of this job would never
    send: each is refused by the volume."""
    token = {"token": TOKEN}
    kind = rng.randrange(9)
    if kind == 0:       # random bytes for a header
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200))).decode(
            "latin-1"), b""
    if kind == 1:       # a header that is JSON but not an object, or an unknown op
        return rng.choice(['[1, 2]', '"put"', '17', 'null',
                           json.dumps({"op": "format", "key": key, **token})]), b""
    if kind == 2:       # a field of the wrong type, or missing
        op = rng.choice(["put", "read", "commit", "drop"])
        q = {"op": op, "key": key, **token}
        q[rng.choice(["version", "below", "file"])] = rng.choice(["7", [1], {"a": 1}, None, 1.5])
        if op in ("put", "read") and "file" not in q:
            q["file"] = file
        return json.dumps(q), b""
    if kind == 3:       # a version out of range
        v = rng.choice([-1, -2 ** 40, 2 ** 53, 2 ** 62, 2 ** 63 - 1])
        op = rng.choice(["read", "put", "commit", "index", "begin"])
        q = {"op": op, "key": key, "file": file, **token}
        q["at" if op == "begin" else "version"] = v
        return json.dumps(q), good_bytes if op == "put" else b""
    if kind == 4:       # a put of a truncated or garbled file, onto a stored version
        data = bytearray(good_bytes[:rng.randrange(0, len(good_bytes))])
        if rng.random() < 0.3 and len(data) > 8:
            data[rng.randrange(8, len(data))] ^= 0xFF
            data = data[:8 + rng.randrange(0, 40)]
        return json.dumps({"op": "put", "key": key, "version": version, "file": file,
                           **token}), bytes(data)
    if kind == 5:       # byte ranges: not pairs, past the end, overflowing, too many
        ranges = rng.choice([
            b"\x01" * rng.randrange(1, 16),
            (size).to_bytes(8, "little") + (1).to_bytes(8, "little"),
            (2 ** 64 - 1).to_bytes(8, "little") + (2).to_bytes(8, "little"),
            (0).to_bytes(8, "little") + (2 ** 64 - 1).to_bytes(8, "little"),
            ((0).to_bytes(8, "little") + size.to_bytes(8, "little")) * 3,
        ])
        return json.dumps({"op": "read", "key": key, "version": version, "file": file,
                           **token}), ranges
    if kind == 6:       # a commit whose index is not an index
        index = rng.choice([b"", b"{", b"[]", b'{"files": 3}', bytes(range(256))])
        return json.dumps({"op": "commit", "key": key, "version": version + rng.randrange(0, 3),
                           **token}), index
    if kind == 7:       # a put of a file with no name, or a path
        return json.dumps({"op": "put", "key": key, "version": version,
                           "file": rng.choice(["", "../x", "a/b"]), **token}), good_bytes
    # kind 8: destructive requests without the token, or with another job's
    q = {"op": rng.choice(["delete", "drop", "put", "commit"]), "key": key,
         "version": version, "below": 2 ** 40, "file": file}
    if rng.random() < 0.5:
        q["token"] = "job-" + "".join(rng.choice("0123456789abcdef") for _ in range(12))
    return json.dumps(q), good_bytes


def test_a_volume_fuzzed_keeps_serving_and_loses_nothing(monkeypatch):
    """Random bytes on the port, and 600 requests no client would send
    (headers that do not parse, wrong types, versions and byte ranges out
    of range, truncated and garbled files put over a stored version,
    indexes that are not indexes, requests without the token): each is
    refused, the volume stays up, and both stored versions read back
    bitwise, their checksums checked."""
    monkeypatch.setenv("TDX_STORE_TOKEN", TOKEN)
    rng = random.Random(55)
    with start_volume(0, host="localhost") as volume:
        store = Store([volume])
        store.put("policy", state(10))
        store.put("policy", state(11))
        assert store.versions("policy") == [0, 1]
        header, index = _C.volume_request(
            volume.address, json.dumps({"op": "index", "key": "policy", "token": TOKEN}), b"")
        assert json.loads(header)["version"] == 1
        file, entry = next(iter(json.loads(index)["files"].items()))
        size = entry["size"]
        header, good = _C.volume_request(
            volume.address, json.dumps({"op": "read", "key": "policy", "version": 1,
                                        "file": file, "token": TOKEN}),
            (0).to_bytes(8, "little") + size.to_bytes(8, "little"))
        assert len(good) == size

        port = int(volume.address.rsplit(":", 1)[1])
        for _ in range(50):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 4096))))
        requests, refused = 600, 0
        for _ in range(requests):
            text, data = _malformed(rng, "policy", rng.choice([0, 1]), file, size, good)
            reply = json.loads(_C.volume_request(volume.address, text, data)[0])
            assert reply.get("code") in ("bad-request", "unauthorized"), (text[:200], reply)
            refused += 1
        print(f"fuzz: {50} connections of random bytes, {requests} malformed requests, "
              f"{refused} refused")
        time.sleep(0.5)
        assert volume.process.poll() is None
        status = store.status()[volume.address]
        assert status["malformed"] + status["refused"] == requests
        assert store.versions("policy") == [0, 1]
        assert same(store.get("policy", version=0), state(10))
        assert same(store.get("policy", version=1), state(11))
        # The file read whole again: the bytes before the fuzz.
        _, again = _C.volume_request(
            volume.address, json.dumps({"op": "read", "key": "policy", "version": 1,
                                        "file": file, "token": TOKEN}),
            (0).to_bytes(8, "little") + size.to_bytes(8, "little"))
        assert again == good
        # And it serves the job as before.
        store.put("policy", state(12))
        assert same(store.get("policy"), state(12))
