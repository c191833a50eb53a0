"""A whole training step (forward, backward, AdamW update) of one GPT-style
model, tdx next to its peers, in one run:

  - torch eager with torch.optim.AdamW, one process (the oracle and the
    1-rank baseline);
  - torch.nn.parallel.DistributedDataParallel on torch.distributed's gloo
    backend, 2 and 4 processes, each on its part of the batch;
  - Megatron tensor parallelism written by hand on gloo, 2 processes:
    column- and row-parallel linears with the all_reduces Megatron places
    (two per layer in the forward, two in the backward);
  - the tdx binary of tdx.trace_train_step (tdx.compile) under mpirun: 1
    rank, data parallel on 2 and 4 ranks, ZeRO-3 on 2, and the Megatron plan
    on 2 (tp2);
  - and, on one rank, the test suite's LLaMA-style model (RMSNorm, rotary
    embeddings, SwiGLU) at the same size, tdx next to eager;
  - big-model features on one rank, the test suite's GPT-2 at the bench
    size: torch.utils.checkpoint around each block (the step-time cost of
    the recompute and the memory it saves, tdx next to eager's own cost), a
    memory_budget 40% of the activations under the peak (tdx-recompute's
    choice, next to eager's checkpointed blocks),
    prog.memory_report()'s peak next to the binary's measured one, and bf16
    mixed precision (tdx.MixedPrecision) next to fp32 and to eager with the
    same casts (--part features runs only these);
  - tdx.auto_parallelize on (dp 2) and (dp 2, tp 2) for the GPT and the
    LLaMA, next to every hand plan of that mesh (data parallel with ZeRO 0,
    1 and 3, with the Megatron plan on tp), all timed in the same rounds,
    and the planner's time at 4, 32 and 80 layers (--part auto);
  - pipeline parallelism on 2 ranks (tdx.Pipeline: gpipe and 1f1b with 1 to
    8 micro-batches, interleaved-1f1b with 2 stages per rank, zb-h1): the step time
    next to eager's and tdx's on 1 rank, and the bubble each rank measured
    (the time it waited for its peers over the time it computed, mean of
    the ranks) next to the ideal (p-1)/m ((p-1)/(v m) interleaved) and the
    cost model's timeline (--part pipeline).

Every process uses one ATen thread. A step time is the mean of --steps steps
after one warm-up step, best of --rounds rounds that alternate between them.
Every tdx configuration's losses are checked against eager's. tdx's bytes
per step and peak tensor memory per rank are the binary's own (--verbose);
the peers' bytes are the payload their algorithm moves (gradients for DDP,
4 activations per layer for Megatron). This machine has 2 cores: 4 ranks
share them, so 4-rank times measure oversubscription as much as anything.

    . build/env.sh && "$TDX_PYTHON" bench/training/bench_training.py [--steps 10]
        [--part all|features|auto|pipeline]
"""

import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402

common.setup()  # before torch loads
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tdx  # noqa: E402
from common import BATCH, GPT_CONFIG as CONFIG, SEQ, arguments, profile_columns  # noqa: E402
from gpt_2x2 import GPT, MEGATRON_PLAN  # noqa: E402


def model():
    torch.manual_seed(0)
    return GPT(**CONFIG)


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=False)


def loss_fn(m, ids, targets):
    logits = m(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, CONFIG["vocab"], (BATCH, SEQ), generator=g),
             torch.randint(0, CONFIG["vocab"], (BATCH, SEQ), generator=g)) for _ in range(n)]


