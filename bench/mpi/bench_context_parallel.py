"""Context parallelism on torchtitan's Llama 3: the sequence split over cp2,
as the user's ring attention in a manual region (examples/ring_attention.py)
and as tdx.ContextParallel (keys and values all-gathered), beside torch
eager's full attention on one process and torch's own context parallelism
(torch.distributed.tensor.experimental.context_parallel on gloo), which is
tried in the same run and reported with its error where it cannot run.
ms per training step (SGD) and bytes each rank sends per step (the comm
report), side by side with the ratios.

    . build/env.sh && "$TDX_PYTHON" bench/mpi/bench_context_parallel.py [--steps 10] [--rounds 2]
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import arguments, ms_per_step, setup  # noqa: E402

setup()
args = arguments(__doc__, steps=10, rounds=2, seq="256", dim="64", batch="4")
import torch  # noqa: E402

import tdx  # noqa: E402
import ring_attention as ra  # noqa: E402

SEQ, DIM, BATCH, VOCAB = int(args.seq), int(args.dim), int(args.batch), 256
MESH = tdx.init_device_mesh("cpu", (2,), ("cp",))


def build():
    return ra.llama3(vocab=VOCAB, seq=SEQ, dim=DIM)


def sgd(params):
    return torch.optim.SGD(params, lr=0.01)


def data(n):
    return ra.batches(n, batch=BATCH, seq=SEQ, vocab=VOCAB)


def eager(batches):
    torch.manual_seed(0)
    model = build()
    opt = sgd(model.parameters())

    def step(batch):
        opt.zero_grad()
        ra.loss_fn(model, *batch).backward()
        opt.step()
    return ms_per_step(step, batches), 0


def compiled(how, batches):
    torch.manual_seed(0)
    if how == "ring":
        model = tdx.deferred_init(lambda: ra.with_ring_attention(build(), MESH))
    else:
        model = tdx.deferred_init(build)
    prog = tdx.trace_train_step(model, sgd(model.parameters()), ra.loss_fn, *batches[0])
    plan = {"layers.*.attention": tdx.ContextParallel("cp")} if how == "plan" else {}
    tdx.parallelize(prog, MESH, plan)
    sent = sum(r["bytes"] for r in prog.comm_report())
    exe = tdx.compile(prog)
    torch.manual_seed(0)
    weights = {k: v.detach() for k, v in build().state_dict().items()}
    with exe.start(params=weights, threads=1) as runner:
        return ms_per_step(lambda batch: runner.train_step(*batch).item(), batches), sent


def _torch_cp(rank, n, steps, out):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=n)
    try:
        mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("cp",))
        torch.manual_seed(0)
        model = build()
        opt = sgd(model.parameters())

        def step(batch):
            ids, targets = batch
            opt.zero_grad()
            with context_parallel(mesh, buffers=[ids, targets], buffer_seq_dims=[1, 1]):
                ra.loss_fn(model, ids, targets).backward()
            opt.step()
        result = f"{ms_per_step(step, data(steps + 1)):.3f}"
    except Exception as e:   # reported as the peer's result, not hidden
        result = f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:110]}"
    if rank == 0:
        with open(out, "w") as f:
            f.write(result)
    dist.destroy_process_group()


def torch_context_parallel(steps):
    import tempfile

    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        mp.spawn(_torch_cp, args=(2, steps, out), nprocs=2)
        with open(out) as f:
            return f.read()


def main():
    batches = data(args.steps + 1)
    rows = {"torch eager, full attention (1 process)": [], "tdx ring attention region (cp2)": [],
            "tdx.ContextParallel (cp2)": []}
    for _ in range(args.rounds):
        rows["torch eager, full attention (1 process)"].append(eager(batches))
        rows["tdx ring attention region (cp2)"].append(compiled("ring", batches))
        rows["tdx.ContextParallel (cp2)"].append(compiled("plan", batches))
    peer = torch_context_parallel(args.steps)
    best = {k: min(v) for k, v in rows.items()}
    print(f"torchtitan Llama 3 (dim {DIM}, 2 layers), batch {BATCH} x seq {SEQ}, SGD, best of "
          f"{args.rounds} rounds of {args.steps} steps")
    print(f"{'':42} {'ms/step':>9} {'bytes/step':>11}")
    for k, (ms, sent) in best.items():
        print(f"{k:42} {ms:9.3f} {sent:11d}")
    print(f"{'torch context_parallel (gloo, cp2)':42} {peer:>9}")
    ring, plan = best["tdx ring attention region (cp2)"], best["tdx.ContextParallel (cp2)"]
    ref = best["torch eager, full attention (1 process)"]
    print(f"ring / ContextParallel: time {ring[0] / plan[0]:.2f}x, bytes "
          f"{ring[1] / max(plan[1], 1):.2f}x; ring / torch eager: time {ring[0] / ref[0]:.2f}x; "
          f"ContextParallel / torch eager: time {plan[0] / ref[0]:.2f}x")
    if not peer.startswith("n/a"):
        print(f"ring / torch context_parallel: time {ring[0] / float(peer):.2f}x")


if __name__ == "__main__":
    main()
