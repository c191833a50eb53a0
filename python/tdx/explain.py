"""tdx.explain: a program's plan as one static HTML page."""

import os
import shutil
import tempfile


def explain(prog, path):
    """Writes the plan of ``prog`` to ``path`` as one static HTML page
    (inline SVG; no script, nothing fetched), and returns the path:

    - per layer and per state tensor, its placement on each mesh axis (and
      its optimizer state's where ZeRO places that otherwise); layers placed
      alike are drawn once, with their count;
    - the step from start to end: the live bytes of its tensors with the
      peak marked, and every collective where it runs, tall by its bytes;
      then the collectives by kind, mesh axes and element type;
    - a rank's memory by kind (``prog.memory_report()``), against its
      ``memory_budget``;
    - for a pipeline (``parallelize(..., pipeline=...)``), its stages (each
      one's layers and forward seconds) and its schedule as a timeline:
      one row per pipeline rank, a forward (F) or backward (B) block per
      stage and micro-batch, the bubbles between, each rank's bubble
      fraction next to (p-1)/(v m). The rest of the page is pipeline rank
      0's step.

    ``prog`` is not changed: a copy is partitioned and planned as
    ``tdx.compile`` plans it (tdx-explain on that copy; ``tdx-opt
    --tdx-explain=output=plan.html`` draws a partitioned program)."""
    from .program import Program
    from .sharding import _planned_copy
    if not isinstance(prog, Program):
        raise TypeError(f"tdx.explain draws a tdx.Program (from tdx.trace or "
                        f"tdx.trace_train_step), got {type(prog).__name__}")
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"tdx.explain: the folder {parent!r} of {path!r} does not "
                                f"exist; create it first")
    work = _planned_copy(prog)
    # The pass option takes a plain path: write under a temporary name, then
    # move the page where it is asked for.
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "plan.html")
        work.run_pipeline(f"tdx-explain{{output={page}}}")
        shutil.move(page, path)
    return path