def eager(data):
    torch.set_num_threads(1)
    m = model()
    opt = optimizer(m.parameters())
    losses, t0 = [], None
    for k, batch in enumerate(data):
        if k == 1:
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(m, *batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = {k: v.detach().clone() for k, v in m.state_dict().items()}
    return (time.perf_counter() - t0) * 1e3 / (len(data) - 1), losses, state


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all_reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all_reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def megatron_model(rank, world):
    """The eager GPT with each block's wq/wk/wv/fc split by output features
    and wo/proj by input features over `world` ranks (this rank's shards of
    the same weights), the rest replicated."""
    m = model()
    for block in m.h:
        d = block.wq.in_features
        for name in ("wq", "wk", "wv", "fc"):
            lin = getattr(block, name)
            w, b = lin.weight.detach().chunk(world)[rank], lin.bias.detach().chunk(world)[rank]
            new = torch.nn.Linear(lin.in_features, w.shape[0])
            new.weight.data.copy_(w)
            new.bias.data.copy_(b)
            setattr(block, name, new)
        for name in ("wo", "proj"):
            # Row-parallel: the local matmul, then the bias once after the
            # all_reduce (replicated, as Megatron's RowParallelLinear).
            lin = getattr(block, name)
            w = lin.weight.detach().chunk(world, dim=1)[rank]
            new = torch.nn.Linear(w.shape[1], lin.out_features, bias=False)
            new.weight.data.copy_(w)
            setattr(block, name, new)
            setattr(block, name + "_bias", torch.nn.Parameter(lin.bias.detach().clone()))
        heads = block.heads // world

        def forward(x, block=block, heads=heads, d=d):
            b, t, _ = x.shape
            h = _CopyToTP.apply(block.ln_1(x))
            split = lambda y: y.view(b, t, heads, d // block.heads).transpose(1, 2)
            q, k, v = split(block.wq(h)), split(block.wk(h)), split(block.wv(h))
            att = (q @ k.transpose(-2, -1) / (d // block.heads) ** 0.5).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d // world)
            x = x + _ReduceFromTP.apply(block.wo(y)) + block.wo_bias
            h = _CopyToTP.apply(block.ln_2(x))
            mlp = block.proj(F.gelu(block.fc(h), approximate="tanh"))
            return x + _ReduceFromTP.apply(mlp) + block.proj_bias
        block.forward = forward
    return m


def timed_steps(data, step):
    """Each rank's loop of a gloo peer: step(batch) -> its loss (a float)
    for every batch; (the mean ms of a step after the first, the losses),
    the ranks meeting at a barrier where the timing starts and ends."""
    t0, losses = None, []
    for k, batch in enumerate(data):
        if k == 1:
            dist.barrier()
            t0 = time.perf_counter()
        losses.append(step(batch))
    dist.barrier()
    return (time.perf_counter() - t0) * 1e3 / (len(data) - 1), losses


def gloo_worker(rank, world, peer, data, port, out):
    """One rank of a gloo peer: "ddp" (DDP on this rank's part of each batch)
    or "megatron" (hand-written tensor parallelism on the whole batch)."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if peer == "ddp":
        m = torch.nn.parallel.DistributedDataParallel(model())
        part = lambda batch: tuple(t.chunk(world)[rank] for t in batch)
    else:
        m = megatron_model(rank, world)
        part = lambda batch: batch
    opt = optimizer(m.parameters())

    def step(batch):
        opt.zero_grad()
        loss = loss_fn(m, *part(batch))
        loss.backward()
        opt.step()
        return loss.item()

    ms, losses = timed_steps(data, step)
    if rank == 0:
        state = (m.module if peer == "ddp" else m).state_dict()
        # numpy arrays travel by value (a tensor's shared memory dies with this process).
        out.put((ms, losses, {k: v.detach().numpy().copy() for k, v in state.items()}))
    dist.destroy_process_group()


def spawned(worker, world, *args):
    """What rank 0 of worker(rank, world, *args, out) puts in `out`, run on
    `world` spawned processes. Read before joining: rank 0 exits only once
    its result is through the pipe."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = mp.spawn(worker, args=(world, *args, out), nprocs=world, join=False)
    got = out.get()
    while not procs.join():
        pass
    return got


def gloo(peer, data, world, port):
    """(step ms, rank 0's losses, rank 0's final state_dict) of a gloo peer on
    `world` processes."""
    ms, losses, state = spawned(gloo_worker, world, peer, data, port)
    return ms, losses, {k: torch.from_numpy(v) for k, v in state.items()}


# name: (mesh shape, mesh axes, zero); an axis is "dp" (data parallel) or "tp".
CONFIGS = {"tdx 1 rank": (None, None, 0), "tdx dp2": ((2,), ("dp",), 0),
           "tdx dp2 zero3": ((2,), ("dp",), 3), "tdx tp2": ((2,), ("tp",), 0),
           "tdx dp4": ((4,), ("dp",), 0)}


def compile_tdx(shape=None, axes=None, zero=0, fold=()):
    """(binary, compile seconds) of the step on a mesh of `shape` and `axes`
    (None: one rank): the batch split over "dp", the Megatron plan over "tp";
    `zero` and `fold` as tdx.parallelize takes them."""
    torch.manual_seed(0)
    deferred = tdx.deferred_init(lambda: GPT(**CONFIG))
    prog = tdx.trace_train_step(deferred, optimizer(deferred.parameters()), loss_fn,
                                *batches(1)[0])
    if shape:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes),
                        MEGATRON_PLAN if "tp" in axes else {},
                        data_parallel="dp" if "dp" in axes else None, zero=zero, fold=fold)
    t0 = time.perf_counter()
    exe = tdx.compile(prog)
    return exe, time.perf_counter() - t0


def run_tdx(exe, data, weights):
    losses, _ = exe.train(data, params=weights, verbose=True)
    log = exe.last_log
    # The binary prints the bytes all ranks sent per step: per rank here.
    sent = re.search(r"(\d+) ranks: init [\d.]+ ms, step [\d.]+ ms, (\d+) bytes communicated", log)
    peaks = [int(p) for p in re.findall(r"peak tensor memory in a step (\d+) bytes", log)]
    per_rank = int(sent.group(2)) // int(sent.group(1)) if sent else 0
    return exe.last_step_ms(), losses, per_rank, max(peaks)


def collective_ms(log):
    return float(re.search(r"collectives ([\d.]+) ms", log).group(1))


def tdx_profile(exe, data, weights):
    """Rank 0's collective time per step (ms) with overlap (exposed) and
    without (--no-overlap: whole), best of 3 runs each, and its working
    memory of a step, measured and planned (bytes)."""
    exposed = whole = float("inf")
    for _ in range(3):
        exe.train(data, params=weights, verbose=True, profile=True)
        exposed, log = min(exposed, collective_ms(exe.last_log)), exe.last_log
        exe.train(data, params=weights, profile=True, overlap=False)
        whole = min(whole, collective_ms(exe.last_log))
    memory = re.search(r"rank 0: working memory of a step (\d+) bytes \(planned (-?\d+)", log)
    return dict(exposed=exposed, whole=whole, working=int(memory.group(1)),
                planned=int(memory.group(2)))


def eager_memory(data):
    """Eager's peak tensor memory and working memory of a training step,
    measured as the binaries measure theirs (tdx.working_memory, in a process
    of its own)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_eager_memory, args=(data[:3], q))
    p.start()
    got = q.get(timeout=600)
    p.join(timeout=60)
    return got


def _eager_memory(data, out):
    torch.set_num_threads(1)
    tdx.working_memory(lambda: None, warmup=0)  # the pool counts from here on
    m = model()
    opt = optimizer(m.parameters())
    batches = iter(data)

    def step():
        opt.zero_grad()
        loss_fn(m, *next(batches)).backward()
        opt.step()

    got = tdx.working_memory(step, warmup=2)
    out.put((got["peak"], got["working"]))


def main():
    args = arguments(__doc__, steps=10, rounds=3, part="all")
    if args.part == "features":
        print_features(args.rounds, args.steps)
        return
    if args.part == "auto":
        print_auto(args.rounds, args.steps)
        return
    if args.part == "pipeline":
        print_pipeline(args.rounds, args.steps)
        return
    data = batches(args.steps + 1)
    weights = {k: v.detach() for k, v in model().state_dict().items()}
    exes = {name: compile_tdx(*config) for name, config in CONFIGS.items()}
    best, facts = {}, {}
    port = 29600
    keep = lambda key, ms: best.__setitem__(key, min(best.get(key, ms), ms))
    for _ in range(args.rounds):
        e_ms, want, _ = eager(data)
        keep("torch eager", e_ms)
        for name, (exe, _) in exes.items():
            ms, got, sent, peak = run_tdx(exe, data, weights)
            keep(name, ms)
            facts[name] = (sent, peak)
            worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
            assert worst < 1e-4, f"{name}: loss off eager's by {worst:.2e}"
        for world in (2, 4):
            port += 1
            keep(f"DDP gloo {world}", gloo("ddp", data, world, port)[0])
        port += 1
        m_ms, m_losses, _ = gloo("megatron", data, 2, port)
        keep("Megatron gloo 2", m_ms)
        worst = max(abs(a - b) / abs(b) for a, b in zip(m_losses, want))
        assert worst < 1e-4, f"hand-written Megatron: loss off eager's by {worst:.2e}"
    profiles = {name: tdx_profile(exe, data, weights) for name, (exe, _) in exes.items()}
    eager_peak, eager_working = eager_memory(data)
    grads = sum(p.numel() * 4 for p in model().parameters())
    activation = BATCH * SEQ * CONFIG["d"] * 4
    peers = {"tdx 1 rank": ("torch eager", 0), "tdx dp2": ("DDP gloo 2", grads),
             "tdx dp2 zero3": ("DDP gloo 2", grads), "tdx dp4": ("DDP gloo 4", grads),
             "tdx tp2": ("Megatron gloo 2", 4 * CONFIG["layers"] * activation)}
    print(f"GPT {CONFIG}, batch {BATCH}x{SEQ}, AdamW, {args.steps} steps x best of "
          f"{args.rounds} rounds, 1 ATen thread per process")
    print("tdx compile: " + ", ".join(f"{name} {t:.0f} s" for name, (_, t) in exes.items()))
    print("bytes/step: payload per rank per step; peak MiB: tdx's largest rank (state and "
          "working memory); work MiB: rank 0's working memory of a step, measured (planned); "
          "exposed: rank 0's collective time per step with overlap / without (--no-overlap)")
    print(f"torch eager, measured the same way (tdx.working_memory): peak "
          f"{eager_peak / 2**20:.2f} MiB, working memory {eager_working / 2**20:.2f} MiB (its "
          f"gradients stay between steps)")
    print(f"{'config':>14} | {'tdx ms':>8} {'bytes/step':>11} {'peak MiB':>8} "
          f"{'work MiB':>13} {'exposed':>16} | "
          f"{'peer':>15} {'peer ms':>8} {'bytes/step':>11} | {'peer/tdx':>8}")
    for name in CONFIGS:
        peer, peer_bytes = peers[name]
        sent, peak = facts[name]
        prof = profiles[name]
        exposed, work = profile_columns(prof)
        print(f"{name:>14} | {best[name]:>8.2f} {sent:>11} {peak / 2**20:>8.2f} "
              f"{work:>13} {exposed:>16} | "
              f"{peer:>15} {best[peer]:>8.2f} {peer_bytes:>11} | "
              f"{best[peer] / best[name]:>8.2f}")
    print_llama(args.rounds, args.steps)
    print_features(args.rounds, args.steps)
    print_auto(args.rounds, args.steps)
    print_pipeline(args.rounds, args.steps)


LLAMA = dict(vocab=512, d=128, heads=4, hidden=344, layers=4, context=64)


def llama_one_rank(rounds=3, steps=10):
    """The LLaMA-style model of the test suite (RMSNorm, rotary embeddings,
    SwiGLU; test/python/models.py) at this bench's size: tdx's AdamW step on
    one rank next to eager's, best of `rounds` alternating rounds; returns
    (tdx ms, eager ms)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "test", "python"))
    from models import Llama
    build = lambda: Llama(**LLAMA)
    data = batches(steps + 1)
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    prog = tdx.trace_train_step(deferred, optimizer(deferred.parameters()), loss_fn, *data[0])
    exe = tdx.compile(prog)
    torch.manual_seed(0)
    eager = build()
    # Non-persistent buffers (the rotary tables) too: the binary's state.
    weights = {k: v.detach() for k, v in
               dict(eager.named_parameters(), **dict(eager.named_buffers())).items()}
    best_tdx = best_eager = float("inf")
    for _ in range(rounds):
        exe.train(data, params=weights, verbose=True)
        best_tdx = min(best_tdx, exe.last_step_ms())
        best_eager = min(best_eager, eager_step_ms(build, data))
    return best_tdx, best_eager


