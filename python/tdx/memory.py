"""The working memory of a step, measured as tdx's model binaries measure
their own (``--verbose``): ``tdx.working_memory(step)``."""

from . import _C


def working_memory(step, warmup=1):
    """Runs ``step()`` ``warmup`` times, then once more, and returns what that
    last call took from ATen's CPU allocator, as a dict:

    - ``working``: the peak bytes of live tensors during the call over those
      live when it began (a model binary's "working memory of a step");
    - ``peak``: the bytes of live tensors at that peak, all of them (those
      made before the pool was installed, by the first call, not counted);
    - ``system_allocations``: the tensor allocations of the call that the
      pool could not serve from blocks freed earlier.

    The measurement replaces ATen's CPU allocator in this process with the
    model binaries' step memory pool, for good (a freed block is kept for
    the next tensor of its size): call it in a process of its own where
    timings matter."""
    if not callable(step):
        raise TypeError(f"working_memory takes a callable step, got {type(step).__name__}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    _C.install_step_memory_pool()
    for _ in range(warmup):
        step()
    base, allocations = _C.tensor_memory_current(), _C.tensor_memory_system_allocations()
    _C.tensor_memory_reset_peak()
    step()
    return {"working": _C.tensor_memory_peak() - base, "peak": _C.tensor_memory_peak(),
            "system_allocations": _C.tensor_memory_system_allocations() - allocations}
