"""The examples run as shown: examples/gpt_2x2.py (part of the README's first
command) and examples/train_char_gpt.py."""

import json
import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "gpt_2x2.py")


def test_gpt_2x2_example():
    out = subprocess.run([sys.executable, EXAMPLE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "none with storage" in out.stdout
    # Megatron on 4 layers: two all_reduces per layer over "tp", nothing else.
    assert "communication per forward step on the (2, 2) mesh: 8 x all_reduce over tp; " \
        in out.stdout, out.stdout
    assert "func.func @forward(%arg0: tensor<4x32xi64>" in out.stdout
    assert "bitwise equal to eager construction: True" in out.stdout
    # The compiled binary on 4 ranks: the Megatron all_reduces moved bytes,
    # and the logits match eager (the example exits non-zero otherwise).
    assert "compiled and ran on 4 CPU ranks" in out.stdout
    assert "tdx: 4 ranks:" in out.stdout and " 0 bytes communicated" not in out.stdout


DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "demo.sh")


def _demo(**env):
    """scripts/demo.sh's lines after the build: from its first step's line
    (what ninja printed, whether it built or not, comes before)."""
    out = subprocess.run([DEMO], capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, TDX_SKIP_SETUP="1", **env))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("tdx-opt gpt2-tiny.mlir"))
    assert any(line.startswith("ninja: ") for line in lines[:first]), lines[:first]
    return lines[first:], out.stderr


def test_the_demo_prints_at_most_ten_lines_after_the_build_and_info_brings_the_ranks_back():
    quiet, _ = _demo(TDX_LOG="warn")
    assert len(quiet) <= 10, "\n".join(quiet)
    text = "\n".join(quiet)
    for found in ("parameters: 29 (1 tied)", "4 collective(s), 8192 bytes per rank",
                  "8 x all_reduce over tp", "tdx: 4 ranks: init",
                  "bitwise equal to eager construction: True"):
        assert found in text, (found, text)
    assert "rank 0:" not in text
    loud, err = _demo(TDX_LOG="info")
    assert len(loud) > len(quiet)
    for rank in range(4):
        assert f"rank {rank}:" in "\n".join(loud) + err, "\n".join(loud) + err


CHAR_GPT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_char_gpt.py")


def char_gpt(out, *args, nprocs=1):
    cmd = [sys.executable] + (["-m", "tdx.run", "-n", str(nprocs)] if nprocs > 1 else [])
    done = subprocess.run(cmd + [CHAR_GPT, "--steps", "30", "--warmup", "10", "--eval-every",
                                 "10", "--save-every", "15", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.load(open(os.path.join(out, "losses.json")))


def test_char_gpt_trains_alike_on_one_rank_and_two_and_resumes(tmp_path):
    # The example's loop on 1 rank (single controller), stopped at step 15
    # and resumed from its checkpoint, and under python3 -m tdx.run -n 2
    # (SPMD, data parallel) in one go: the same loss curve within 1e-5.
    char_gpt(tmp_path / "one", "--stop-at", "15")
    one = char_gpt(tmp_path / "one", "--resume")
    two = char_gpt(tmp_path / "two", nprocs=2)
    # (the stopped run also evaluated where it stopped, at 15)
    assert one["step"] == list(range(1, 31)) and one["eval_step"] == [10, 15, 20, 30]
    assert two["eval_step"] == [10, 20, 30]
    assert len(set(one["lr"])) > 20  # warmup and cosine: lr changes every step
    assert one["loss"][-1] < one["loss"][0] - 0.5  # it learns
    evals = dict(zip(one["eval_step"], one["eval"]))
    for a, b in zip(one["loss"] + [evals[s] for s in two["eval_step"]],
                    two["loss"] + two["eval"]):
        assert abs(a - b) <= 1e-5 * abs(a), (a, b)
    with open(tmp_path / "one" / "loss.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


RING = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ring_attention.py")


def test_ring_attention_example_matches_eager():
    out = subprocess.run([sys.executable, RING], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert out.stdout.count("ring attention on dp2 x cp2") == 3, out.stdout
