"""Generation: tdx (trace_generate, runner.generate) on 1 rank and tp2 beside
Hugging Face generate eager (its default dynamic cache) and with its static
cache + torch.compile, the same ~110M-parameter Llama config, greedy, batch
1 and 8; then the store refresh of the generator's weights beside reading
the same bytes with torch.load. Time to first token (ms) and decode tokens/s,
ratios in one run, best of --rounds. One thread per process (tp2: two
ranks, one core each).

    . build/env.sh && "$TDX_PYTHON" bench/serve/bench_serve.py [--new 32] [--prompt 32] [--rounds 2]
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import arguments, setup  # noqa: E402

setup()
args = arguments(__doc__, steps=0, rounds=2, new="32", prompt="32", batches="1,8",
                 layers="12", hidden="768", vocab="16384", compile="1")
import torch  # noqa: E402
import transformers  # noqa: E402

import tdx  # noqa: E402

torch.set_num_threads(1)
NEW, PROMPT = int(args.new), int(args.prompt)
BATCHES = [int(b) for b in args.batches.split(",")]
H, LAYERS, VOCAB = int(args.hidden), int(args.layers), int(args.vocab)
CONFIG = dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=H * 8 // 3 // 64 * 64,
              num_hidden_layers=LAYERS, num_attention_heads=H // 64,
              num_key_value_heads=H // 64, max_position_embeddings=PROMPT + NEW + 8,
              eos_token_id=None, bos_token_id=None)


def make():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()


def prompts(batch):
    return torch.randint(0, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(1))


def best(fn, rounds):
    out = None
    for _ in range(rounds):
        t = fn()
        out = t if out is None else tuple(min(a, b) for a, b in zip(out, t))
    return out


def hf(model, ids, static):
    """(time to first token, decode tokens/s) of HF generate."""
    options = dict(do_sample=False, pad_token_id=0)
    if static:
        options["cache_implementation"] = "static"
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, **options)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, **options)
        whole = time.perf_counter() - t0
    assert out.shape[1] == PROMPT + NEW
    return first, ids.shape[0] * (NEW - 1) / max(whole - first, 1e-9)


def ours(runner, ids):
    runner.generate(ids, max_new_tokens=NEW, eos_token_id=[])
    report = runner.last_generation
    whole = report["new_tokens"] * ids.shape[0] / report["tokens_per_s"]
    first = report["time_to_first_token_s"]
    return first, ids.shape[0] * (NEW - 1) / max(whole - first, 1e-9)


def ceiling(model, rounds):
    """Batch-1 decode's memory ceiling on one thread: the time to stream
    every linear weight once through a matrix-vector product (what a
    decode step must read at least; the embedding reads one row). Returns
    (bytes, GB/s, tokens/s)."""
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    size = sum(w.numel() * w.element_size() for w in weights)
    xs = [torch.randn(1, w.shape[1]) for w in weights]
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        for w, x in zip(weights, xs):
            torch.nn.functional.linear(x, w)
        times.append(time.perf_counter() - t0)
    return size, size / min(times) / 1e9, 1 / min(times)


def main():
    torch.manual_seed(0)
    model = make()
    params = sum(p.numel() for p in model.parameters())
    print(f"Llama, {params / 1e6:.0f}M parameters ({LAYERS} layers, hidden {H}); prompt "
          f"{PROMPT}, {NEW} new tokens, greedy; best of {args.rounds}")
    state = model.state_dict()
    runners = {}
    for layout in ("1 rank", "tp2"):
        for batch in BATCHES:
            t0 = time.perf_counter()
            prog = tdx.trace_generate(tdx.deferred_init(make), torch.zeros(batch, PROMPT,
                                                                          dtype=torch.int64),
                                      max_length=PROMPT + NEW)
            if layout == "tp2":
                tdx.auto_parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)))
            runners[layout, batch] = tdx.compile(prog).start(params=state, threads=1)
            print(f"tdx {layout}, batch {batch}: traced and compiled in "
                  f"{time.perf_counter() - t0:.1f} s")
    compiled = make()
    compiled.load_state_dict(state)
    if args.compile == "1":
        compiled.forward = torch.compile(compiled.forward, fullgraph=True)
    rows = []
    for batch in BATCHES:
        ids = prompts(batch)
        figures = {
            "HF eager": best(lambda: hf(model, ids, False), args.rounds),
        }
        if args.compile == "1":
            t0 = time.perf_counter()
            hf(compiled, ids, True)           # torch.compile's warm-up, not timed
            print(f"HF static + torch.compile, batch {batch}: compiled in "
                  f"{time.perf_counter() - t0:.1f} s")
            figures["HF static + compile"] = best(lambda: hf(compiled, ids, True), args.rounds)
        for layout in ("1 rank", "tp2"):
            r = runners[layout, batch]
            ours(r, ids)                      # warm-up
            figures[f"tdx {layout}"] = best(lambda: ours(r, ids), args.rounds)
        rows.append((batch, figures))
    peer = "HF static + compile" if args.compile == "1" else "HF eager"
    print(f"\n{'batch':>5}  {'':<20} {'first token ms':>14} {'decode tok/s':>12} "
          f"{'vs ' + peer:>26}")
    for batch, figures in rows:
        for name, (first, rate) in figures.items():
            ratio = rate / figures[peer][1]
            print(f"{batch:>5}  {name:<20} {first * 1e3:>14.1f} {rate:>12.1f} {ratio:>25.2f}x")
    size, rate, limit = ceiling(model, args.rounds)
    if 1 in BATCHES:
        one = dict(rows)[1]
        print(f"batch 1 ceiling on one thread: the linear weights ({size / 1e6:.0f} MB) "
              f"streamed once at {rate:.1f} GB/s: {limit:.1f} tok/s; tdx 1 rank at "
              f"{one['tdx 1 rank'][1] / limit:.0%} of it, {peer} at "
              f"{one[peer][1] / limit:.0%}")
    for batch, figures in rows:
        print(f"batch {batch}: tdx tp2 / tdx 1 rank decode: "
              f"{figures['tdx tp2'][1] / figures['tdx 1 rank'][1]:.2f}x")

    # The refresh: the generator on tp2 reads the newest version of a key,
    # each rank its boxes, beside torch.load of the same state whole.
    store = tdx.store.Store(tempfile.mkdtemp(prefix="tdx-bench-serve-", dir="/dev/shm"))
    store.put("policy", dict(state))
    r = runners["tp2", BATCHES[0]]
    refresh = min((r.load_weights(store, "policy") for _ in range(args.rounds)),
                  key=lambda x: x["seconds"])
    path = os.path.join(store.path, "state.pt")
    torch.save(state, path)
    loads = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        torch.load(path)
        loads.append(time.perf_counter() - t0)
    size = os.path.getsize(path)
    print(f"\nrefresh (tp2, {refresh['bytes']:,} bytes of boxes): {refresh['seconds'] * 1e3:.1f} "
          f"ms, {refresh['GB/s']:.2f} GB/s; torch.load of the state ({size:,} bytes): "
          f"{min(loads) * 1e3:.1f} ms, {size / min(loads) / 1e9:.2f} GB/s; "
          f"ratio {refresh['GB/s'] / (size / min(loads) / 1e9):.2f}x")
    for r in runners.values():
        r.close()


if __name__ == "__main__":
    main()
