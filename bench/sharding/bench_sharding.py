#!/usr/bin/env python3
"""Sharding passes benchmark: tdx against upstream MLIR's shard passes.

Part 1 runs the same Megatron MLP stacks (column-parallel then row-parallel
matmul per layer, output replicated) through
  ours:   tdx-opt --tdx-place --tdx-spmd (the pipeline tdx-compile and
          tdx.parallelize run: canonicalize, propagation, collective
          insertion, partitioning and the collective scheduling passes)
  theirs: mlir-opt-22 'func.func(sharding-propagation,cse,shard-partition)'
(linalg on tensors with shard annotations for theirs, the tdx equivalent for
ours) and prints collectives, bytes per rank and wall time side by side with
the ratio.

Part 2 runs what upstream cannot express: GPT-shaped forwards (layer norm,
attention with heads split over "tp", MLP, residuals) on a 2x4 (dp, tp) mesh
with a batch that does not divide the dp axis, from 8 to 64 layers, and
prints the time per op to show it grows linearly.

Wall time is the best of --repeat runs of the whole tool (parse, passes,
print); pass time is the sum of the passes from -mlir-timing.

Usage: bench_sharding.py [--build DIR] [--max-layers N] [--repeat N]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKENS, HIDDEN, FFN, TP = 2048, 1024, 4096, 4


def t(rows, cols):
    return f"tensor<{rows}x{cols}xf32>"


def mlp_header(layers):
    """The MLP function's signature line, the same for both dialects."""
    args = [f"%x: {t(TOKENS, HIDDEN)}"]
    for i in range(layers):
        args += [f"%w1_{i}: {t(HIDDEN, FFN)}", f"%w2_{i}: {t(FFN, HIDDEN)}"]
    return f"func.func @mlp({', '.join(args)}) -> {t(TOKENS, HIDDEN)} {{"


def mlp_module(before, prologue, layer, layers):
    """The MLP as one function: module-level lines `before`, the signature,
    the function's `prologue` lines, then `layer(i, x)`'s lines for each
    layer, whose output %r_i the next layer reads."""
    out = [*before, mlp_header(layers), *prologue]
    x = "%x"
    for i in range(layers):
        out += layer(i, x)
        x = f"%r_{i}"
    out += [f"  return {x} : {t(TOKENS, HIDDEN)}", "}"]
    return "\n".join(out) + "\n"


def upstream_mlp(layers):
    def layer(i, x):
        return [
            f"  %w1s_{i} = shard.shard %w1_{i} to %col annotate_for_users : {t(HIDDEN, FFN)}",
            f"  %e1_{i} = tensor.empty() : {t(TOKENS, FFN)}",
            f"  %f1_{i} = linalg.fill ins(%z : f32) outs(%e1_{i} : {t(TOKENS, FFN)}) -> {t(TOKENS, FFN)}",
            f"  %h_{i} = linalg.matmul ins({x}, %w1s_{i} : {t(TOKENS, HIDDEN)}, {t(HIDDEN, FFN)}) "
            f"outs(%f1_{i} : {t(TOKENS, FFN)}) -> {t(TOKENS, FFN)}",
            f"  %w2s_{i} = shard.shard %w2_{i} to %row annotate_for_users : {t(FFN, HIDDEN)}",
            f"  %e2_{i} = tensor.empty() : {t(TOKENS, HIDDEN)}",
            f"  %f2_{i} = linalg.fill ins(%z : f32) outs(%e2_{i} : {t(TOKENS, HIDDEN)}) -> {t(TOKENS, HIDDEN)}",
            f"  %y_{i} = linalg.matmul ins(%h_{i}, %w2s_{i} : {t(TOKENS, FFN)}, {t(FFN, HIDDEN)}) "
            f"outs(%f2_{i} : {t(TOKENS, HIDDEN)}) -> {t(TOKENS, HIDDEN)}",
            f"  %r_{i} = shard.shard %y_{i} to %rep : {t(TOKENS, HIDDEN)}"]
    return mlp_module(
        [f"shard.grid @grid(shape = {TP})"],
        ["  %z = arith.constant 0.0 : f32",
         "  %col = shard.sharding @grid split_axes = [[], [0]] : !shard.sharding",
         "  %row = shard.sharding @grid split_axes = [[0], []] : !shard.sharding",
         "  %rep = shard.sharding @grid split_axes = [[]] : !shard.sharding"],
        layer, layers)


