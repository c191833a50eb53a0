"""What bitwise-reproducible training costs: the AdamW step of
bench_training.py's GPT on a 2x2 (dp, tp) mesh with the Megatron plan,
folded onto 1, 2 (dp or tp) and 4 processes (tdx.parallelize(...,
fold=...)), next to the same layouts unfolded and to the peers in the same
run:

  - folded: every folding runs the 2x2 mesh's per-rank ops and sums in one
    order, so its losses and final parameters are bitwise the 4-process
    run's; the table prints the largest differences to it (0 / 0: bitwise
    equal);
  - unfolded: the plain 1-rank, dp2, tp2 and 2x2 programs, each summing in
    its own order (their differences to the 1-rank run); the 2x2 mesh
    folded on no axis is the plain 2x2 program, so that row times one
    binary twice and its ratio is the machine's noise;
  - peers: torch eager (one process) and DDP on gloo (2 processes), whose
    final parameters differ from each other the same way.

Every process uses one ATen thread; a step time is the mean of --steps steps
after one warm-up step, best of --rounds rounds.

    . build/env.sh && "$TDX_PYTHON" bench/training/bench_fold.py [--steps 10]
"""

import argparse
import os
import sys

os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

sys.path.insert(0, os.path.dirname(__file__))
from bench_training import CONFIG, batches, compile_tdx, eager, gloo, model  # noqa: E402

# layout: (processes, axes folded of the 2x2 mesh, the unfolded mesh's shape and axes)
LAYOUTS = {"1": (1, ("dp", "tp"), None), "dp2": (2, ("tp",), ((2,), ("dp",))),
           "tp2": (2, ("dp",), ((2,), ("tp",))), "2x2": (4, (), ((2, 2), ("dp", "tp")))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    data = batches(args.steps + 1)
    weights = {k: v.detach() for k, v in model().state_dict().items()}
    exes = {}
    for name, (_, fold, plain) in LAYOUTS.items():
        exes["folded " + name] = compile_tdx((2, 2), ("dp", "tp"), fold=fold)
        if name != "2x2":  # the 2x2 mesh folded on no axis is the plain 2x2 program
            exes["plain " + name] = compile_tdx(*(plain or (None, None)))
    exes["plain 2x2"] = exes["folded 2x2"]
    best, losses, states = {}, {}, {}
    keep = lambda key, ms: best.__setitem__(key, min(best.get(key, ms), ms))
    port = 29700
    for _ in range(args.rounds):
        ms, losses["torch eager"], states["torch eager"] = eager(data)
        keep("torch eager", ms)
        port += 1
        ms, losses["DDP gloo 2"], states["DDP gloo 2"] = gloo("ddp", data, 2, port)
        keep("DDP gloo 2", ms)
        for name, (exe, _) in exes.items():
            losses[name], states[name] = exe.train(data, params=weights, threads=1, verbose=True)
            keep(name, exe.last_step_ms())

    def off(a, b):
        """The largest difference of the losses of runs a and b, and of their
        final parameters (names as in model.state_dict())."""
        loss = max(abs(x - y) for x, y in zip(losses[a], losses[b]))
        # (a tied name, lm_head.weight, is one of tdx's state under its owner's name)
        names = [k for k in weights if k in states[a] and k in states[b]]
        return loss, max((states[a][k] - states[b][k]).abs().max().item() for k in names)

    print(f"GPT {CONFIG}, AdamW, {args.steps} steps x best of {args.rounds} rounds, "
          f"1 ATen thread per process; 2x2 = (dp, tp) with the Megatron plan")
    print("tdx compile: " + ", ".join(f"{n} {t:.0f} s" for n, (_, t) in exes.items()
                                      if n != "plain 2x2"))
    print("diff: the largest difference of the losses / of the final parameters "
          "(0 / 0: bitwise equal)")
    print(f"{'layout':>6} {'procs':>5} | {'folded ms':>9} {'diff to 4 procs':>19} | "
          f"{'plain ms':>8} {'diff to 1 rank':>19} | {'folded/plain':>12}")
    for name, (procs, _, _) in LAYOUTS.items():
        f, p = "folded " + name, "plain " + name
        fl, fp = off(f, "folded 2x2")
        pl, pp = off(p, "plain 1")
        print(f"{name:>6} {procs:>5} | {best[f]:>9.2f} {fl:>9.3g} / {fp:<7.3g} | "
              f"{best[p]:>8.2f} {pl:>9.3g} / {pp:<7.3g} | {best[f] / best[p]:>12.2f}")
    el, ep = off("DDP gloo 2", "torch eager")
    print(f"peers: torch eager {best['torch eager']:.2f} ms, DDP gloo 2 {best['DDP gloo 2']:.2f} "
          f"ms; DDP's final parameters differ from eager's by {ep:.3g} (DDP's loss is rank "
          f"0's half batch); eager / folded 1 process: "
          f"{best['torch eager'] / best['folded 1']:.2f}, DDP gloo 2 / folded dp2: "
          f"{best['DDP gloo 2'] / best['folded dp2']:.2f}")


if __name__ == "__main__":
    main()
