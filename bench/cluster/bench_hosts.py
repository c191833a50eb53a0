"""A data-parallel step across two hosts over a rate-limited link: how much
of its communication is exposed (not hidden behind compute), next to DDP on
gloo across the same hosts, in one run.

The hosts are scripts/hosts.sh's network namespaces h1 and h2 (root only),
each link limited to --rate both ways (a token bucket; docs/cluster.md);
one rank on each. The step is bench_training's GPT with AdamW, its batch
split over dp2. tdx's figures are its standalone binary's (the one step
engine's command line) under mpirun across the hosts, with --profile: rank
0's collective time per step with overlap (exposed) and with --no-overlap
(whole), and the step time. The peers: tdx dp2 on one host (shared
memory), and torch DDP on gloo across the hosts, whose step time is
printed beside tdx's. Every figure is the best of --rounds; every process
uses one ATen thread; the first step of each run is not timed.

    . build/env.sh && "$TDX_PYTHON" bench/cluster/bench_hosts.py [--rate 1gbit] [--steps 8]
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "training"))
import common  # noqa: E402

common.setup()  # before torch loads
import torch  # noqa: E402

ROOT = os.path.join(HERE, "..", "..")
HOSTS = os.path.abspath(os.path.join(ROOT, "scripts", "hosts.sh"))
NETWORK = "10.77.0.0/24"
ACROSS = ["--host", "h1:1,h2:1", "--mca", "btl", "self,vader,tcp", "--mca",
          "btl_tcp_if_include", NETWORK, "--mca", "oob_tcp_if_include", NETWORK, "--mca",
          "plm_rsh_agent", f"{HOSTS} rsh"]


def mpirun(args, across, timeout=900):
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2"]
    cmd += ACROSS if across else []
    done = subprocess.run(cmd + args, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"mpirun failed:\n{done.stderr[-3000:]}")
    return done.stdout


def tdx_run(exe, files, steps, across, overlap):
    """(step ms, rank 0's collective ms per step) of the binary's --batches
    loop, with --profile (the first step is its warm-up)."""
    out = mpirun([exe.path, "--batches", files["batches"], "--steps", str(steps), "--params",
                  files["params"], "--threads", "1", "--verbose", "--profile"]
                 + ([] if overlap else ["--no-overlap"]), across)
    step = float(re.search(r"ranks: init [\d.]+ ms, step ([\d.]+) ms", out).group(1))
    collectives = float(re.search(r"collectives ([\d.]+) ms", out).group(1))
    return step, collectives


def ddp_worker(data_path, steps):
    """One rank of DDP on gloo (run under mpirun across the hosts): rank 0
    prints its mean step time after one warm-up step."""
    from bench_training import loss_fn, model, optimizer
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="tcp://10.77.0.1:29811", rank=rank,
                            world_size=world)
    data = torch.load(data_path)
    m = torch.nn.parallel.DistributedDataParallel(model())
    opt = optimizer(m.parameters())
    t0 = None
    for k in range(steps):
        if k == 1:
            t0 = time.perf_counter()
        x, y = (t.chunk(world)[rank] for t in data[k % len(data)])
        opt.zero_grad()
        loss_fn(m, x, y).backward()
        opt.step()
    ms = (time.perf_counter() - t0) * 1e3 / (steps - 1)
    if rank == 0:
        print(json.dumps({"ms": ms}), flush=True)
    dist.destroy_process_group()


def main():
    if "--ddp-worker" in sys.argv:
        at = sys.argv.index("--ddp-worker")
        return ddp_worker(sys.argv[at + 1], int(sys.argv[at + 2]))
    args = common.arguments(__doc__, steps=8, rounds=2, rate="1gbit")
    if os.geteuid() != 0:
        raise SystemExit("bench_hosts: making test hosts needs root (scripts/hosts.sh)")
    import tdx
    from bench_training import batches, compile_tdx, model
    data = batches(args.steps)
    exe, _ = compile_tdx((2,), ("dp",))
    weights = {k: v.detach() for k, v in model().state_dict().items()}
    best = {}
    keep = lambda key, value: best.__setitem__(key, min(best.get(key, value), value))
    with tempfile.TemporaryDirectory() as tmp:
        files = {n: os.path.join(tmp, f"{n}.safetensors") for n in ("batches", "params")}
        tdx.safetensors.save({f"{k}:input:{i}": x for k, b in enumerate(data)
                              for i, x in enumerate(b)}, files["batches"])
        tdx.safetensors.save(weights, files["params"])
        data_path = os.path.join(tmp, "data.pt")
        torch.save(data, data_path)
        subprocess.run([HOSTS, "up", "2", "--rate", args.rate], check=True)
        try:
            for _ in range(args.rounds):
                for across in (False, True):
                    where = "2 hosts" if across else "1 host"
                    step, exposed = tdx_run(exe, files, args.steps, across, True)
                    _, whole = tdx_run(exe, files, args.steps, across, False)
                    keep(("step", where), step)
                    keep(("exposed", where), exposed)
                    keep(("whole", where), whole)
                out = mpirun([sys.executable, __file__, "--ddp-worker", data_path,
                              str(args.steps)], True)
                keep(("ddp", "2 hosts"), json.loads(out.strip().splitlines()[-1])["ms"])
        finally:
            subprocess.run([HOSTS, "down"])
    grad = sum(p.numel() for p in model().parameters()) * 4
    print(f"GPT {common.GPT_CONFIG}, batch {common.BATCH}x{common.SEQ}, AdamW, dp2 "
          f"(gradients {grad / 2**20:.1f} MiB), {args.steps} steps x best of {args.rounds}; "
          f"2 hosts: one rank on each of h1 and h2, links limited to {args.rate}")
    print("exposed: rank 0's collective time per step with overlap / without "
          "(--no-overlap), and its share")
    print(f"{'where':>8} | {'tdx step ms':>11} {'exposed ms':>10} {'whole ms':>9} "
          f"{'exposed %':>9} | {'DDP gloo ms':>11} {'DDP/tdx':>7}")
    for where in ("1 host", "2 hosts"):
        step, exposed, whole = (best[(k, where)] for k in ("step", "exposed", "whole"))
        ddp = best.get(("ddp", where))
        peer = f"{ddp:>11.2f} {ddp / step:>7.2f}" if ddp else f"{'-':>11} {'-':>7}"
        print(f"{where:>8} | {step:>11.2f} {exposed:>10.2f} {whole:>9.2f} "
              f"{100 * exposed / whole:>8.0f}% | {peer}")


if __name__ == "__main__":
    main()
