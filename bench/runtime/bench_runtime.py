"""tdx model binaries next to their peers, in one run, on one GPT-style model
and one batch of token ids:

  - torch eager, one process (the numerical oracle and the 1-rank baseline);
  - a hand-written Megatron tensor-parallel forward on torch.distributed with
    the gloo backend (column-parallel q/k/v and fc, row-parallel wo and proj,
    one all_reduce after each row-parallel linear), on 1, 2 and 4 processes;
  - the tdx binary (tdx.compile of the same model with the same Megatron
    plan) under mpirun on 1, 2 and 4 ranks;
  - and, on one rank, the test suite's LLaMA-style model (RMSNorm, rotary
    embeddings, SwiGLU) at the same size, tdx next to eager.

Every process uses one ATen thread (the machine has 2 cores; 4 ranks are
oversubscribed for both peers alike). Step time is the mean of --steps
forwards after one warm-up, best of --rounds rounds; the rounds of eager,
tdx and gloo alternate, so a slow spell of this shared 2-core machine hits
all three alike. Bytes are what all ranks send per step. A last tdx run with
--profile splits rank 0's step into ATen calls, fused kernels, collectives
and the rest: "overhead" is that rest over the ATen calls and kernels.

    . build/env.sh && "$TDX_PYTHON" bench/runtime/bench_runtime.py [--steps 20]
"""

import math
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
from gpt_2x2 import GPT, MEGATRON_PLAN as PLAN  # noqa: E402


def eager_model():
    torch.manual_seed(0)
    return GPT(**CONFIG).eval()


