"""tdx: a compiler for distributed PyTorch models.

Capture: build models without allocating them, with fake tensors and
deferred initialization recorded at torch's dispatcher (torch >= 2.11),
and materialize them bitwise equal to eager construction.

    import torch, tdx
    torch.manual_seed(0)
    model = tdx.deferred_init(MyModel, hidden=4096)   # no parameter storage
    tdx.materialize_module(model)                      # real, as eager would be
"""

import torch  # noqa: F401  (the extension needs libtorch loaded first)

from ._torch_version import UnsupportedTorchError, check as _check_torch

_check_torch(torch.__version__)  # before the extension, which an old torch cannot load

from . import _C  # noqa: F401
from .errors import CaptureError, CheckpointError, FakeTensorError, InputError, TdxError, TdxWarning
from .deferred import (
    capture_way,
    deferred_init,
    fake_mode,
    is_deferred,
    is_fake,
    materialize_module,
    materialize_tensor,
    meta_like,
)
from .program import Program, capture, trace
from .compile import Executable, compile
from .runner import Runner
from .training import trace_train_step
from .generation import trace_generate
from .memory import working_memory
from .explain import explain
from .auto import auto_parallelize
from .precision import MixedPrecision
from .regions import local_map, shard_map
from .torch_collectives import ragged_all_to_all
from .context_parallel import ContextParallel
from .expert_parallel import ExpertParallel
from .torch_plans import recorded_plan
from . import checkpoint, store
from .checkpoint import slice  # noqa: A004 (TorchShard's name)
from .sharding import (
    ColwiseParallel,
    DeviceMesh,
    Partial,
    Pipeline,
    Replicate,
    RowwiseParallel,
    SequenceParallel,
    Shard,
    VocabParallel,
    init_device_mesh,
    parallelize,
)

__all__ = [
    "ContextParallel",
    "ExpertParallel",
    "local_map",
    "ragged_all_to_all",
    "shard_map",
    "UnsupportedTorchError",
    "checkpoint",
    "store",
    "slice",
    "CheckpointError",
    "InputError",
    "trace_train_step",
    "trace_generate",
    "working_memory",
    "explain",
    "auto_parallelize",
    "recorded_plan",
    "MixedPrecision",
    "Executable",
    "Runner",
    "compile",
    "ColwiseParallel",
    "DeviceMesh",
    "Partial",
    "Pipeline",
    "Replicate",
    "RowwiseParallel",
    "SequenceParallel",
    "Shard",
    "VocabParallel",
    "init_device_mesh",
    "parallelize",
    "CaptureError",
    "Program",
    "capture",
    "trace",
    "FakeTensorError",
    "TdxError", "TdxWarning",
    "deferred_init",
    "capture_way",
    "fake_mode",
    "is_deferred",
    "is_fake",
    "materialize_module",
    "materialize_tensor",
    "meta_like",
]
