"""The Python path end to end on a GPT-style model (run by scripts/demo.sh):

  1. build the model with tdx.deferred_init (no parameter storage),
  2. trace its forward into tdx IR,
  3. place it on a 2x2 (dp, tp) mesh with a Megatron plan,
  4. print the communication report of the per-rank program,
  5. compile the per-rank program into a model binary, run it on 4 CPU ranks
     under mpirun with the eager model's weights, and print its logits next
     to PyTorch eager's,
  6. materialize the weights (bitwise what eager construction gives).

Run with Debian's Python and the build's package:
    . build/env.sh && "$TDX_PYTHON" examples/gpt_2x2.py
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import tdx


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.wq, self.wk, self.wv = (nn.Linear(d, d) for _ in range(3))
        self.wo = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln_1(x)
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.wq(h)), split(self.wk(h)), split(self.wv(h))
        att = (q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)).softmax(dim=-1)
        x = x + self.wo((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=256, d=64, heads=4, layers=4, context=32):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# Megatron-style tensor parallelism of the blocks: q, k, v and the first MLP
# layer split by output features, the attention output and the second MLP
# layer by input features (one all-reduce each per block).
MEGATRON_PLAN = {"h.*.wq": tdx.ColwiseParallel(), "h.*.wk": tdx.ColwiseParallel(),
                 "h.*.wv": tdx.ColwiseParallel(), "h.*.wo": tdx.RowwiseParallel(),
                 "h.*.fc": tdx.ColwiseParallel(), "h.*.proj": tdx.RowwiseParallel()}


def main():
    torch.manual_seed(0)
    model = tdx.deferred_init(GPT)
    params = sum(p.numel() for p in model.parameters())
    assert all(p.data_ptr() == 0 for p in model.parameters())
    ids = torch.zeros(8, 32, dtype=torch.long)
    prog = tdx.trace(model, ids)
    print(f"  deferred init: {params:,} parameters, none with storage; traced: "
          f"{len(prog.parameters())} parameters and buffers, {prog.mlir.count(chr(10))} lines "
          f"of tdx IR")

    mesh = tdx.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tdx.parallelize(prog, mesh, MEGATRON_PLAN, data_parallel="dp")
    report = prog.comm_report()
    kinds = {}
    for r in report:
        key = f"{r['kind']} over {','.join(r['mesh_axes'])}"
        kinds[key] = kinds.get(key, 0) + 1
    print(f"  communication per forward step on the {mesh.shape} mesh: "
          f"{', '.join(f'{n} x {k}' for k, n in kinds.items())}; "
          f"{sum(r['bytes'] for r in report)} bytes per rank")

    prog.partition()
    print("  per-rank forward signature:",
          prog.mlir[prog.mlir.index("func.func @forward"):].split("{", 1)[0].strip()[:100], "...")

    exe = tdx.compile(prog)
    torch.manual_seed(0)
    eager = GPT()
    ids = torch.randint(0, 256, ids.shape, generator=torch.Generator().manual_seed(1))
    weights = dict(eager.named_parameters(), **dict(eager.named_buffers()))
    (logits,) = exe.run(ids, nprocs=4, params=weights)
    want = eager(ids)
    rel = ((logits - want).norm() / want.norm()).item()
    print(f"  compiled and ran on 4 CPU ranks (mpirun): {exe.last_log.strip()}")
    print(f"  logits[0, 0, :3] tdx {[round(v, 5) for v in logits[0, 0, :3].tolist()]}, eager "
          f"{[round(v, 5) for v in want[0, 0, :3].tolist()]}; relative error over all "
          f"{logits.numel()} logits: {rel:.2e}")

    tdx.materialize_module(model)
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                   eager.state_dict().values()))
    logits = model(ids)
    print(f"  materialized: bitwise equal to eager construction: {same}; its forward gives "
          f"logits {tuple(logits.shape)}")
    if rel > 1e-5:
        raise SystemExit(f"the compiled model differs from eager: relative error {rel}")


if __name__ == "__main__":
    main()
