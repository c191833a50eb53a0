"""tdx next to the systems a user would pick instead, in one run, on the same
model (bench_training's GPT), batch, AdamW step and steps:

  - 1 rank: torch eager; torch.compile (inductor, CPU; its first step is
    its compile) next to tdx's 1-rank binary (and tdx's trace + place +
    compile time next to torch.compile's first step);
  - data parallel on 2 and 4 ranks: DDP next to tdx's data parallelism;
    FSDP2 (``fully_shard`` per block and the root) next to tdx's ZeRO-3,
    and FSDP2 without ``reshard_after_forward`` (one all-gather a step)
    next to tdx's ZeRO-2 (one all-gather a step, after the update);
  - tensor parallel on 2 ranks: DTensor's ``parallelize_module`` with the
    Megatron plan (ColwiseParallel q, k, v, fc; RowwiseParallel wo, proj),
    next to tdx's same plan;
  - 2x2: FSDP2 over dp on top of that tensor parallelism, next to tdx's
    (dp 2, tp 2) with the same plan;
  - pipeline on 2 ranks: torch.distributed.pipelining's Schedule1F1B with 4
    micro-batches (the blocks split in half, the tied embedding's two
    copies' gradients summed as Megatron does), next to tdx.Pipeline 1f1b
    with 4.

Each line: the step time, its ratio to the torch peer of that layout (how
many times faster tdx is: > 1 is tdx faster), the bytes one rank sends per
step, and memory per rank. Bytes are what one rank hands to collectives
per step, each call's input (an all-reduce's or reduce-scatter's whole
input, an all-gather's shard, a send's buffer; what goes on the wire
depends on the collective's algorithm): tdx's are its binary's own count
(--verbose), the peers' their algorithm's (DDP: an all-reduce of the
gradients; FSDP2: all-gathers of the parameters' shards, two or one, and a
reduce-scatter of the gradients; tensor parallelism: 4 all-reduces of
activations per block; FSDP2 + TP: both, of a tp rank's half; pipelining:
the activations or their gradients across the cut and the tied gradient's
all-reduce). tdx's memory is its binary's peak tensor memory of a step;
the peers' memory is what
a rank process's peak resident set grew by from its start to the end of
the steps (model, optimizer state and the steps' tensors; torch's CPU
allocator keeps no tensor count, and freed memory it keeps counts too), so
the memory columns are not the same measure. Every process uses
one ATen thread; a step time is the mean of --steps steps after one
warm-up step, best of --rounds rounds. Every configuration's losses are
checked against eager's (1e-4 relative). This machine has 2 cores: 4 ranks
oversubscribe it.

    . build/env.sh && "$TDX_PYTHON" bench/training/bench_peers.py [--steps 8] [--rounds 2]
"""

import functools
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

common.setup()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tdx  # noqa: E402
from bench_training import (BATCH, CONFIG, SEQ, batches, compile_tdx, eager, loss_fn, spawned,  # noqa: E402
                            model, optimizer, run_tdx, timed_steps)
from gpt_2x2 import GPT  # noqa: E402

MICRO = 4  # pipeline micro-batches


@functools.lru_cache(maxsize=None)
def _params_bytes(tp=1):
    """Bytes of the parameters one rank holds under the Megatron plan over
    `tp` ranks (q, k, v, fc split by rows, wo and proj by columns with their
    biases whole; the rest replicated); a tied tensor once."""
    split = {"wq", "wk", "wv", "fc", "wo", "proj"}
    total = 0
    for name, p in model().named_parameters():
        parts = name.split(".")
        cut = tp if parts[-2] in split and not (parts[-2] in ("wo", "proj") and
                                                 parts[-1] == "bias") else 1
        total += p.numel() * p.element_size() // cut
    return total


def _act_bytes(batch=BATCH):
    return batch * SEQ * CONFIG["d"] * 4


