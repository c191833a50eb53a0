#!/usr/bin/env python3
"""Capture benchmark: tdx deferred init and capture next to torch's meta device.

For a LLaMA-2-7B-shaped and a LLaMA-2-70B-shaped model (the real layer
shapes; grouped-query attention for 70B), each measured in a fresh process:

  meta      the model built with device="meta" (torch's way to build without memory)
  deferred  tdx.deferred_init of the same model (records every op; no memory)
  capture   tdx.capture of the deferred model into tdx IR (parameters + init programs)

prints wall time (best of --repeat), peak RSS growth, and the ratios. The
parameter bytes the model would need are printed for scale. tdx runs each
of its two ways in (docs/capture.md, "Two ways in"): fake-key (torch's
reserved dispatch key) and dispatch-mode (torch's Python dispatch, no
reserved key); a third measurement, the forward of torchvision's ResNet-50
traced (tdx.trace), shows what each op's Python call costs the key-free way.

Usage: bench_capture.py [--repeat N] [--configs 7b,70b] [--ways fake-key,dispatch-mode]
Run with Debian's Python and the build's package: . build/env.sh first.
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

CONFIGS = {
    "7b": dict(vocab=32000, d=4096, layers=32, heads=32, kv_heads=32, hidden=11008),
    "70b": dict(vocab=32000, d=8192, layers=80, heads=64, kv_heads=8, hidden=28672),
}


def model_class():
    import torch
    import torch.nn as nn

    class RMSNorm(nn.Module):
        def __init__(self, d, device=None):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d, device=device))

    class Block(nn.Module):
        def __init__(self, c, device=None):
            super().__init__()
            d, hd = c["d"], c["d"] // c["heads"]
            kv = c["kv_heads"] * hd
            self.attention_norm = RMSNorm(d, device)
            self.wq = nn.Linear(d, d, bias=False, device=device)
            self.wk = nn.Linear(d, kv, bias=False, device=device)
            self.wv = nn.Linear(d, kv, bias=False, device=device)
            self.wo = nn.Linear(d, d, bias=False, device=device)
            self.ffn_norm = RMSNorm(d, device)
            self.w1 = nn.Linear(d, c["hidden"], bias=False, device=device)
            self.w2 = nn.Linear(c["hidden"], d, bias=False, device=device)
            self.w3 = nn.Linear(d, c["hidden"], bias=False, device=device)

    class Llama(nn.Module):
        def __init__(self, c, device=None):
            super().__init__()
            self.tok_embeddings = nn.Embedding(c["vocab"], c["d"], device=device)
            self.layers = nn.ModuleList(Block(c, device) for _ in range(c["layers"]))
            self.norm = RMSNorm(c["d"], device)
            self.output = nn.Linear(c["d"], c["vocab"], bias=False, device=device)

    return Llama


def one(mode, config, repeat):
    """Runs in a child process: measure one mode on one config."""
    import torch
    import tdx
    Llama = model_class()
    c = CONFIGS[config]
    torch.set_num_threads(1)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    best = math.inf
    params = 0
    for _ in range(repeat):
        start = time.perf_counter()
        if mode == "trace":
            import torchvision
            m = tdx.deferred_init(torchvision.models.resnet50).eval()
            x = torch.randn(1, 3, 224, 224)
            start = time.perf_counter()
            tdx.trace(m, x)
        elif mode == "meta":
            m = Llama(c, device="meta")
        elif mode == "deferred":
            m = tdx.deferred_init(Llama, c)
        else:
            m = tdx.deferred_init(Llama, c)
            start = time.perf_counter()
            prog = tdx.capture(m)
        best = min(best, time.perf_counter() - start)
        params = sum(p.numel() for p in m.parameters())
        del m
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": best, "rss_growth": peak - base, "params": params}))


def measure(mode, config, repeat, way="fake-key"):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", TDX_CAPTURE=way)
    out = subprocess.run([sys.executable, __file__, "--one", mode, config, str(repeat)],
                         capture_output=True, text=True, env=env, timeout=1200)
    if out.returncode != 0:
        sys.exit(f"bench: {mode} {config} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--configs", default="7b,70b")
    ap.add_argument("--ways", default="fake-key,dispatch-mode")
    args = ap.parse_args()
    ways = args.ways.split(",")
    print("threads: OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1); "
          f"wall = best of {args.repeat}; RSS = peak growth in a fresh process")
    print(f"{'config':>6} {'way':>13} {'params':>14} {'param GiB':>9} | {'meta s':>8} "
          f"{'meta RSS':>10} | {'deferred s':>10} {'RSS':>10} {'ratio':>6} {'RSS/param':>9} | "
          f"{'capture s':>9} {'RSS':>10}")
    mib = lambda b: f"{b / 2**20:.1f} MiB"
    for config in args.configs.split(","):
        meta = measure("meta", config, args.repeat)
        for way in ways:
            deferred = measure("deferred", config, args.repeat, way)
            capture = measure("capture", config, max(1, args.repeat // 2), way)
            params = deferred["params"]
            gib = params * 4 / 2**30
            print(f"{config:>6} {way:>13} {params:>14,} {gib:>9.1f} | {meta['seconds']:>8.4f} "
                  f"{mib(meta['rss_growth']):>10} | {deferred['seconds']:>10.4f} "
                  f"{mib(deferred['rss_growth']):>10} "
                  f"{deferred['seconds'] / meta['seconds']:>6.2f} "
                  f"{100 * deferred['rss_growth'] / (params * 4):>8.3f}% | "
                  f"{capture['seconds']:>9.3f} {mib(capture['rss_growth']):>10}")
    traced = {way: measure("trace", "7b", args.repeat, way)["seconds"] for way in ways}
    print("tdx.trace of torchvision resnet50's forward (deferred): " +
          ", ".join(f"{way} {t * 1e3:.1f} ms" for way, t in traced.items()) +
          (f"; dispatch-mode / fake-key {traced['dispatch-mode'] / traced['fake-key']:.2f}x"
           if {"fake-key", "dispatch-mode"} <= set(traced) else ""))


if __name__ == "__main__":
    main()