def tdx_mlp(layers):
    def layer(i, x):
        return [
            f"  %w1s_{i} = tdx.annotate %w1_{i} <@mesh, [Shard(1)]> : {t(HIDDEN, FFN)}",
            f"  %h_{i} = tdx.matmul {x}, %w1s_{i} : ({t(TOKENS, HIDDEN)}, {t(HIDDEN, FFN)}) -> {t(TOKENS, FFN)}",
            f"  %w2s_{i} = tdx.annotate %w2_{i} <@mesh, [Shard(0)]> : {t(FFN, HIDDEN)}",
            f"  %y_{i} = tdx.matmul %h_{i}, %w2s_{i} : ({t(TOKENS, FFN)}, {t(FFN, HIDDEN)}) -> {t(TOKENS, HIDDEN)}",
            f"  %r_{i} = tdx.annotate %y_{i} <@mesh, [Replicate]> : {t(TOKENS, HIDDEN)}"]
    return mlp_module([f'tdx.mesh @mesh shape = [{TP}] axes = ["tp"]'], [], layer, layers)


def gpt(layers, batch=5, seq=16, d=768, heads=12, vocab=1000, mesh=(2, 4)):
    """A GPT-style forward on a (dp, tp) mesh; batch 5 splits 3, 2 over dp=2."""
    dh, f = d // heads, 4 * d
    T = lambda *s: "tensor<" + "x".join(map(str, s)) + "xf32>"
    X = T(batch, seq, d)
    out = [f'tdx.mesh @mesh shape = [{mesh[0]}, {mesh[1]}] axes = ["dp", "tp"]']
    stream = [0]

    def param(name, shape, sharding, init="normal"):
        ty = T(*shape)
        out.append(f'tdx.parameter @"{name}" : {ty} sharding <@mesh, {sharding}> init {{')
        if init == "normal":
            out.append(f"  %0 = tdx.normal(0.0, 0.02) seed(0, {stream[0]}) : {ty}")
            stream[0] += 1
        else:
            out.append(f"  %0 = tdx.full {init} : {ty}")
        out.extend([f"  tdx.yield %0 : {ty}", "}"])

    R2, C, Rw = "[Replicate, Replicate]", "[Replicate, Shard(0)]", "[Replicate, Shard(1)]"
    param("wte", (vocab, d), R2)
    for l in range(layers):
        p = f"h.{l}."
        param(p + "ln1.w", (d,), R2, "1.0"); param(p + "ln1.b", (d,), R2, "0.0")
        for n in ("q", "k", "v"):
            param(p + f"attn.w{n}", (d, d), C)
        param(p + "attn.wo", (d, d), Rw)
        param(p + "ln2.w", (d,), R2, "1.0"); param(p + "ln2.b", (d,), R2, "0.0")
        param(p + "mlp.fc", (f, d), C); param(p + "mlp.proj", (d, f), Rw)
    body = []
    n = [0]

    def op(s):
        n[0] += 1
        body.append(f"  %v{n[0]} = {s}")
        return f"%v{n[0]}"

    def ref(name, shape):
        return op(f'tdx.param_ref @"{name}" : {T(*shape)}')

    ids = "%ids"
    idsd = op(f"tdx.annotate {ids} <@mesh, [Shard(0), Replicate]> : tensor<{batch}x{seq}xi64>")
    x = op(f"tdx.embedding {ref('wte', (vocab, d))}, {idsd} : ({T(vocab, d)}, tensor<{batch}x{seq}xi64>) -> {X}")
    for l in range(layers):
        p = f"h.{l}."
        h = op(f"tdx.layer_norm {x} weight {ref(p + 'ln1.w', (d,))} bias {ref(p + 'ln1.b', (d,))} "
               f"normalized_shape = [{d}] eps = 1.0e-5 : ({X}, {T(d)}, {T(d)}) -> {X}")
        qkv = []
        for nm in ("q", "k", "v"):
            y = op(f"tdx.linear {h}, {ref(p + 'attn.w' + nm, (d, d))} : ({X}, {T(d, d)}) -> {X}")
            y = op(f"tdx.reshape {y} [{batch}, {seq}, {heads}, {dh}] : {X} -> {T(batch, seq, heads, dh)}")
            qkv.append(op(f"tdx.permute {y} [0, 2, 1, 3] : {T(batch, seq, heads, dh)} -> {T(batch, heads, seq, dh)}"))
        q, k, v = qkv
        kt = op(f"tdx.transpose {k} -2, -1 : {T(batch, heads, seq, dh)} -> {T(batch, heads, dh, seq)}")
        s = op(f"tdx.matmul {q}, {kt} : ({T(batch, heads, seq, dh)}, {T(batch, heads, dh, seq)}) -> {T(batch, heads, seq, seq)}")
        pr = op(f"tdx.softmax {s} dim = -1 : {T(batch, heads, seq, seq)}")
        o = op(f"tdx.matmul {pr}, {v} : ({T(batch, heads, seq, seq)}, {T(batch, heads, seq, dh)}) -> {T(batch, heads, seq, dh)}")
        o = op(f"tdx.permute {o} [0, 2, 1, 3] : {T(batch, heads, seq, dh)} -> {T(batch, seq, heads, dh)}")
        o = op(f"tdx.reshape {o} [{batch}, {seq}, {d}] : {T(batch, seq, heads, dh)} -> {X}")
        o = op(f"tdx.linear {o}, {ref(p + 'attn.wo', (d, d))} : ({X}, {T(d, d)}) -> {X}")
        x = op(f"tdx.add {x}, {o} : ({X}, {X}) -> {X}")
        h = op(f"tdx.layer_norm {x} weight {ref(p + 'ln2.w', (d,))} bias {ref(p + 'ln2.b', (d,))} "
               f"normalized_shape = [{d}] eps = 1.0e-5 : ({X}, {T(d)}, {T(d)}) -> {X}")
        h = op(f"tdx.linear {h}, {ref(p + 'mlp.fc', (f, d))} : ({X}, {T(f, d)}) -> {T(batch, seq, f)}")
        h = op(f"tdx.gelu {h} approximate = tanh : {T(batch, seq, f)}")
        h = op(f"tdx.linear {h}, {ref(p + 'mlp.proj', (d, f))} : ({T(batch, seq, f)}, {T(d, f)}) -> {X}")
        x = op(f"tdx.add {x}, {h} : ({X}, {X}) -> {X}")
    logits = op(f"tdx.linear {x}, {ref('wte', (vocab, d))} : ({X}, {T(vocab, d)}) -> {T(batch, seq, vocab)}")
    out.append(f"func.func @forward(%ids: tensor<{batch}x{seq}xi64>) -> {T(batch, seq, vocab)} {{")
    out += body
    out += [f"  return {logits} : {T(batch, seq, vocab)}", "}"]
    return "\n".join(out) + "\n", n[0]