def payload(kind, world):
    """The bytes one rank hands to collectives per step in the peer's
    algorithm: each call's input, as tdx's binary counts its own (an
    all-reduce's or a reduce-scatter's whole input, an all-gather's shard,
    a send's buffer)."""
    p, a, layers = _params_bytes(), _act_bytes(), CONFIG["layers"]
    if kind == "ddp":
        return p  # the gradients' all-reduce
    if kind == "fsdp":  # all-gathers before the forward and the backward, a reduce-scatter
        return 2 * p / world + p
    if kind == "fsdp-keep":  # no second all-gather
        return p / world + p
    if kind == "tp":
        return 4 * layers * a  # two all-reduces per block each way
    if kind == "fsdp+tp":  # tp on half the batch; FSDP2 over dp of a tp rank's parameters
        mine = _params_bytes(tp=2)
        return 4 * layers * _act_bytes(BATCH // 2) + 2 * mine / 2 + mine
    if kind == "pp":  # activations or their gradients across the cut, the tied gradient
        return a + CONFIG["vocab"] * CONFIG["d"] * 4
    raise ValueError(kind)


def _megatron_tp(m, mesh):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    for block in m.h:
        parallelize_module(block, mesh, {
            "wq": ColwiseParallel(use_local_output=False),
            "wk": ColwiseParallel(use_local_output=False),
            "wv": ColwiseParallel(use_local_output=False),
            "wo": RowwiseParallel(input_layouts=Shard(-1)),
            "fc": ColwiseParallel(), "proj": RowwiseParallel()})
    return m


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_start():
    """This process's resident set now, and its high-water mark reset to
    it (clear_refs 5): a spawned process inherits its parent's mark."""
    start = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return start


def _rss_growth(start):
    """The peak resident set since _rss_start, over the resident set then:
    the memory the model, its optimizer and the steps took."""
    return _status("VmHWM") - start


def worker(rank, world, kind, data, port, out):
    rss = _rss_start()
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    m = model()
    whole = lambda batch: batch  # noqa: E731
    part = lambda batch: tuple(t.chunk(world)[rank] for t in batch)  # noqa: E731
    split = part
    if kind == "ddp":
        m = torch.nn.parallel.DistributedDataParallel(m)
    elif kind.startswith("fsdp") and kind != "fsdp+tp":
        mesh = init_device_mesh("cpu", (world,))
        reshard = kind == "fsdp"
        for block in m.h:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    elif kind == "tp":
        _megatron_tp(m, init_device_mesh("cpu", (world,)))
        split = whole
    elif kind == "fsdp+tp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        _megatron_tp(m, mesh["tp"])
        for block in m.h:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(m, mesh=mesh["dp"])
        split = lambda batch: tuple(t.chunk(2)[rank // (world // 2)] for t in batch)  # noqa
    if kind == "pp":
        return _pipeline_worker(rank, world, m, data, out, rss)
    opt = optimizer(m.parameters())

    def step(batch):
        opt.zero_grad()
        loss = loss_fn(m, *split(batch))
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the global batch's loss (tp ranks: the same one)
        return mean.item() / world

    ms, losses = timed_steps(data, step)
    if rank == 0:
        out.put((ms, losses, _rss_growth(rss)))
    dist.destroy_process_group()


class _First(torch.nn.Module):
    def __init__(self, m, blocks):
        super().__init__()
        self.wte, self.wpe, self.h = m.wte, m.wpe, torch.nn.ModuleList(blocks)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        return x


class _Last(torch.nn.Module):
    def __init__(self, m, blocks):
        super().__init__()
        self.h, self.ln_f = torch.nn.ModuleList(blocks), m.ln_f
        self.lm_head = torch.nn.Linear(CONFIG["d"], CONFIG["vocab"], bias=False)
        self.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone())

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _pipeline_worker(rank, world, m, data, out, rss):
    """One stage of torch.distributed.pipelining's 1F1B on 2 ranks."""
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    half = len(m.h) // 2
    stage_module = _First(m, list(m.h)[:half]) if rank == 0 else _Last(m, list(m.h)[half:])
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    mean_ce = lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]),  # noqa
                                                y.reshape(-1))
    schedule = Schedule1F1B(stage, MICRO, loss_fn=mean_ce)
    tied = stage_module.wte.weight if rank == 0 else stage_module.lm_head.weight
    opt = optimizer(stage_module.parameters())

    def step(batch):
        ids, y = batch
        opt.zero_grad()
        micro = []
        if rank == 0:
            schedule.step(ids)
        else:
            schedule.step(target=y, losses=micro)
        # The embedding and the head are one tensor in the model: their
        # two copies' gradients summed, as Megatron's pipeline does.
        dist.all_reduce(tied.grad)
        opt.step()
        loss = torch.stack(micro).mean() if micro else torch.zeros(())
        dist.all_reduce(loss)
        return loss.item()

    ms, losses = timed_steps(data, step)
    if rank == 0:
        out.put((ms, losses, _rss_growth(rss)))
    dist.destroy_process_group()


def peer(kind, world, data, port):
    return spawned(worker, world, kind, data, port)


def compile_worker(rank, world, data, out):
    out.put(compiled(data))


def compiled_apart(data):
    """compiled() in a process of its own: inductor's compile workers end
    with it instead of sharing the cores with what is timed after."""
    return spawned(compile_worker, 1, data)