def print_llama(rounds, steps):
    t_ms, e_ms = llama_one_rank(rounds, steps)
    print(f"LLaMA {LLAMA}, AdamW, 1 rank: tdx {t_ms:.2f} ms, torch eager {e_ms:.2f} ms, "
          f"tdx/eager {t_ms / e_ms:.2f}")


def gpt2_variant(checkpoint=None):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "test", "python"))
    from models import GPT2
    return lambda: GPT2(vocab=CONFIG["vocab"], d=CONFIG["d"], heads=CONFIG["heads"],
                        layers=CONFIG["layers"], context=CONFIG["context"], checkpoint=checkpoint)


def eager_step_ms(build, data, casts=False):
    """Eager's AdamW loop on `data` (ms per step after the first); with
    `casts`, each step computes on a bf16 copy of the fp32 weights."""
    from torch.nn.utils.stateless import _reparametrize_module
    torch.manual_seed(0)
    m = build()
    opt = optimizer(m.parameters())
    t0 = None
    for k, batch in enumerate(data):
        if k == 1:
            t0 = time.perf_counter()
        opt.zero_grad()
        if casts:
            copies = {n: p.detach().bfloat16().requires_grad_() for n, p in m.named_parameters()}
            with _reparametrize_module(m, dict(copies, **{"lm_head.weight": copies["wte.weight"]})):
                loss = loss_fn(m, *batch)
            loss.backward()
            for n, p in m.named_parameters():
                p.grad = copies[n].grad.float()
        else:
            loss_fn(m, *batch).backward()
        opt.step()
    return (time.perf_counter() - t0) * 1e3 / (len(data) - 1)


