#!/usr/bin/env python3
"""tdx-compile's compile cache against ccache, the peer a C++ user would
reach for, on the bench GPT training step (bench/training: 4 layers, d 128,
AdamW, one rank) and on a small MLP forward.

Each program is emitted once (tdx-compile --emit-source -v gives the source
and the command), then compiled:
  - cold:  tdx-compile --no-cache (g++ on the emitted source, every time);
  - tdx:   tdx-compile with a warm --cache-dir (a hash and a copy);
  - ccache miss / hit: the same g++ command as a compile through `ccache`
    (fresh CCACHE_DIR: the first call fills it, the next hit) plus the link,
    which ccache does not cache.
Times are the best of --repeat runs of the whole command, with the ratios
of cold and of ccache's hit to tdx's hit. ccache comes with
scripts/setup.sh's packages.

Usage: . build/env.sh && "$TDX_PYTHON" bench/compile/bench_compile_cache.py [--repeat N]
"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import tdx  # noqa: E402
from gpt_2x2 import GPT  # noqa: E402


def tool(name):
    here = os.path.dirname(os.path.abspath(tdx.__file__))
    return os.path.join(here, "..", "..", "bin", name)


def gpt_step():
    torch.manual_seed(0)
    deferred = tdx.deferred_init(lambda: GPT(vocab=512, d=128, heads=4, layers=4, context=64))
    opt = torch.optim.AdamW(deferred.parameters(), lr=1e-3, weight_decay=0.1, foreach=False)
    ids = torch.zeros(8, 64, dtype=torch.int64)
    return tdx.trace_train_step(
        deferred, opt,
        lambda m, x, y: F.cross_entropy(m(x).reshape(-1, 512), y.reshape(-1)), ids, ids)


def mlp_forward():
    torch.manual_seed(0)
    m = tdx.deferred_init(lambda: torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)))
    return tdx.trace(m, torch.randn(16, 64))


def best(cmd, repeat, env=None):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - t0)
    return min(times)


def bench(name, prog, repeat, tmp):
    src = os.path.join(tmp, f"{name}.mlir")
    with open(src, "w") as f:
        f.write(prog.mlir)
    compile_ = [tool("tdx-compile"), src, "-o", os.path.join(tmp, name)]
    # The emitted source and the compiler command tdx-compile runs.
    done = subprocess.run(compile_ + ["--no-cache", "--emit-source", "-v"], check=True,
                          capture_output=True, text=True)
    # -v prints the compile (to an object, `-c`) and then the link.
    lines = done.stderr.strip().splitlines()
    compile_line = shlex.split(next(l for l in lines if " -c -o " in l))
    link_line = shlex.split(lines[-1])
    # Kept apart: the next compiles write and remove <o>.cpp themselves.
    source = os.path.join(tmp, f"{name}-emitted.cpp")
    shutil.copyfile(os.path.join(tmp, name + ".cpp"), source)
    cold = best(compile_ + ["--no-cache"], repeat)
    cache = os.path.join(tmp, "tdx-cache")
    subprocess.run(compile_ + ["--cache-dir", cache], check=True, capture_output=True)
    warm = best(compile_ + ["--cache-dir", cache], repeat)
    ccache = shutil.which("ccache")
    row = {"program": name, "cold g++": cold, "tdx cache hit": warm}
    if ccache:
        # ccache caches compiles, not links: the command as a compile to an
        # object through ccache, then the link, as a ccache user builds.
        at = compile_line.index("-c")
        flags = compile_line[1:at]
        libraries = link_line[4:]  # mpicxx -o <binary> <object> <libraries...>
        obj = os.path.join(tmp, f"{name}.o")
        steps = [[ccache, compile_line[0], *flags, "-c", source, "-o", obj],
                 [link_line[0], "-o", os.path.join(tmp, f"{name}-ccache"), obj, *libraries]]
        # A precompiled header needs ccache's pch sloppiness to be cached
        # at all (its documented setting for -include of a .gch).
        env = dict(os.environ, CCACHE_DIR=os.path.join(tmp, "ccache"),
                   CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,"
                                     "include_file_ctime")
        t0 = time.perf_counter()
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, env=env)
        row["ccache miss"] = time.perf_counter() - t0
        row["ccache hit"] = sum(best(step, repeat, env) for step in steps)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"tdx-compile cache vs ccache, best of {args.repeat} (seconds; this machine: "
          f"{os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench("mlp-forward", mlp_forward(), args.repeat, tmp),
                bench("gpt-train-step", gpt_step(), args.repeat, tmp)]
    cols = ["cold g++", "tdx cache hit", "ccache miss", "ccache hit"]
    print(f"{'program':16}" + "".join(f"{c:>15}" for c in cols) +
          f"{'cold/tdx':>10}{'ccache hit/tdx':>16}")
    for r in rows:
        cells = "".join(f"{r[c]:15.3f}" if c in r else f"{'-':>15}" for c in cols)
        ratio = r["cold g++"] / r["tdx cache hit"]
        peer = f"{r['ccache hit'] / r['tdx cache hit']:16.1f}" if "ccache hit" in r else ""
        print(f"{r['program']:16}{cells}{ratio:10.1f}{peer}")


if __name__ == "__main__":
    main()
