"""A torch 2.x decoder's training step, tdx next to torch eager and
torch.compile, in one run.

The model is test/python/test_modern_decoder.py's (F.scaled_dot_product_
attention with is_causal and grouped-query heads, nn.RMSNorm, SwiGLU) at
this bench's size: d=128, 4 query heads and 2 key/value heads, hidden 344,
4 layers, vocab 512, batch 8 x 64 tokens; AdamW (foreach=False, what tdx
records). Peers, same weights and batches:

  - torch eager, one process (the oracle);
  - torch.compile of the model (inductor, default mode), the optimizer
    eager, one process;
  - the tdx binary of tdx.trace_train_step on 1 rank (its attention one
    fused op, tdx.sdpa, run by torch's CPU flash attention), and on 2 ranks
    data parallel and tensor parallel (heads split; the plan written with
    torch's own ColwiseParallel/RowwiseParallel).

Every process uses one ATen thread. A step time is the mean of --steps steps
after one warm-up step (torch.compile's compilation is in its warm-up), best
of --rounds rounds. tdx's losses are checked against eager's.

    . build/env.sh && "$TDX_PYTHON" bench/attention/bench_attention.py [--steps 10]
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402

common.setup()  # before torch loads
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "test", "python"))
import test_modern_decoder as decoder  # noqa: E402
import tdx  # noqa: E402

SIZE = dict(DIM=128, HEADS=4, KV_HEADS=2, HIDDEN=344, VOCAB=512, LAYERS=4, SEQ=64, BATCH=8)


def batches(n):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, decoder.VOCAB, (decoder.BATCH, decoder.SEQ), generator=g),
             torch.randint(0, decoder.VOCAB, (decoder.BATCH, decoder.SEQ), generator=g))
            for _ in range(n)]


def eager_ms(data, compiled=False):
    """(ms per step after the first, losses) of eager's loop, the model
    torch.compile'd when `compiled`."""
    torch.manual_seed(0)
    model = decoder.Decoder()
    run = torch.compile(model) if compiled else model
    opt = decoder.optimizer(model.parameters())
    losses, t0 = [], None
    for k, (ids, targets) in enumerate(data):
        if k == 1:
            t0 = time.perf_counter()
        opt.zero_grad()
        logits = run(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, decoder.VOCAB),
                                                 targets.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return (time.perf_counter() - t0) * 1e3 / (len(data) - 1), losses


def tdx_exe(layout):
    data = batches(1)
    torch.manual_seed(0)
    model = tdx.deferred_init(decoder.Decoder)
    prog = tdx.trace_train_step(model, decoder.optimizer(model.parameters()), decoder.loss_fn,
                                *data[0])
    if layout == "dp2":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    elif layout == "tp2":
        plan = {k: v for k, v in decoder.torch_tp_plan().items() if "." in k}
        from torch.distributed.tensor.parallel import ColwiseParallel
        plan["output"] = ColwiseParallel()
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)), plan)
    return tdx.compile(prog)


def main():
    args = common.arguments(__doc__, steps=10, rounds=3)
    for name, value in SIZE.items():
        setattr(decoder, name, value)
    torch.set_num_threads(1)
    data = batches(args.steps + 1)
    torch.manual_seed(0)
    weights = {k: v.detach().clone() for k, v in decoder.Decoder().state_dict().items()}
    exes = {layout: tdx_exe(layout) for layout in ("1", "dp2", "tp2")}
    best = {}
    want = None
    for _ in range(args.rounds):
        ms, want = eager_ms(data)
        best["eager"] = min(best.get("eager", ms), ms)
        ms, _ = eager_ms(data, compiled=True)
        best["compile"] = min(best.get("compile", ms), ms)
        for layout, exe in exes.items():
            losses, _ = exe.train(data, params=weights, verbose=True)
            worst = max(abs(a - b) / abs(b) for a, b in zip(losses, want))
            assert worst < 1e-4, f"tdx {layout}: losses {losses} vs eager {want}"
            ms = exe.last_step_ms()
            best[layout] = min(best.get(layout, ms), ms)
    print(f"decoder {SIZE}, AdamW step, one ATen thread per process, best of {args.rounds} "
          f"rounds of {args.steps} steps (ms per step)")
    print(f"{'config':<28}{'ms':>9}{'eager/this':>12}")
    rows = [("torch eager, 1 process", best["eager"]),
            ("torch.compile, 1 process", best["compile"]),
            ("tdx, 1 rank", best["1"]), ("tdx, dp2 (2 ranks)", best["dp2"]),
            ("tdx, tp2 (2 ranks)", best["tp2"])]
    for label, ms in rows:
        print(f"{label:<28}{ms:>9.2f}{best['eager'] / ms:>12.2f}")
    print(f"tdx 1 rank / torch.compile: {best['1'] / best['compile']:.2f}")


if __name__ == "__main__":
    main()