def print_features(rounds, steps):
    """Recompute, the memory report and bf16 on one rank (GPT-2, bench size)."""
    data = batches(steps + 1)
    # (torch.utils.checkpoint, mixed precision, the share of fp32's
    # activation bytes a memory_budget takes off its peak)
    rows = {"fp32": (None, None, 0), "checkpointed blocks": ("reentrant", None, 0),
            "budget -40% activ.": (None, None, 0.4),
            "bf16 mixed precision": (None, tdx.MixedPrecision(torch.bfloat16, torch.float32), 0)}
    exes, reports = {}, {}
    for name, (checkpoint, policy, cut) in rows.items():
        build = gpt2_variant(checkpoint)
        torch.manual_seed(0)
        deferred = tdx.deferred_init(build)
        prog = tdx.trace_train_step(deferred, optimizer(deferred.parameters()), loss_fn, *data[0])
        budget = int(reports["fp32"]["peak"] - cut * reports["fp32"]["activations"]) if cut else None
        if policy or budget:
            tdx.parallelize(prog, tdx.init_device_mesh("cpu", (1,), ("dp",)), {},
                            mixed_precision=policy, memory_budget=budget)
        reports[name] = prog.memory_report()
        exes[name] = tdx.compile(prog)
    torch.manual_seed(0)
    weights = {k: v.detach() for k, v in gpt2_variant()().state_dict().items()}
    best = {}
    keep = lambda key, ms: best.__setitem__(key, min(best.get(key, ms), ms))
    peaks = {}
    for _ in range(rounds):
        for name, exe in exes.items():
            exe.train(data, params=weights, verbose=True)
            keep(name, exe.last_step_ms())
            peaks[name] = max(int(p) for p in re.findall(
                r"peak tensor memory in a step (\d+) bytes", exe.last_log))
        keep("eager fp32", eager_step_ms(gpt2_variant(), data))
        keep("eager checkpointed", eager_step_ms(gpt2_variant("reentrant"), data))
        keep("eager bf16 casts", eager_step_ms(gpt2_variant(), data, casts=True))
    peers = {"fp32": "eager fp32", "checkpointed blocks": "eager checkpointed",
             "budget -40% activ.": "eager checkpointed", "bf16 mixed precision": "eager bf16 casts"}
    print(f"\nGPT-2 (test/python/models.py) {CONFIG}, batch {BATCH}x{SEQ}, AdamW, 1 rank: "
          f"recompute, memory report and bf16")
    print(f"{'config':>21} | {'tdx ms':>7} {'x fp32':>6} {'peak MiB':>8} {'report MiB':>10} | "
          f"{'peer':>18} {'peer ms':>8} {'x fp32':>6} | {'peer/tdx':>8}")
    for name in rows:
        peer = peers[name]
        print(f"{name:>21} | {best[name]:>7.2f} {best[name] / best['fp32']:>6.2f} "
              f"{peaks[name] / 2**20:>8.2f} {reports[name]['peak'] / 2**20:>10.2f} | "
              f"{peer:>18} {best[peer]:>8.2f} {best[peer] / best['eager fp32']:>6.2f} | "
              f"{best[peer] / best[name]:>8.2f}")



