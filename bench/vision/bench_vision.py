"""Vision forwards, tdx model binaries next to torch eager in one run:
ResNet-18 and ViT-B/16 as torchvision builds them (random weights,
224x224 images), inference mode.

  - torch eager, one process, 1 thread and 2 threads;
  - the tdx binary (tdx.compile of the traced model) on 1 rank, and on 2
    ranks data parallel (the batch split over a "dp" mesh axis), one ATen
    thread per rank.

Step time is the mean of --steps forwards after one warm-up, best of
--rounds rounds; eager and tdx rounds alternate, so a slow spell of this
shared 2-core machine hits both alike. The last column is the error of the
tdx output against eager's.

    . build/env.sh && "$TDX_PYTHON" bench/vision/bench_vision.py [--steps 3]
"""

import itertools
import os
import sys
import time

# One BLAS thread for the 1-thread baseline, set before torch loads OpenBLAS.
os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

import torch  # noqa: E402
import torchvision  # noqa: E402

import tdx  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import arguments  # noqa: E402

MODELS = {"resnet18": (torchvision.models.resnet18, 4),
          "vit_b_16": (torchvision.models.vit_b_16, 2)}


def eager_model(name):
    torch.manual_seed(0)
    model = MODELS[name][0]().eval()
    with torch.no_grad():
        for p in model.parameters():  # torchvision zeroes some heads
            p.normal_(0, 0.02)
    return model


def images(name):
    return torch.randn(MODELS[name][1], 3, 224, 224, generator=torch.Generator().manual_seed(1))


def time_eager(model, x, steps, threads):
    torch.set_num_threads(threads)
    with torch.no_grad():
        model(x)
        t0 = time.perf_counter()
        for _ in range(steps):
            y = model(x)
    torch.set_num_threads(1)
    return (time.perf_counter() - t0) * 1e3 / steps, y


def compile_tdx(name, world):
    torch.manual_seed(0)
    model = tdx.deferred_init(MODELS[name][0])
    model.eval()
    prog = tdx.trace(model, images(name))
    if world > 1:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (world,), ("dp",)), {},
                        data_parallel="dp")
    return tdx.compile(prog)


def time_tdx(exe, x, steps, weights):
    (y,) = exe.run(x, params=weights, steps=steps, verbose=True)
    return exe.last_step_ms(), y


def main():
    args = arguments(__doc__, steps=3, rounds=2, models="resnet18,vit_b_16")
    torch.set_num_threads(1)
    print(f"threads: 1 per process (eager also with 2); steps {args.steps}, best of "
          f"{args.rounds} alternating rounds; torch {torch.__version__}")
    print(f"{'model':10s} {'peer':22s} {'eager ms':>9s} {'tdx ms':>9s} {'tdx/eager':>9s} "
          f"{'max rel err':>11s}")
    for name in args.models.split(","):
        model, x = eager_model(name), images(name)
        weights = dict(itertools.chain(model.named_parameters(), model.named_buffers()))
        t0 = time.perf_counter()
        exes = {w: compile_tdx(name, w) for w in (1, 2)}
        compile_s = time.perf_counter() - t0
        best = {}
        outputs = {}
        for _ in range(args.rounds):
            for key, fn in [("eager1", lambda: time_eager(model, x, args.steps, 1)),
                            ("eager2", lambda: time_eager(model, x, args.steps, 2)),
                            ("tdx1", lambda: time_tdx(exes[1], x, args.steps, weights)),
                            ("tdx2", lambda: time_tdx(exes[2], x, args.steps, weights))]:
                ms, y = fn()
                best[key] = min(best.get(key, float("inf")), ms)
                outputs[key] = y
        err = lambda k: ((outputs[k] - outputs["eager1"]).norm() /
                         outputs["eager1"].norm()).item()
        rows = [("1 rank vs eager 1 thr", "eager1", "tdx1"),
                ("dp2 vs eager 1 thr", "eager1", "tdx2"),
                ("dp2 vs eager 2 thr", "eager2", "tdx2")]
        for label, peer, ours in rows:
            print(f"{name:10s} {label:22s} {best[peer]:9.1f} {best[ours]:9.1f} "
                  f"{best[ours] / best[peer]:9.2f} {err(ours):11.2e}")
        print(f"{name:10s} (trace + compile of both binaries: {compile_s:.0f} s; batch "
              f"{x.shape[0]})")


if __name__ == "__main__":
    main()