def compiled(data):
    """torch.compile (inductor): (first step ms, steady step ms, losses)."""
    torch.set_num_threads(1)
    torch._dynamo.reset()
    m = model()
    opt = optimizer(m.parameters())
    step_model = torch.compile(m)
    losses, first, t0 = [], None, None
    for k, batch in enumerate(data):
        start = time.perf_counter()
        if k == 1:
            t0 = start
        opt.zero_grad()
        loss = loss_fn(step_model, *batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if k == 0:
            first = (time.perf_counter() - start) * 1e3
    return first, (time.perf_counter() - t0) * 1e3 / (len(data) - 1), losses


def tdx_pipeline():
    torch.manual_seed(0)
    deferred = tdx.deferred_init(lambda: GPT(**CONFIG))
    prog = tdx.trace_train_step(deferred, optimizer(deferred.parameters()), loss_fn,
                                *batches(1)[0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("pp",)), {},
                    pipeline=tdx.Pipeline("pp", microbatches=MICRO, schedule="1f1b"))
    t0 = time.perf_counter()
    return tdx.compile(prog), time.perf_counter() - t0


def main():
    args = common.arguments(__doc__, steps=8, rounds=2)
    data = batches(args.steps + 1)
    weights = {k: v.detach() for k, v in model().state_dict().items()}
    t0 = time.perf_counter()
    tdx_one = compile_tdx()  # trace + place + compile, timed whole below
    first_tdx = (time.perf_counter() - t0) * 1e3
    exes = {"1": tdx_one, "tp2": compile_tdx((2,), ("tp",)),
            **{f"dp{w}{z}": compile_tdx((w,), ("dp",), int(z[-1]) if z else 0)
               for w in (2, 4) for z in ("", " zero2", " zero3")},
            "2x2": compile_tdx((2, 2), ("dp", "tp")), "pp2 1f1b": tdx_pipeline()}
    peers = {"DDP dp2": ("ddp", 2), "FSDP2 dp2": ("fsdp", 2),
             "FSDP2 dp2 no-reshard": ("fsdp-keep", 2), "DDP dp4": ("ddp", 4),
             "FSDP2 dp4": ("fsdp", 4), "FSDP2 dp4 no-reshard": ("fsdp-keep", 4),
             "DTensor tp2": ("tp", 2), "FSDP2+DTensor 2x2": ("fsdp+tp", 4),
             "pipelining pp2 1F1B": ("pp", 2)}
    best, facts, port = {}, {}, 29800
    keep = lambda key, ms: best.__setitem__(key, min(best.get(key, ms), ms))  # noqa: E731
    first_compile = None
    for _ in range(args.rounds):
        rss = _rss_start()
        ms, want, _ = eager(data)
        keep("torch eager", ms)
        facts["torch eager"] = (0, _rss_growth(rss))
        first, ms, got = compiled_apart(data)
        first_compile = first if first_compile is None else min(first_compile, first)
        keep("torch.compile", ms)
        facts["torch.compile"] = (0, None)
        check("torch.compile", got, want)
        for name, (exe, _) in exes.items():
            ms, got, sent, peak = run_tdx(exe, data, weights)
            keep("tdx " + name, ms)
            facts["tdx " + name] = (sent, peak)
            check("tdx " + name, got, want)
        for name, (kind, world) in peers.items():
            port += 1
            ms, got, rss = peer(kind, world, data, port)
            keep(name, ms)
            facts[name] = (payload(kind, world), rss)
            check(name, got, want)
    rows = [("1 rank", "torch eager", ["tdx 1"]), ("1 rank", "torch.compile", ["tdx 1"])]
    for world in (2, 4):  # each peer beside tdx's plan that communicates as it does
        rows += [(f"dp{world}", f"DDP dp{world}", [f"tdx dp{world}"]),
                 (f"dp{world}", f"FSDP2 dp{world}", [f"tdx dp{world} zero3"]),
                 (f"dp{world}", f"FSDP2 dp{world} no-reshard", [f"tdx dp{world} zero2"])]
    rows += [("tp2", "DTensor tp2", ["tdx tp2"]), ("2x2", "FSDP2+DTensor 2x2", ["tdx 2x2"]),
             ("pp2", "pipelining pp2 1F1B", ["tdx pp2 1f1b"])]
    print(f"GPT {CONFIG}, batch {BATCH}x{SEQ}, AdamW, {args.steps} steps x best of "
          f"{args.rounds} rounds, one ATen thread per process")
    print(f"{'layout':7} {'peer':24} {'ms':>8} {'tdx plan':16} {'ms':>8} {'speedup':>8} "
          f"{'peer KiB':>9} {'tdx KiB':>8} {'peer +RSS MiB':>13} {'tdx peak MiB':>12}")
    mib = lambda b: "-" if not b else f"{b / 2**20:.1f}"  # noqa: E731
    for layout, p, ours in rows:
        for o in ours:
            print(f"{layout:7} {p:24} {best[p]:8.2f} {o[4:]:16} {best[o]:8.2f} "
                  f"{best[p] / best[o]:7.2f}x {facts[p][0] / 1024:9.1f} "
                  f"{facts[o][0] / 1024:8.1f} {mib(facts[p][1]):>13} {mib(facts[o][1]):>12}")
    print(f"\nfirst step: torch.compile {first_compile:.0f} ms (dynamo + inductor); tdx trace + "
          f"place + compile {first_tdx:.0f} ms (compile cache as found; "
          f"{'cold' if not tdx_one[0].from_cache else 'warm'}), then its first step")


def check(name, got, want):
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    assert worst < 1e-4, f"{name}: loss off eager's by {worst:.2e}"


if __name__ == "__main__":
    main()
