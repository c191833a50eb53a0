"""Training from the user's own Python loop: tdx's runner (Executable.start),
which keeps the ranks and their state between calls, next to its peers, in
one run, on bench_training's GPT-style model and AdamW step with the
learning rate a runtime input (a cosine schedule changes it every step):

  - torch eager, one process, the same loop with a LR scheduler;
  - torch.nn.parallel.DistributedDataParallel on gloo, 2 processes;
  - the standalone binary's command line (mpirun model --batches F: the
    same step engine, its requests made from the flags, no Python between
    steps), 1 rank and dp2;
  - the runner, one runner.train_step(x, y, lr=...) call per step from
    Python, 1 rank and dp2: the single controller (workers under mpirun,
    requests through pipes) and SPMD (the script under python3 -m tdx.run,
    the program in-process).

A step time is the mean of --steps steps after one warm-up step, best of
--rounds rounds. The runner's overhead per call is its step time less the
standalone binary's: what a call costs to send the batch and learning rate
to the ranks (through /dev/shm and a pipe per rank) and bring the loss
back; the round trip is the least a call costs (single controller: a
request every rank answers with nothing to run; SPMD: a barrier through
the library's C ABI). Every process uses
one ATen thread; the losses of every tdx configuration are checked against
eager's.

    . build/env.sh && "$TDX_PYTHON" bench/training/bench_runner.py [--steps 10]
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

common.setup()  # before torch loads
import torch  # noqa: E402

import tdx  # noqa: E402
from bench_training import BATCH, CONFIG, SEQ, batches, gloo, loss_fn, model, optimizer  # noqa: E402


def schedule(n):
    """The cosine schedule's lr at each of n steps, as eager's scheduler
    gives them."""
    opt = optimizer(model().parameters())
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n)
    lrs = []
    for _ in range(n):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return lrs


def eager(data, lrs):
    torch.set_num_threads(1)
    m = model()
    opt = optimizer(m.parameters())
    losses, t0 = [], None
    for k, (batch, lr) in enumerate(zip(data, lrs)):
        if k == 1:
            t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss = loss_fn(m, *batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return (time.perf_counter() - t0) * 1e3 / (len(data) - 1), losses


def compile_step(dp):
    torch.manual_seed(0)
    deferred = tdx.deferred_init(model)
    prog = tdx.trace_train_step(deferred, optimizer(deferred.parameters()), loss_fn,
                                *batches(1)[0], hyperparameters=("lr",))
    if dp:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (dp,), ("dp",)), {},
                        data_parallel="dp")
    return tdx.compile(prog)


def binary_loop(exe, data, lrs, weights):
    """The binary's --batches loop under mpirun, every batch in one file:
    its step time as its ranks measured it, and its losses."""
    batches = exe._with_hyperparameters([tuple(b) for b in data], {"lr": lrs})
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: os.path.join(tmp, f"{name}.safetensors")
                 for name in ("batches", "params", "out")}
        tdx.safetensors.save({f"{k}:input:{i}": x for k, b in enumerate(batches)
                              for i, x in enumerate(b)}, files["batches"])
        tdx.safetensors.save(weights, files["params"])
        done = subprocess.run(
            ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(exe.world_size),
             exe.path, "--batches", files["batches"], "--steps", str(len(batches)), "--params",
             files["params"], "--outputs", files["out"], "--threads", "1", "--verbose"],
            capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            raise SystemExit(f"the binary failed:\n{done.stderr[-3000:]}")
        got = tdx.safetensors.load(files["out"])
    ms = float(re.search(r"ranks: init [\d.]+ ms, step ([\d.]+) ms", done.stdout).group(1))
    return ms, [float(got[f"{k}:output:0"]) for k in range(len(batches))], None


def runner_loop(exe, data, lrs, weights):
    with exe.start(params=weights, threads=1) as runner:
        losses, t0 = [], None
        for k, ((x, y), lr) in enumerate(zip(data, lrs)):
            if k == 1:
                t0 = time.perf_counter()
            losses.append(runner.train_step(x, y, lr=lr).item())
        ms = (time.perf_counter() - t0) * 1e3 / (len(data) - 1)
        # What a call costs besides the step: a request every rank answers
        # with nothing to run (the runner's own no-op), round trip.
        t0 = time.perf_counter()
        for _ in range(200):
            runner._t._request("ready")
        trip = (time.perf_counter() - t0) * 1e6 / 200
    return ms, losses, trip


def spmd_worker(ranks, steps):
    """One rank of the SPMD runner's loop (run by spmd_loop under tdx.run);
    rank 0 prints its step time, losses and barrier round trip."""
    data = batches(steps + 1)
    lrs = schedule(len(data))
    weights = {k: v.detach() for k, v in model().state_dict().items()}
    exe = compile_step(ranks if ranks > 1 else None)
    with exe.start(params=weights, threads=1) as runner:
        ms, losses, _ = None, [], None
        for k, ((x, y), lr) in enumerate(zip(data, lrs)):
            if k == 1:
                t0 = time.perf_counter()
            losses.append(runner.train_step(x, y, lr=lr).item())
        ms = (time.perf_counter() - t0) * 1e3 / (len(data) - 1)
        lib, h = runner._t._lib, runner._t._h
        t0 = time.perf_counter()
        for _ in range(200):
            lib.tdx_barrier(h)
        trip = (time.perf_counter() - t0) * 1e6 / 200
    if runner._t.rank == 0:
        print(json.dumps({"ms": ms, "losses": losses, "trip": trip}), flush=True)


def spmd_loop(exe, data, lrs, weights):
    ranks = exe.world_size
    done = subprocess.run([sys.executable, "-m", "tdx.run", "-n", str(ranks), __file__,
                           "--spmd-worker", str(ranks), "--steps", str(len(data) - 1)],
                          capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"the SPMD runner failed:\n{done.stderr[-3000:]}")
    got = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    return got["ms"], got["losses"], got["trip"]


def main():
    if "--spmd-worker" in sys.argv:
        at = sys.argv.index("--spmd-worker")
        steps = int(sys.argv[sys.argv.index("--steps") + 1])
        return spmd_worker(int(sys.argv[at + 1]), steps)
    args = common.arguments(__doc__, steps=10, rounds=3)
    data = batches(args.steps + 1)
    lrs = schedule(len(data))
    weights = {k: v.detach() for k, v in model().state_dict().items()}
    exes = {1: compile_step(None), 2: compile_step(2)}
    best = {}
    keep = lambda key, ms: best.__setitem__(key, min(best.get(key, ms), ms))
    port = 29700
    for _ in range(args.rounds):
        ms, want = eager(data, lrs)
        keep("eager", ms)
        port += 1
        keep("ddp", gloo("ddp", data, 2, port)[0])
        for ranks, exe in exes.items():
            for name, loop in (("binary", binary_loop), ("runner", runner_loop),
                               ("spmd", spmd_loop)):
                ms, got, trip = loop(exe, data, lrs, weights)
                if trip is not None:
                    keep((name + " trip", ranks), trip)
                worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
                assert worst < 1e-4, f"{name} on {ranks} rank(s): loss off eager's by {worst:.2e}"
                keep((name, ranks), ms)
    print(f"GPT {CONFIG}, batch {BATCH}x{SEQ}, AdamW with a cosine LR schedule, "
          f"{args.steps} steps x best of {args.rounds} rounds, 1 ATen thread per process")
    print("overhead/call: the runner's step time less the standalone binary's; round trip: "
          "the least a call costs (workers: a no-op request; SPMD: a barrier)")
    print(f"{'ranks':>5} {'runner':>7} | {'runner ms':>9} {'binary ms':>9} {'runner/binary':>13} "
          f"{'overhead/call':>13} {'round trip':>10} | {'peer':>11} {'peer ms':>8} "
          f"{'peer/runner':>11}")
    for ranks in exes:
        for name in ("runner", "spmd"):
            runner, binary = best[(name, ranks)], best[("binary", ranks)]
            peer = "torch eager" if ranks == 1 else "DDP gloo 2"
            peer_ms = best["eager" if ranks == 1 else "ddp"]
            kind = "workers" if name == "runner" else "SPMD"
            print(f"{ranks:>5} {kind:>7} | {runner:>9.2f} {binary:>9.2f} {runner / binary:>13.3f} "
                  f"{(runner - binary) * 1e3:>10.0f} us {best[(name + ' trip', ranks)]:>7.1f} us | "
                  f"{peer:>11} {peer_ms:>8.2f} "
                  f"{peer_ms / runner:>11.2f}")


if __name__ == "__main__":
    main()
