"""An RL-style loop: a trainer and a generator, two compiled programs of one
Hugging Face Llama, handing weights over through the tensor store.

  trainer    trace_train_step (AdamW) on a dp x tp mesh (2 x 2, 4 ranks)
  generator  trace_generate on tp2 (2 ranks), its key/value cache split by heads

Each round: the trainer takes a step on a batch and publishes its weights as
the next version of a key; the generator refreshes from that key in its own
layout (each rank reads only its boxes; the compiled program stays) and
generates. The refresh's time, bytes and GB/s are printed, and the
generator's logits are checked against eager PyTorch on the trainer's
weights, version by version.

    . build/env.sh && "$TDX_PYTHON" examples/rl_loop.py [--rounds 3] [--store DIR|ucx://HOST:PORT]
"""

import argparse
import json
import sys
import tempfile

import torch

import tdx

CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
BATCH, SEQ, PROMPT, MAX_LENGTH, NEW = 4, 16, 8, 40, 16


def make():
    import transformers
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))


def loss_fn(model, ids, targets):
    logits = model(ids, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def trainer_program():
    model = tdx.deferred_init(make)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    prog = tdx.trace_train_step(model, optimizer, loss_fn, ids, ids)
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp"))
    plan = tdx.auto_parallelize(prog.copy(), tdx.init_device_mesh("cpu", (2,), ("tp",)))["plan"]
    tdx.parallelize(prog, mesh, plan, data_parallel="dp")
    return prog


def generator_program():
    prog = tdx.trace_generate(tdx.deferred_init(make), torch.zeros(BATCH, PROMPT,
                                                                  dtype=torch.int64),
                              max_length=MAX_LENGTH)
    tdx.auto_parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)))
    return prog


def eager_last_logits(state, ids):
    """The logits eager PyTorch gives the last prompt position with `state`."""
    model = make().eval()
    model.load_state_dict(state)
    with torch.no_grad():
        return model(ids, use_cache=False).logits[:, -1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", help="a directory or ucx://HOST:PORT (default: a temporary "
                                        "directory)")
    parser.add_argument("--json", action="store_true", help="one JSON line per round")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    start = make().state_dict()
    store = tdx.store.Store(args.store or tempfile.mkdtemp(prefix="tdx-rl-"))
    trainer = tdx.compile(trainer_program()).start(params=start)
    generator = tdx.compile(generator_program()).start(params=start)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, CONFIG["vocab_size"], (BATCH, PROMPT), generator=g)
    rows = []
    with trainer, generator:
        for round_ in range(args.rounds):
            ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ + 1), generator=g)
            loss = float(trainer.train_step(ids[:, :-1], ids[:, 1:]))
            trainer.publish(store, "policy")
            refresh = generator.load_weights(store, "policy")
            out = generator.generate(prompts, max_new_tokens=NEW)
            # The generator's prefill logits against eager on the trainer's weights.
            mask = torch.ones(BATCH, MAX_LENGTH, dtype=torch.int64)
            positions = torch.arange(PROMPT).expand(BATCH, PROMPT)
            logits = generator.forward(prompts, mask, positions)
            want = eager_last_logits(trainer.state_dict(), prompts)
            diff = (logits - want).abs().max().item()
            row = {"round": round_, "loss": loss, "version": refresh["version"],
                   "refresh_s": refresh["seconds"], "refresh_bytes": refresh["bytes"],
                   "refresh_GBps": refresh["GB/s"], "logits_max_diff": diff,
                   "tokens_per_s": generator.last_generation["tokens_per_s"],
                   "first_tokens": out[0, PROMPT:PROMPT + 4].tolist()}
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"round {round_}: loss {loss:.4f}; refreshed version {row['version']} in "
                      f"{row['refresh_s'] * 1e3:.1f} ms ({row['refresh_bytes']:,} bytes, "
                      f"{row['refresh_GBps']:.3f} GB/s); generated {NEW} tokens x {BATCH} "
                      f"({row['tokens_per_s']:.0f} tokens/s); logits vs eager: {diff:.2e}",
                      flush=True)
    if any(r["logits_max_diff"] > 1e-5 for r in rows):
        print("the generator's logits differ from eager's on the trainer's weights",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