def run(cmd, repeat):
    best = None
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"bench: command failed: {' '.join(cmd)}\n{proc.stderr[:2000]}")
        best = elapsed if best is None else min(best, elapsed)
    return best, proc


TDX_PIPELINE = ["--tdx-place", "--tdx-spmd"]


def measure_tdx(tdx_opt, path, repeat):
    """Wall time, pass time and the comm report of tdx's pipeline on a file."""
    wall, _ = run([tdx_opt, path, *TDX_PIPELINE, "-o", os.devnull], repeat)
    _, timed = run([tdx_opt, path, *TDX_PIPELINE, "-mlir-timing", "-o", os.devnull], 1)
    passes = pass_seconds(timed.stderr, ["PropagateSharding", "InsertCollectives", "Partition"])
    _, rep = run([tdx_opt, path, *TDX_PIPELINE, "--tdx-comm-report=format=json", "-o", os.devnull], 1)
    return wall, passes, json.loads(rep.stdout)


def pass_seconds(timing_text, names):
    total = 0.0
    for line in timing_text.splitlines():
        m = re.match(r"\s*([0-9.]+)\s+\(\s*[0-9.]+%\)\s+(\S+)", line)
        if m and m.group(2) in names:
            total += float(m.group(1))
    return total


def tensor_bytes(ty):
    dims = [int(x) for x in re.findall(r"(\d+)x", ty)]
    elem = re.search(r"x?([a-z]+)(\d+)>$", ty)
    size = 1
    for x in dims:
        size *= x
    return size * (int(elem.group(2)) // 8)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--max-layers", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tdx_opt = os.path.join(args.build, "bin", "tdx-opt")
    mlir_opt = shutil.which("mlir-opt-22") or "/usr/lib/llvm-22/bin/mlir-opt"
    for tool in (tdx_opt, mlir_opt):
        if not os.path.exists(tool):
            sys.exit(f"bench: {tool} not found; build tdx first (scripts/build.sh)")
    work = tempfile.mkdtemp(prefix="tdx-bench-sharding-")
    theirs_passes = ["sharding-propagation", "cse", "shard-partition"]

    print(f"Megatron MLP stacks: x {TOKENS}x{HIDDEN}, ffn {FFN}, {TP} ranks over one axis; "
          f"wall = best of {args.repeat} whole-tool runs")
    print(f"{'layers':>6} | {'collectives':>11} {'bytes/rank':>12} {'wall s':>8} {'pass s':>8} | "
          f"{'collectives':>11} {'bytes/rank':>12} {'wall s':>8} {'pass s':>8} | {'wall ratio':>10}")
    print(f"{'':>6} | {'tdx':^43} | {'upstream MLIR shard':^43} | {'tdx/theirs':>10}")
    layers = 1
    rows = []
    while layers <= args.max_layers:
        ours_in = os.path.join(work, f"tdx-{layers}.mlir")
        theirs_in = os.path.join(work, f"up-{layers}.mlir")
        open(ours_in, "w").write(tdx_mlp(layers))
        open(theirs_in, "w").write(upstream_mlp(layers))
        ours_wall, ours_pass, report = measure_tdx(tdx_opt, ours_in, args.repeat)
        ours_coll, ours_bytes = len(report), sum(e["bytes"] for e in report)
        pipeline = "--pass-pipeline=builtin.module(func.func(sharding-propagation,cse,shard-partition))"
        theirs_wall, out = run([mlir_opt, theirs_in, pipeline], args.repeat)
        _, timed = run([mlir_opt, theirs_in, pipeline, "-mlir-timing", "-o", os.devnull], 1)
        theirs_pass = pass_seconds(timed.stderr, ["ShardingPropagation", "CSE", "Partition"] + theirs_passes)
        colls = re.findall(r"shard\.(all_reduce|all_gather|reduce_scatter|all_to_all|all_slice)\b[^\n]*: (tensor<[^>]*>)", out.stdout)
        theirs_coll = len(colls)
        theirs_bytes = sum(tensor_bytes(ty) for _, ty in colls)
        print(f"{layers:>6} | {ours_coll:>11} {ours_bytes:>12} {ours_wall:>8.3f} {ours_pass:>8.3f} | "
              f"{theirs_coll:>11} {theirs_bytes:>12} {theirs_wall:>8.3f} {theirs_pass:>8.3f} | "
              f"{ours_wall / theirs_wall:>10.2f}")
        rows.append((layers, ours_bytes == theirs_bytes))
        layers *= 2
    if not all(same for _, same in rows):
        print("NOTE: bytes per rank differ from upstream at some sizes")

    print()
    print("GPT-shaped forwards on a 2x4 (dp, tp) mesh (batch 5 over dp: uneven 3/2; heads over tp);")
    print("upstream cannot express attention over named 2-D meshes with uneven shards")
    print(f"{'layers':>6} {'ops':>6} {'collectives':>11} {'bytes/rank':>12} {'wall s':>8} {'pass s':>8} {'us/op':>7}")
    for layers in (8, 16, 32, 64):
        text, nops = gpt(layers)
        path = os.path.join(work, f"gpt-{layers}.mlir")
        open(path, "w").write(text)
        wall, p, report = measure_tdx(tdx_opt, path, args.repeat)
        print(f"{layers:>6} {nops:>6} {len(report):>11} {sum(e['bytes'] for e in report):>12} "
              f"{wall:>8.3f} {p:>8.3f} {1e6 * p / nops:>7.1f}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
