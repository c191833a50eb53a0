"""tdx.explain: the plan as one static HTML page, rendered by headless
Chromium and checked in its screenshot."""

import os
import re
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

import tdx
from models import GPT2
from test_sharding import GPT2_PLAN

# The colors tdx-explain draws with (passes/Explain.cpp).
SHARD, REPLICATE = (0x4E, 0x79, 0xA7), (0xBA, 0xB0, 0xAC)
ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER = (0x59, 0xA1, 0x4F), (0xE1, 0x57, 0x59), (0xB0, 0x7A, 0xA1)


def lm_loss(model, ids, targets):
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def bench_gpt_2x2(zero=1, budget=None):
    """bench/training's GPT-2 (4 layers, d 128, context 64), its AdamW step
    on batches of 8 x 64, on (dp 2, tp 2): the Megatron plan and ZeRO."""
    torch.manual_seed(0)
    model = tdx.deferred_init(GPT2, vocab=512, d=128, heads=4, layers=4, context=64)
    ids = torch.zeros(8, 64, dtype=torch.long)
    prog = tdx.trace_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lm_loss,
                                ids, ids)
    return tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp")), GPT2_PLAN,
                           data_parallel="dp", zero=zero, memory_budget=budget)


def test_the_plan_page_shows_placements_collectives_and_memory(tmp_path):
    prog = bench_gpt_2x2(budget=10**9)
    before = prog.mlir
    page = tdx.explain(prog, tmp_path / "plan.html")
    assert prog.mlir == before  # the program is not changed
    html = open(page).read()
    assert html.startswith("<!doctype html>") and "<script" not in html and "http://" not in \
        html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    # Placements: the 4 blocks are placed alike and drawn once; c_attn is
    # split on tp (colwise) and, with ZeRO-1, its optimizer state on dp.
    assert "h.0 ... h.3 (4 layers placed alike)" in html
    start = html.index(">c_attn.weight</text>")
    cells = re.findall(r'fill="#fff">([^<]+)</text>', html[start:html.index('<text x="14"', start)])
    assert cells[:2] == ["Replicate", "Shard(0)"], cells
    assert "optimizer dp" in html and len(cells) == 4 and cells[2].startswith("Shard"), cells
    # Every collective at its place, with its kind, axes and bytes.
    comm = prog.comm_report()
    titles = re.findall(r"<title>(all_gather|all_reduce|reduce_scatter|all_to_all|broadcast) "
                        r"over ([a-z, ]+): ", html)
    assert sorted(titles) == sorted((c["kind"], ", ".join(c["mesh_axes"])) for c in comm)
    assert {k for k, _ in titles} >= {"all_reduce", "reduce_scatter", "all_gather"}
    # Memory: the report's figures, against the budget.
    report = prog.memory_report()
    for kind in ("parameters", "optimizer", "gradients", "activations"):
        assert f"{kind}</td><td>{report[kind]}</td>" in html, kind
    assert f"<th>peak</th><th>{report['peak']}</th>" in html
    assert "within it" in html


def screenshot(page, tmp_path):
    """The page rendered by headless Chromium at 1280 x 1800: {color: pixels}."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the screenshot test needs Debian's chromium: run scripts/setup.sh"
    from PIL import Image
    shot = tmp_path / "plan.png"
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--window-size=1280,1800",
                           f"--screenshot={shot}", f"file://{page}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and os.path.exists(shot), done.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1800)
    counts = {}
    for color in image.getdata():
        counts[color] = counts.get(color, 0) + 1
    return counts


def test_the_plan_page_renders_in_chromium(tmp_path):
    counts = screenshot(tdx.explain(bench_gpt_2x2(), tmp_path / "plan.html"), tmp_path)
    # The placement cells and the collectives' marks are drawn: each color
    # covers at least a few cells' worth of pixels.
    for name, color, least in [("Shard", SHARD, 2000), ("Replicate", REPLICATE, 2000),
                               ("all_reduce", ALL_REDUCE, 30), ("reduce_scatter", REDUCE_SCATTER, 30),
                               ("all_gather", ALL_GATHER, 30)]:
        assert counts.get(color, 0) >= least, (name, counts.get(color, 0))
    # Not one color: the page's background is white, under 95% of it.
    assert counts.get((255, 255, 255), 0) < 0.95 * 1280 * 1800


def test_explain_refuses_what_it_cannot_draw(tmp_path):
    with pytest.raises(TypeError, match="tdx.Program"):
        tdx.explain("step.mlir", tmp_path / "plan.html")
    with pytest.raises(FileNotFoundError, match="does not exist; create it first"):
        tdx.explain(bench_gpt_2x2(), tmp_path / "missing" / "plan.html")


FORWARD, BACKWARD = (0x1F, 0x77, 0xB4), (0x94, 0x67, 0xBD)


def test_a_pipeline_page_shows_its_stages_and_schedule(tmp_path):
    """The bench GPT on (pp 2, dp 2), 1F1B over 4 micro-batches: the stages
    with every layer once, and the schedule as rank rows of F and B blocks
    (one per stage and micro-batch) with the bubbles between, rendered."""
    torch.manual_seed(0)
    model = tdx.deferred_init(GPT2, vocab=512, d=128, heads=4, layers=4, context=64)
    ids = torch.zeros(8, 64, dtype=torch.long)
    prog = tdx.trace_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lm_loss,
                                ids, ids)
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("pp", "dp")), {},
                    data_parallel="dp", zero=1,
                    pipeline=tdx.Pipeline("pp", microbatches=4, schedule="1f1b"))
    page = tdx.explain(prog, tmp_path / "plan.html")
    html = open(page).read()
    assert '<h2>Pipeline: 2 ranks on "pp", 1f1b, 4 micro-batches</h2>' in html
    rows = re.findall(r"<tr><td>(\d)</td><td>(\d)</td><td>([^<]*)</td>", html)
    layers = [name for _, _, names in rows for name in names.split(", ")]
    assert layers == ["wte", "wpe", "h.0", "h.1", "h.2", "h.3", "ln_f"]
    assert [(s, r) for s, r, _ in rows] == [("0", "0"), ("1", "1")]
    for phase in ("forward", "backward"):
        blocks = re.findall(rf"<title>{phase} of stage (\d), micro-batch (\d)</title>", html)
        assert sorted(blocks) == sorted((s, m) for s in "01" for m in "0123"), phase
    bubble = re.search(r"Bubble \(idle over busy time\) by rank: 0: ([\d.]+) 1: ([\d.]+); "
                       r"\(p-1\)/\(v m\) = 0.25", html)
    assert bubble and all(float(b) > 0 for b in bubble.groups()), html[-3000:]
    counts = screenshot(page, tmp_path)
    for name, color in [("forward", FORWARD), ("backward", BACKWARD)]:
        assert counts.get(color, 0) >= 3000, f"{name} blocks: {counts.get(color, 0)} pixels"