def auto_models():
    """name: (builder, its Megatron hand plan) of the models print_auto plans."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "test", "python"))
    from models import Llama
    llama_plan = {f"layers.*.{n}": tdx.ColwiseParallel() for n in ("wq", "wk", "wv", "w1", "w3")}
    llama_plan.update({f"layers.*.{n}": tdx.RowwiseParallel() for n in ("wo", "w2")})
    return {"GPT": (lambda: GPT(**CONFIG), MEGATRON_PLAN), "LLaMA": (lambda: Llama(**LLAMA), llama_plan)}


def traced_step(build, data):
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    return tdx.trace_train_step(deferred, optimizer(deferred.parameters()), loss_fn, *data[0])


def print_auto(rounds, steps):
    """tdx.auto_parallelize next to every hand plan of the same mesh, each
    compiled and timed in the same rounds; then the planner's own time
    against depth."""
    data = batches(steps + 1)
    meshes = {"(dp 2)": ((2,), ("dp",)), "(dp 2, tp 2)": ((2, 2), ("dp", "tp"))}
    print(f"\nAutomatic plans (tdx.auto_parallelize) against the hand plans, AdamW, batch "
          f"{BATCH}x{SEQ}, {steps} steps x best of {rounds} rounds")
    print(f"{'model':>6} {'mesh':>13} | {'best hand plan':>24} {'ms':>7} | "
          f"{'auto plan':>24} {'ms':>7} {'search s':>8} | {'auto/best':>9}")
    for model_name, (build, hand_plan) in auto_models().items():
        torch.manual_seed(0)
        eager = build()
        weights = {k: v.detach() for k, v in
                   dict(eager.named_parameters(), **dict(eager.named_buffers())).items()}
        for mesh_name, (shape, axes) in meshes.items():
            mesh = tdx.init_device_mesh("cpu", shape, axes)
            plan = hand_plan if "tp" in axes else {}
            hands, texts = {}, {}
            for zero in (0, 1, 3):
                prog = tdx.parallelize(traced_step(build, data), mesh, plan, data_parallel="dp",
                                       zero=zero)
                name = f"{'Megatron + ' if plan else ''}zero={zero}"
                hands[name], texts[name] = tdx.compile(prog), prog.mlir
            prog = traced_step(build, data)
            t0 = time.perf_counter()
            chosen = tdx.auto_parallelize(prog, mesh)
            search = time.perf_counter() - t0
            # The auto plan may be a hand plan: then it is that program, and
            # its time is that program's (timing one program twice would
            # only compare the noise).
            same = next((n for n in hands if texts[n] == prog.mlir), None)
            timed = dict(hands) if same else dict(hands, auto=tdx.compile(prog))
            best = {}
            for _ in range(rounds):
                for name, exe in timed.items():
                    exe.train(data, params=weights, verbose=True)
                    best[name] = min(best.get(name, float("inf")), exe.last_step_ms())
            hand = min(hands, key=lambda n: best[n])
            sequence = any(type(p).__name__ == "SequenceParallel" for p in chosen["plan"].values())
            label = (f"{'Megatron + ' if chosen['plan'] else ''}{'SP + ' if sequence else ''}"
                     f"zero={chosen['zero']}")
            auto_ms = best[same] if same else best["auto"]
            print(f"{model_name:>6} {mesh_name:>13} | {hand:>24} {best[hand]:>7.2f} | "
                  f"{label:>24} {auto_ms:>7.2f} {search:>8.2f} | {auto_ms / best[hand]:>9.3f}")
            print(" " * 23 + "every hand plan: " +
                  ", ".join(f"{n} {best[n]:.2f}" for n in hands) +
                  (f"; the auto plan is the program of hand plan {same}" if same else ""))
    from models import Llama  # on the path auto_models() gave
    print("search time against depth (LLaMA d 48, AdamW, (dp 2, tp 2)):")
    for layers in (4, 32, 80):
        prog = traced_step(lambda: Llama(vocab=512, d=48, heads=4, hidden=96, layers=layers,
                                         context=64), data)
        t0 = time.perf_counter()
        tdx.auto_parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("dp", "tp")))
        print(f"  {layers:>3} layers: {time.perf_counter() - t0:.2f} s")


def model_bubble(prog):
    """The idle over the busy time of the pipeline's ranks (mean) in the
    schedule tdx-schedule-pipeline timed by the cost model."""
    bubble = prog.pipeline_report()["bubble"]
    return sum(bubble) / len(bubble)


def print_pipeline(rounds, steps):
    """The bench GPT on 2 pipeline ranks by schedule and micro-batches: step
    time, and the bubble measured by the ranks next to the ideal and the
    cost model's."""
    data = batches(steps + 1)
    weights = {k: v.detach() for k, v in model().state_dict().items()}
    configs = [("gpipe", m, 1) for m in (1, 2, 4, 8)] + [("1f1b", m, 1) for m in (2, 4, 8)] + \
        [("interleaved-1f1b", m, 2) for m in (2, 4, 8)] + [("zb-h1", m, 1) for m in (2, 4, 8)]
    p = 2
    exes = {}
    for schedule, m, v in configs:
        torch.manual_seed(0)
        deferred = tdx.deferred_init(lambda: GPT(**CONFIG))
        prog = tdx.trace_train_step(deferred, optimizer(deferred.parameters()), loss_fn,
                                    *batches(1)[0])
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (p,), ("pp",)), {},
                        pipeline=tdx.Pipeline("pp", microbatches=m, schedule=schedule,
                                              stages_per_rank=v))
        exes[(schedule, m, v)] = (tdx.compile(prog), model_bubble(prog))
    one, _ = compile_tdx()
    best, bubble = {}, {}
    for _ in range(rounds):
        e_ms, want, _ = eager(data)
        best["eager"] = min(best.get("eager", e_ms), e_ms)
        ms, got, _, _ = run_tdx(one, data, weights)
        best["tdx 1 rank"] = min(best.get("tdx 1 rank", ms), ms)
        for key, (exe, _) in exes.items():
            ms, got, _, _ = run_tdx(exe, data, weights)
            worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
            assert worst < 1e-4, f"{key}: loss off eager's by {worst:.2e}"
            if ms < best.get(key, float("inf")):
                best[key] = ms
                waits = [float(w) for w in re.findall(
                    r"waited ([\d.]+) ms per step for its pipeline peers", exe.last_log)]
                bubble[key] = sum(w / max(ms - w, 1e-9) for w in waits) / len(waits)
    print(f"\nPipeline parallelism on {p} ranks (tdx.Pipeline), GPT {CONFIG}, batch "
          f"{BATCH}x{SEQ} in m micro-batches, AdamW, {steps} steps x best of {rounds} rounds; "
          f"eager (1 process, whole batch) {best['eager']:.2f} ms, tdx 1 rank "
          f"{best['tdx 1 rank']:.2f} ms")
    print("bubble: a rank's time waiting for its peers over its time computing, mean of the "
          "ranks (measured), next to (p-1)/m ((p-1)/(v m) interleaved) and the cost model's")
    print(f"{'schedule':>17} {'m':>3} {'v':>2} | {'tdx ms':>8} {'eager/tdx':>9} | "
          f"{'bubble':>7} {'(p-1)/vm':>8} {'model':>7}")
    for key, (_, modeled) in exes.items():
        schedule, m, v = key
        print(f"{schedule:>17} {m:>3} {v:>2} | {best[key]:>8.2f} {best['eager'] / best[key]:>9.2f} | "
              f"{bubble[key]:>7.3f} {(p - 1) / (v * m):>8.3f} {modeled:>7.3f}")


if __name__ == "__main__":
    main()
