"""Mixture of Experts training steps: transformers' Qwen3-MoE (unchanged,
default grouped_mm experts) as tdx compiles it on dp2 (experts replicated),
ep2 and dp2 x ep2 (tdx.ExpertParallel: experts split, tokens dispatched by
all-to-all), beside Hugging Face eager on one process. ms per SGD step and
bytes each rank sends per step (the comm report), ratios in one run.

    . build/env.sh && "$TDX_PYTHON" bench/moe/bench_moe.py [--steps 10] [--rounds 2]
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import arguments, ms_per_step, setup  # noqa: E402

setup()
args = arguments(__doc__, steps=10, rounds=2, hidden="128", experts="8", batch="8", seq="64")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

import tdx  # noqa: E402

H, E, B, S, VOCAB = int(args.hidden), int(args.experts), int(args.batch), int(args.seq), 512
CONFIG = transformers.Qwen3MoeConfig(
    vocab_size=VOCAB, hidden_size=H, intermediate_size=2 * H, moe_intermediate_size=H,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=S, num_experts=E, num_experts_per_tok=2, bos_token_id=1,
    eos_token_id=2)
LAYOUTS = {"dp2": ((2,), ("dp",), {}), "ep2": ((2,), ("ep",), "ep"),
           "dp2 x ep2": ((2, 2), ("dp", "ep"), "ep")}


def build():
    return transformers.Qwen3MoeForCausalLM(CONFIG)


def loss_fn(model, ids, targets):
    return F.cross_entropy(model(input_ids=ids).logits.reshape(-1, VOCAB), targets.reshape(-1))


def sgd(params):
    return torch.optim.SGD(params, lr=0.01)


def data(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(3, VOCAB, (B, S), generator=g),
             torch.randint(3, VOCAB, (B, S), generator=g)) for _ in range(n)]


def eager(batches):
    torch.manual_seed(0)
    model = build()
    opt = sgd(model.parameters())

    def step(batch):
        opt.zero_grad()
        loss_fn(model, *batch).backward()
        opt.step()
    return ms_per_step(step, batches), 0


def compiled(layout, batches):
    shape, axes, ep = LAYOUTS[layout]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    prog = tdx.trace_train_step(deferred, sgd(deferred.parameters()), loss_fn, *batches[0])
    plan = {"model.layers.*.mlp.experts": tdx.ExpertParallel(ep)} if ep else {}
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), plan,
                    data_parallel="dp" if "dp" in axes else None)
    sent = sum(r["bytes"] for r in prog.comm_report())
    torch.manual_seed(0)
    weights = {k: v.detach() for k, v in build().state_dict().items()}
    with tdx.compile(prog).start(params=weights, threads=1) as runner:
        return ms_per_step(lambda batch: runner.train_step(*batch).item(), batches), sent


def main():
    batches = data(args.steps + 1)
    rows = {"HF eager (1 process)": []}
    rows.update({f"tdx {k}": [] for k in LAYOUTS})
    for _ in range(args.rounds):
        rows["HF eager (1 process)"].append(eager(batches))
        for k in LAYOUTS:
            rows[f"tdx {k}"].append(compiled(k, batches))
    best = {k: min(v) for k, v in rows.items()}
    print(f"Qwen3-MoE hidden {H}, {E} experts top-2, 2 layers, batch {B} x seq {S}, SGD, best "
          f"of {args.rounds} rounds of {args.steps} steps")
    print(f"{'':24} {'ms/step':>9} {'bytes/step':>11}")
    for k, (ms, sent) in best.items():
        print(f"{k:24} {ms:9.3f} {sent:11d}")
    ref = best["HF eager (1 process)"][0]
    dp, ep = best["tdx dp2"], best["tdx ep2"]
    print(f"tdx ep2 / tdx dp2: time {ep[0] / dp[0]:.2f}x, bytes {ep[1] / max(dp[1], 1):.2f}x; "
          + "; ".join(f"{k} / HF eager: {v[0] / ref:.2f}x" for k, v in best.items()
                      if k.startswith("tdx")))


if __name__ == "__main__":
    main()
