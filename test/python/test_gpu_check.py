"""The GPU check's bundle (scripts/gpu-check.sh bundle): produced here, and
its build half run with nvcc, so that the bundle never rots. Its run half
needs a GPU; what it can show without one is that the bundled Open MPI runs
relocated and a built binary reports the missing GPU clearly."""

import json
import os
import subprocess
import sys

import pytest
import torch

import tdx

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CUDA = os.path.exists(os.path.join(os.path.dirname(tdx.__file__), "..", "..", "lib",
                                   "libTdxRuntimeCUDA.a"))
# A forward on one rank and on tp2, a conv net, and whole training steps
# (forward, backward, update) of a transformer on tp2 and of a conv net.
PROGRAMS = ["gpt2-1", "llama-tp2", "resnet18-1", "llama-train-tp2", "resnet-tiny-train-1", "narrow-1",
            "bf16-mlp-1", "decoder-train-1", "gpt2-loop-tp2", "resnet-tiny-loop-dp2",
            "gpt2-bf16-train-1"]
# The generic backward ops (tdx/Runtime/cuda/AtenOps.def) each training
# program runs on CUDA.
BACKWARD_OPS = {
    "llama-train-tp2": ["embedding_dense_backward"],
    # Batch norm is per-channel sums and elementwise kernels
    # (tdx-expand-batch-norm), not ATen's op.
    "resnet-tiny-train-1": ["convolution_backward", "max_pool2d_with_indices",
                            "max_pool2d_with_indices_backward", "threshold_backward"],
    "decoder-train-1": ["embedding_dense_backward"],
    "gpt2-loop-tp2": ["embedding_dense_backward"],
    "gpt2-bf16-train-1": ["embedding_dense_backward", "_softmax_backward_data",
                          "native_layer_norm_backward"],
    "resnet-tiny-loop-dp2": ["convolution_backward", "max_pool2d_with_indices_backward"],
}
# First-class ops a program must run on CUDA's own kernels (not generic).
FIRST_CLASS = {"decoder-train-1": ["T::sdpa(", "T::sdpa_backward("]}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "bundle"
    done = subprocess.run([os.path.join(ROOT, "scripts", "gpu-check.sh"), "bundle", str(out),
                           "--programs", ",".join(PROGRAMS), "--offline"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gpu-check: bundle" in done.stdout
    return out


# Slow (45 s of CPU compiles for the expected outputs): with the nvcc build,
# TDX_SLOW=1 runs the bundle; the default suite keeps check.py's test.
@pytest.mark.slow
def test_bundle_holds_programs_expectations_runtime_and_mpi(bundle):
    manifest = json.load(open(bundle / "manifest.json"))
    assert [p["name"] for p in manifest["programs"]] == PROGRAMS
    for entry in manifest["programs"]:
        name, train = entry["name"], entry["kind"] in ("train", "loop")
        folder = bundle / "programs" / name
        for f in ("program.cu", "params.safetensors",
                  "batches.safetensors" if train else "in.safetensors",
                  "expected.eager.safetensors", "expected.cpu.safetensors"):
            assert (folder / f).exists(), (name, f)
        source = (folder / "program.cu").read_text()
        assert "__global__ void k0_kernel(tdx::kern::Iter it)" in source
        # A forward is first-class ops only; a training step's backward
        # runs generic ops of the CUDA list (tdx/Runtime/cuda/AtenOps.def).
        if train:
            for op in BACKWARD_OPS[name]:
                assert f'callAten("aten::{op}"' in source, (name, op)
        else:
            assert "callAten" not in source, name
        for call in FIRST_CLASS.get(name, []):
            assert call in source, (name, call)
        if name.startswith("resnet-tiny"):
            assert "native_batch_norm" not in source, name
        if name == "gpt2-bf16-train-1":
            # Mixed precision: the forward and backward in bf16, checked
            # at its own tolerances against eager with the same casts.
            assert "T::kBFloat16" in source and entry["tolerance"] == 2e-2
            assert json.load(open(folder / "precision.json"))["param_dtype"] == "bfloat16"
        if entry["kind"] == "loop":
            # The step takes its lr; gpt2's has an evaluation entry.
            spec = json.load(open(folder / "loop.json"))
            assert len(spec["lrs"]) == entry["steps"] and spec["lrs"][0] > spec["lrs"][-1]
            assert ("evaluate" in source) == name.startswith("gpt2"), name
    # The training step's expectations: eager's loss per step and final
    # parameters, and the CPU binary's, within the tolerances run.sh checks.
    train = bundle / "programs" / "llama-train-tp2"
    eager = tdx.safetensors.load(str(train / "expected.eager.safetensors"))
    cpu = tdx.safetensors.load(str(train / "expected.cpu.safetensors"))
    assert sorted(eager) == sorted(cpu)
    assert {k for k in eager if ":output:" in k} == {f"{k}:output:0" for k in range(5)}
    for key, want in eager.items():
        rel = ((cpu[key] - want).norm() / want.norm()).item()
        assert rel < (1e-4 if key.startswith("state:") else 1e-5), key
    # A loop's expectations: eager's loop and tdx's CPU runner driven by it.
    loop = bundle / "programs" / "gpt2-loop-tp2"
    eager = tdx.safetensors.load(str(loop / "expected.eager.safetensors"))
    cpu = tdx.safetensors.load(str(loop / "expected.cpu.safetensors"))
    assert {k for k in eager if ":eval:" in k} == {f"{k}:eval:0" for k in range(4)}
    assert set(eager) <= set(cpu)
    # dp2's batch norm: the per-channel sums' collectives are in the source.
    dp = (bundle / "programs" / "resnet-tiny-loop-dp2" / "program.cu").read_text()
    assert "llGather(" in dp and "llReduce(" in dp
    assert (bundle / "runtime" / "lib" / "cuda" / "Ops.cu").exists()
    assert (bundle / "runtime" / "lib" / "Serve.cpp").exists()
    assert (bundle / "runtime" / "lib" / "Json.cpp").exists()
    # The runtime needs no LLVM: nothing under it includes it.
    for d, _, files in os.walk(bundle / "runtime"):
        for f in files:
            assert "llvm/" not in open(os.path.join(d, f)).read(), f
    assert (bundle / "mpi" / "usr" / "bin" / "mpirun").exists()
    assert any("libopenmpi3" in p for p in manifest["mpi"])
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(bundle) for f in fs
               if not os.path.islink(os.path.join(d, f)))
    assert size < 60 * 2**20


# slow: nvcc builds the bundle's whole CUDA runtime from its copied sources
# (the CMake build compiles the same sources every build) and its programs,
# about 100 s of both cores. It runs with TDX_SLOW=1, and whenever the GPU
# check runs on a GPU machine (scripts/gpu-check.sh).
@pytest.mark.slow
@pytest.mark.skipif(not CUDA, reason="tdx was built without nvcc")
def test_bundle_builds_with_nvcc_and_its_mpi_runs_relocated(bundle):
    done = subprocess.run(["bash", str(bundle / "run.sh"), "--compile-only"], capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert f"gpu-check: compile: {len(PROGRAMS)} programs built, 0 failures" in done.stdout
    binary = bundle / "build" / "gpt2-1"
    libs = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    assert "libnccl" in libs and "libcublas" in libs, libs
    assert str(bundle / "mpi") in libs, libs  # the bundle's libmpi, not the system's
    folder = bundle / "programs" / "gpt2-1"
    run = subprocess.run(
        ["bash", "-c", f". {bundle}/env.sh && mpirun -np 1 {binary} --params "
                       f"{folder}/params.safetensors --inputs {folder}/in.safetensors "
                       f"--outputs {bundle}/out.safetensors"],
        capture_output=True, text=True, timeout=120)
    if run.returncode != 0:  # no GPU here: a clear error, not a crash
        assert "no CUDA device is visible to rank 0" in run.stderr, run.stderr[-3000:]


def test_compare_checks_final_state_at_its_own_tolerance(tmp_path):
    # check.py compare: losses at --tolerance, the final state at
    # --state-tolerance (1e-4 by default).
    want = {"0:output:0": torch.tensor(2.0), "state:w": torch.ones(100)}
    tdx.safetensors.save(want, str(tmp_path / "expected.eager.safetensors"))
    tdx.safetensors.save({"0:output:0": torch.tensor(2.0)}, str(tmp_path / "out.safetensors"))
    tdx.safetensors.save({"w": torch.ones(100) * (1 + 5e-4)}, str(tmp_path / "state.safetensors"))
    check = os.path.join(ROOT, "scripts", "gpu-check", "check.py")

    def compare(*extra):
        return subprocess.run([sys.executable, check, "compare", str(tmp_path),
                               str(tmp_path / "out.safetensors"), "--state",
                               str(tmp_path / "state.safetensors"), *extra],
                              capture_output=True, text=True, timeout=120)

    off = compare()
    assert off.returncode == 1 and "final state 5.00e-04" in off.stdout, off.stdout + off.stderr
    assert compare("--state-tolerance", "1e-3").returncode == 0