def ids():
    return torch.randint(0, CONFIG["vocab"], (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def megatron_worker(rank, world, steps, rounds, port, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, x = eager_model(), ids()
    sd = model.state_dict()
    d, heads = CONFIG["d"], CONFIG["heads"]
    hl = heads // world
    col = lambda w: w.chunk(world, 0)[rank]
    row = lambda w: w.chunk(world, 1)[rank]
    sent = [0]

    def all_reduce(t):
        if world > 1:
            dist.all_reduce(t)
            sent[0] += t.numel() * t.element_size()
        return t

    def forward(tokens):
        b, t = tokens.shape
        h = F.embedding(tokens, sd["wte.weight"]) + sd["wpe.weight"][:t]
        for i in range(CONFIG["layers"]):
            p = lambda n: sd[f"h.{i}.{n}"]
            a = F.layer_norm(h, (d,), p("ln_1.weight"), p("ln_1.bias"))
            split = lambda y: y.view(b, t, hl, d // heads).transpose(1, 2)
            q, k, v = (split(F.linear(a, col(p(f"{n}.weight")), col(p(f"{n}.bias"))))
                       for n in ("wq", "wk", "wv"))
            att = (q @ k.transpose(-2, -1) / math.sqrt(d // heads)).softmax(dim=-1)
            o = F.linear((att @ v).transpose(1, 2).reshape(b, t, d // world), row(p("wo.weight")))
            h = h + all_reduce(o) + p("wo.bias")
            m = F.gelu(F.linear(F.layer_norm(h, (d,), p("ln_2.weight"), p("ln_2.bias")),
                                col(p("fc.weight")), col(p("fc.bias"))), approximate="tanh")
            h = h + all_reduce(F.linear(m, row(p("proj.weight")))) + p("proj.bias")
        return F.linear(F.layer_norm(h, (d,), sd["ln_f.weight"], sd["ln_f.bias"]), sd["wte.weight"])

    with torch.no_grad():
        y = forward(x)
        best = float("inf")
        for _ in range(rounds):
            dist.barrier()
            sent[0] = 0
            t0 = time.perf_counter()
            for _ in range(steps):
                y = forward(x)
            dist.barrier()
            best = min(best, (time.perf_counter() - t0) * 1e3 / steps)
        ms = best
    total = torch.tensor([sent[0] // steps])
    dist.all_reduce(total)
    if rank == 0:
        # A plain copy: a shared tensor would be fetched from this process
        # after it has exited.
        out.put((ms, int(total), y.numpy().copy()))
    dist.destroy_process_group()


def run_megatron(world, steps, rounds, port):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=megatron_worker, args=(r, world, steps, rounds, port, q))
             for r in range(world)]
    for p in procs:
        p.start()
    ms, sent, y = q.get(timeout=600)
    result = (ms, sent, torch.from_numpy(y))
    for p in procs:
        p.join(timeout=60)
    return result


def compile_tdx(world, weights):
    prog = tdx.trace(tdx.deferred_init(GPT, **CONFIG), ids())
    mesh = tdx.init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    tdx.parallelize(prog, mesh, PLAN)
    exe = tdx.compile(prog)
    exe.run(ids(), params=weights, steps=1)  # warm-up (page cache, MPI start)
    return exe


def run_tdx(exe, steps, weights):
    (y,) = exe.run(ids(), params=weights, steps=steps, verbose=True)
    sent = re.search(r"(\d+) bytes communicated", exe.last_log)
    return exe.last_step_ms(), int(sent.group(1)), y


def tdx_profile(exe, steps, weights):
    """Rank 0's runtime overhead (% over its ATen calls and kernels), its
    collective time per step (ms) with overlap (exposed) and without
    (--no-overlap: whole), and the working memory of a step, measured and
    planned (bytes)."""
    exe.run(ids(), params=weights, steps=steps, profile=True, verbose=True)
    log = exe.last_log
    exe.run(ids(), params=weights, steps=steps, profile=True, overlap=False)
    collectives = lambda text: float(re.search(r"collectives ([\d.]+) ms", text).group(1))
    overhead = float(re.search(r"\(([\d.]+)% over the ATen calls", log).group(1))
    memory = re.search(r"rank 0: working memory of a step (\d+) bytes \(planned (-?\d+)", log)
    return dict(overhead=overhead, exposed=collectives(log), whole=collectives(exe.last_log),
                working=int(memory.group(1)), planned=int(memory.group(2)))


def eager_forward(model, x):
    with torch.no_grad():
        return model(x)


def eager_step_ms(model, x, steps):
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(steps):
            model(x)
        return (time.perf_counter() - t0) * 1e3 / steps


def main():
    args = arguments(__doc__, steps=20, rounds=3, ranks="1,2,4")
    torch.set_num_threads(1)
    model, x = eager_model(), ids()
    weights = dict(model.named_parameters(), **dict(model.named_buffers()))
    with torch.no_grad():
        want = model(x)
    worlds = [int(r) for r in args.ranks.split(",")]
    exes = {world: compile_tdx(world, weights) for world in worlds}
    eager_ms = float("inf")
    rows, port = [], 29500
    for world in worlds:
        t_ms = g_ms = float("inf")
        for _ in range(args.rounds):
            eager_ms = min(eager_ms, eager_step_ms(model, x, args.steps))
            t, t_bytes, t_y = run_tdx(exes[world], args.steps, weights)
            g, g_bytes, g_y = run_megatron(world, args.steps, 1, port)
            port += 1
            t_ms, g_ms = min(t_ms, t), min(g_ms, g)
        rows.append((world, t_ms, g_ms, t_bytes, g_bytes, t_y, g_y,
                     tdx_profile(exes[world], args.steps, weights)))
    # Before tdx.working_memory installs the pool in this process.
    llama = llama_line(args.steps, args.rounds)
    eager_working = tdx.working_memory(lambda: eager_forward(model, x), warmup=2)["working"]
    print(f"GPT {CONFIG}, batch {BATCH}x{SEQ}, {args.steps} steps x best of {args.rounds} "
          f"alternating rounds, 1 ATen thread per process")
    print(f"torch eager, 1 process: {eager_ms:.2f} ms/step, working memory "
          f"{eager_working / 2**20:.2f} MiB (tdx.working_memory)\n")
    print("exposed: rank 0's collective time per step (ms) with overlap / without "
          "(--no-overlap); MiB: a step's working memory on rank 0, measured (planned)")
    print(f"{'ranks':>5} | {'tdx ms':>8} {'gloo ms':>8} {'gloo/tdx':>8} | "
          f"{'tdx bytes':>10} {'gloo bytes':>10} | {'tdx/eager':>9} | {'overhead':>8} | "
          f"{'exposed':>16} | {'MiB':>13} | {'tdx err':>8} {'gloo err':>8}")
    err = lambda y: ((y - want).norm() / want.norm()).item()
    for world, t_ms, g_ms, t_bytes, g_bytes, t_y, g_y, prof in rows:
        exposed, mib = profile_columns(prof)
        print(f"{world:>5} | {t_ms:>8.2f} {g_ms:>8.2f} {g_ms / t_ms:>8.2f} | "
              f"{t_bytes:>10} {g_bytes:>10} | {t_ms / eager_ms:>9.2f} | "
              f"{prof['overhead']:>7.2f}% | {exposed:>16} | {mib:>13} | "
              f"{err(t_y):>8.1e} {err(g_y):>8.1e}")
    print(llama)


LLAMA = dict(vocab=512, d=128, heads=4, hidden=344, layers=4, context=64)


def llama_line(steps, rounds):
    """The LLaMA-style model of the test suite (RMSNorm, rotary embeddings,
    SwiGLU; test/python/models.py) at this bench's size: tdx's forward on
    one rank next to eager's, best of `rounds` alternating rounds."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "test", "python"))
    from models import Llama
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(Llama, **LLAMA), ids())
    exe = tdx.compile(prog)
    torch.manual_seed(0)
    model = Llama(**LLAMA).eval()
    weights = dict(model.named_parameters(), **dict(model.named_buffers()))
    exe.run(ids(), params=weights, steps=1)
    t_ms = e_ms = float("inf")
    for _ in range(rounds):
        exe.run(ids(), params=weights, steps=steps, verbose=True)
        t_ms = min(t_ms, exe.last_step_ms())
        e_ms = min(e_ms, eager_step_ms(model, ids(), steps))
    return (f"LLaMA {LLAMA}, 1 rank: tdx {t_ms:.2f} ms, torch eager {e_ms:.2f} ms, "
            f"tdx/eager {t_ms / e_ms:.2f}")


if __name__ == "__main__":
    main()
