"""What the benchmarks share: their command line, and the columns they print
from a tdx binary's profile (the dicts their `tdx_profile` functions
return)."""

import argparse
import os
import sys
import time

def setup():
    """What a benchmark does before it imports torch: one BLAS thread
    everywhere (OpenBLAS sizes its pool when torch loads it, and
    torch.set_num_threads does not reach it; otherwise an in-process eager
    baseline would multiply on both cores and the ranks on one), and
    examples/ (the bench GPT's code) on the path."""
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


# The bench GPT (examples/gpt_2x2.py's model at this size and batch), which
# bench/runtime and bench/training run and test_emission_golden records.
GPT_CONFIG = dict(vocab=512, d=128, heads=4, layers=4, context=64)
BATCH, SEQ = 8, 64


def ms_per_step(step, batches):
    """Milliseconds per call of ``step(batch)`` over `batches`, the first
    call (the warm-up) not counted."""
    step(batches[0])
    t0 = time.perf_counter()
    for batch in batches[1:]:
        step(batch)
    return (time.perf_counter() - t0) * 1e3 / (len(batches) - 1)


def arguments(doc, steps, rounds, **extra):
    """The command line of a benchmark: --steps and --rounds with these
    defaults, and one string option per `extra` (name: default)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rounds", type=int, default=rounds,
                        help="alternating rounds; each figure is the best")
    for name, default in extra.items():
        parser.add_argument(f"--{name}", default=default)
    return parser.parse_args()


def profile_columns(prof):
    """The exposed/whole collective time ("0.52/1.10  47%", "-" without
    collectives) and the working memory of a step, measured (planned), in
    MiB."""
    exposed = (f"{prof['exposed']:.2f}/{prof['whole']:.2f} "
               f"{100 * prof['exposed'] / prof['whole']:3.0f}%" if prof["whole"] else "-")
    memory = f"{prof['working'] / 2**20:.2f} ({prof['planned'] / 2**20:.2f})"
    return exposed, memory
