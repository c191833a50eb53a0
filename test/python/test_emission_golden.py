"""What the compiler makes of the bench GPT training step (bench/training:
examples/gpt_2x2.py's GPT, AdamW, the Megatron plan with data parallelism
on a 2x2 mesh, and with ZeRO-3 on dp2), held against a committed record:
its collectives (comm_report: kind, axes, group, bytes) and, per runtime
callee, how many calls the emitted C++ makes (ATen ops by schema, the
runtime's tensor functions, collectives, fused kernels).

Refactors of the passes and the emitters must leave both unchanged; a
change that means to change them regenerates the record with
TDX_UPDATE_GOLDEN=1 and says why in its commit."""

import collections
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.nn.functional as F

import tdx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from common import BATCH, GPT_CONFIG as CONFIG, SEQ  # noqa: E402
from gpt_2x2 import GPT, MEGATRON_PLAN  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "bench_gpt_train_step.json")
# bench/training/bench_training.py's model, optimizer, batch and plan.
LAYOUTS = {"2x2": ((2, 2), ("dp", "tp"), 0), "dp2-zero3": ((2,), ("dp",), 3)}


def loss_fn(m, ids, targets):
    logits = m(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def record(layout):
    shape, axes, zero = LAYOUTS[layout]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(lambda: GPT(**CONFIG))
    optimizer = torch.optim.AdamW(deferred.parameters(), lr=1e-3, weight_decay=0.1, foreach=False)
    ids = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    prog = tdx.trace_train_step(deferred, optimizer, loss_fn, ids, ids)
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes),
                    MEGATRON_PLAN if "tp" in axes else {}, data_parallel="dp", zero=zero)
    collectives = collections.Counter(
        f"{c['kind']} {','.join(c['mesh_axes'])} x{c['group_size']} {c['bytes']} B"
        for c in prog.comm_report())
    # The pipeline tdx-compile runs, then the emitter, as tdx-compile does.
    partitioned = prog.copy().run_pipeline("tdx-place").run_pipeline("tdx-spmd")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "step.mlir")
        with open(path, "w") as f:
            f.write(partitioned.mlir)
        translate = os.path.join(os.path.dirname(tdx.__file__), "..", "..", "bin",
                                 "tdx-translate")
        source = subprocess.run([translate, "--tdx-to-cpp", path], capture_output=True,
                                text=True, check=True).stdout
    def count(text):
        calls = collections.Counter()
        calls.update(f"callAten {m}" for m in re.findall(r'callAten\("([\w:.]+)"', text))
        calls.update(f"T::{m}" for m in re.findall(r"\bT::(\w+)\(", text))
        calls.update(f"ctx.{m}" for m in re.findall(r"\bctx\.(\w+)\(", text))
        calls["fused kernels"] += len(re.findall(r"= elementwise\(", text))
        return calls

    # Parts that repeat share one function (shareParts): its calls count
    # once per part that calls it.
    shared = {m.group(1): count(m.group(0)) for m in re.finditer(
        r"static std::vector<T::Tensor> (\w+_shared\d+)\(.*?\n\}\n", source, re.S)}
    rest = re.sub(r"static std::vector<T::Tensor> \w+_shared\d+\(.*?\n\}\n", "", source,
                  flags=re.S)
    calls = count(rest)
    for name in re.findall(r"return (\w+_shared\d+)\(", rest):
        calls.update(shared[name])
    # init() calls ctx.init in one loop, once per entry of its table.
    entries = re.findall(r'^    \{"[^"]*", \d+, "[^"]*"\},$', source, re.M)
    if entries:
        calls["ctx.init"] += len(entries) - 1
    return {"collectives": dict(sorted(collectives.items())), "calls": dict(sorted(calls.items()))}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_bench_gpt_step_emits_what_the_record_says(layout):
    got = record(layout)
    golden = json.load(open(GOLDEN)) if os.path.exists(GOLDEN) else {}
    if os.environ.get("TDX_UPDATE_GOLDEN") == "1":
        golden[layout] = got
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w") as f:
            json.dump(golden, f, indent=1, sort_keys=True)
            f.write("\n")
        pytest.skip(f"wrote {GOLDEN}")
    assert layout in golden, f"no record for {layout}; run with TDX_UPDATE_GOLDEN=1"
    want = golden[layout]
    for part in ("collectives", "calls"):
        differ = {k: (want[part].get(k), got[part].get(k))
                  for k in set(want[part]) | set(got[part])
                  if want[part].get(k) != got[part].get(k)}
        assert not differ, (f"{layout}: {part} changed (record, now): {differ}; if the change "
                            f"means this, regenerate with TDX_UPDATE_GOLDEN=1")
    # The record is not empty: the step communicates and calls the runtime.
    assert sum(got["collectives"].values()) > 0 and got["calls"]["fused kernels"] > 0
