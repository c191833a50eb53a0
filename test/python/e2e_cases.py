"""The op-by-op end-to-end suite's cases, in the style of torch-mlir's
e2e tests: one registered case per supported op (a small function of its
inputs, written as PyTorch users write it), and per backend the ops that
are expected to fail, with why.

A case is named by what it covers: a tdx op (`tdx.conv`) that capture must
produce for it, or an aten op that tdx-raise-aten decomposes into tdx ops
(`aten::native_batch_norm`), after which no generic op may remain.

Adding an op: add its case here. test_e2e_ops.py fails, naming the op,
when a tdx op in the dialect (docs/dialect.md, generated from ODS) has
neither a case nor an entry in NOT_CAPTURED.
"""

import torch
import torch.nn.functional as F

CASES = {}


class Case:
    def __init__(self, name, fn, inputs):
        self.name, self.fn, self.inputs = name, fn, inputs

    def __call__(self, *xs):
        """The case's outputs as a tuple."""
        out = self.fn(*xs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def R(*shape, low=None, seed=0):
    """Random float32 input (positive when `low` is given)."""
    x = torch.randn(*shape, generator=_gen(seed + sum(shape)))
    return x.abs() + low if low is not None else x


def I(high, *shape, seed=0):
    return torch.randint(0, high, shape, generator=_gen(seed + high))


def case(name, fn, *inputs):
    assert name not in CASES, f"two cases for {name}"
    CASES[name] = Case(name, fn, inputs)


# --- the elementwise table (include/tdx/Runtime/ElementwiseOps.def) ---------
case("tdx.neg", lambda x: -x, R(4, 6))
case("tdx.abs", torch.abs, R(4, 6))
case("tdx.relu", F.relu, R(4, 6))
case("tdx.exp", torch.exp, R(4, 6))
case("tdx.log", torch.log, R(4, 6, low=0.1))
case("tdx.sqrt", torch.sqrt, R(4, 6, low=0.1))
case("tdx.rsqrt", torch.rsqrt, R(4, 6, low=0.1))
case("tdx.tanh", torch.tanh, R(4, 6))
case("tdx.sigmoid", torch.sigmoid, R(4, 6))
case("tdx.silu", F.silu, R(4, 6))
case("tdx.sin", torch.sin, R(4, 6))
case("tdx.cos", torch.cos, R(4, 6))
case("tdx.erf", torch.erf, R(4, 6))
case("tdx.hardswish", F.hardswish, R(4, 6) * 4)
case("tdx.hardsigmoid", F.hardsigmoid, R(4, 6) * 4)
case("tdx.add", lambda x, y: torch.add(x, y, alpha=2), R(4, 6), R(6))
case("tdx.sub", lambda x, y: x - y, R(4, 6), R(4, 1))
case("tdx.mul", lambda x, y: x * y * 3, R(4, 6), R(6))
case("tdx.div", lambda x, y: x / y, R(4, 6), R(4, 6, low=0.5))
case("tdx.pow", lambda x, y: x ** y + x ** 2 + x ** 0.5 - x ** -1 + x ** 3 - x ** 2.5,
     R(4, 6, low=0.5), R(4, 6))
case("tdx.maximum", torch.maximum, R(4, 6), R(4, 6))
case("tdx.minimum", torch.minimum, R(4, 6), R(6))

# --- other elementwise ------------------------------------------------------
case("tdx.cmp", lambda x, y: (x < y).float() + (x >= 0.5).float(), R(4, 6), R(4, 6))
case("tdx.where", lambda c, x, y: torch.where(c > 0, x, y), R(4, 6), R(4, 6), R(6))
case("tdx.gelu", lambda x: F.gelu(x) + F.gelu(x, approximate="tanh"), R(4, 6))
case("tdx.cast", lambda x: (x * 10).long() + x.double().sum().long(), R(4, 6))

# --- contractions, reductions, normalizations, embedding, losses ------------
case("tdx.matmul", torch.matmul, R(2, 4, 6), R(6, 5))
# The second output's bias is added by the gelu's kernel (bias + activation).
case("tdx.linear", lambda x, w, b: (F.linear(x, w, b), F.gelu(F.linear(x * 2, w, b), approximate="tanh")),
     R(4, 3, 6), R(5, 6), R(5))
case("tdx.sum", lambda x: x.sum(-1), R(4, 6))
case("tdx.mean", lambda x: x.mean((1, 2), keepdim=True), R(4, 3, 6))
case("tdx.max", lambda x: x.amax(-1), R(4, 6))
# The second and later outputs give the row op an elementwise prologue that
# ends in it (the scale and mask of attention, the residual add of a norm).
case("tdx.softmax", lambda x, m: (x.softmax(-1), x.softmax(0),
                                  (x * 0.5).masked_fill(m > 0, float("-inf")).softmax(-1)),
     R(4, 6), R(6))
case("tdx.log_softmax", lambda x: (F.log_softmax(x, dim=1), F.log_softmax(x * 2 - 1, dim=-1),
                                   F.log_softmax(x * 2, dim=0)), R(4, 6))
case("aten::norm", lambda x: torch.norm(x, 2.0), R(4, 6))
case("aten::linalg_vector_norm", lambda x: torch.linalg.vector_norm(x, 2.0, dim=1), R(4, 6))
case("tdx.layer_norm", lambda x, h, w, b: (F.layer_norm(x, (6,), w, b), x + h,
                                            F.layer_norm(x + h, (6,), w, b),
                                            F.layer_norm(x * 2, (6,)), F.layer_norm(x - h, (3, 6))),
     R(4, 3, 6), R(4, 3, 6, seed=1), R(6), R(6))
case("tdx.embedding", lambda ids, w: F.embedding(ids, w), I(10, 4, 3), R(10, 6))
case("tdx.cross_entropy", F.cross_entropy, R(4, 7), I(7, 4))

# --- convolution and pooling -----------------------------------------------
case("tdx.conv", lambda x, w, b, x1, w1: (F.conv2d(x, w, b, stride=2, padding=1),
                                          F.conv1d(x1, w1, groups=2, dilation=2)),
     R(2, 3, 9, 9), R(4, 3, 3, 3), R(4), R(2, 4, 12), R(6, 2, 3))
case("tdx.max_pool", lambda x: F.max_pool2d(x, 3, 2, 1), R(2, 3, 9, 8))
case("tdx.avg_pool", lambda x: F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False),
     R(2, 3, 9, 8))

# --- shapes and creation ----------------------------------------------------
case("tdx.reshape", lambda x: x.reshape(4, 3, 2) * 2, R(4, 6))
case("tdx.transpose", lambda x: x.transpose(0, 1) * 2, R(4, 6))
case("tdx.permute", lambda x: x.permute(2, 0, 1) * 2, R(4, 3, 6))
case("tdx.slice", lambda x: x[:, 1:5:2] * 2, R(4, 6))
case("tdx.concat", lambda x, y: torch.cat([x, y], dim=1), R(4, 6), R(4, 2))
case("tdx.expand", lambda x: x[:, None].expand(4, 3, 6) * 2, R(4, 6))
case("tdx.full", lambda x: x + torch.ones(6), R(4, 6))
case("tdx.arange", lambda x: x + torch.arange(6), R(4, 6))

# --- aten ops that tdx-raise-aten decomposes into tdx ops -------------------
case("aten::native_batch_norm",
     lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False, eps=1e-3),
     R(2, 3, 4, 4), R(3), R(3, low=0.5), R(3), R(3))
case("aten::clamp", lambda x: x.clamp(-0.5, 0.5) + F.relu6(x * 4) + x.clamp(min=0.1), R(4, 6))
case("aten::masked_fill", lambda x, m: x.masked_fill(m > 0, -1.0), R(4, 6), R(4, 6))
case("aten::triu", lambda x: x.triu(1) + x.tril(-1), R(5, 5))
case("aten::outer", torch.outer, R(4), R(6))
case("aten::reciprocal", torch.reciprocal, R(4, 6, low=0.5))
# Along a middle dim (at::cat) and along a new last dim (pieces copied into
# their strided slices: tdx::rt::concat).
case("aten::stack", lambda x, y: torch.stack([x, y], dim=1) + torch.stack([x, y], -1).transpose(1, 2),
     R(4, 6), R(4, 6))
case("aten::addmm", torch.addmm, R(6), R(4, 5), R(5, 6))
case("aten::baddbmm", torch.baddbmm, R(1, 4, 6), R(3, 4, 5), R(3, 5, 6))
case("aten::adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 1), R(2, 3, 5, 5))
case("aten::repeat_interleave", lambda x: x.repeat_interleave(3, dim=1), R(4, 2, 5))
case("aten::roll", lambda x: torch.roll(x, (2, -1), (1, 0)), R(4, 6))
case("aten::constant_pad_nd", lambda x: F.pad(x, (1, 2, 0, 1), value=-1.0), R(4, 6))
case("aten::index", lambda t, i: t[i] * 2, R(10, 3, 2), I(10, 5))


def _write_slice(x, s):
    y = x.clone()
    y[:, 1:3] = s
    y[0] = 0.5
    return y


case("aten::slice_scatter", _write_slice, R(4, 6), R(4, 2))
# RMSNorm (torch 2.x decomposes it on the CPU; tdx-raise-aten makes the
# chain one op again), with and without a weight.
case("tdx.rms_norm", lambda x, w: (F.rms_norm(x, (6,), w, 1e-6), F.rms_norm(x * 2, (6,))),
     R(4, 6), R(6, seed=1))
# Fused attention: grouped-query heads (4 query, 2 kv), causal; an additive
# mask with a scale.
case("tdx.sdpa", lambda q, k, v, m: (
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    F.scaled_dot_product_attention(q, q, q, attn_mask=m, scale=0.5)),
    R(2, 4, 6, 8), R(2, 2, 6, 8, seed=1), R(2, 2, 6, 8, seed=2), R(6, 6, seed=3))

# tdx ops that capture never produces from a PyTorch model, and why. The
# e2e suite skips them; their lit tests and other pytest files cover them.
NOT_CAPTURED = {
    "tdx.aten": "the generic op itself (every uncovered aten op)",
    "tdx.sdpa_backward": "a training step's backward of tdx.sdpa (test_modern_decoder.py, "
                         "test/Passes/raise-aten.mlir)",
    "tdx.empty": "only in init programs (torch.empty before an init op)",
    "tdx.uniform": "init programs only (test_capture, ShardedInitTest)",
    "tdx.normal": "init programs only (test_capture, ShardedInitTest)",
    "tdx.bernoulli": "random (training-mode dropout's mask): no eager oracle draws tdx's "
                     "values; test_training checks it against its definition (philox.py)",
    "tdx.trunc_normal": "init programs only: torch.nn.init.trunc_normal_ under deferred init "
                        "(test_deferred_init)",
}
# Structure, sharding and collective ops: not compute a model writes.
# tdx.assign: training steps, test_training.py. tdx.send and tdx.recv: a
# pipeline's messages, made per rank by tdx-schedule-pipeline after placement
# (test_pipeline.py, test/Passes/pipeline.mlir). tdx.collective_permute: a
# user's own message (tdx.mpi Isend/Irecv, funcol's permute_tensor), raised by
# tdx-manual-program (test_mpi_compiled.py, test/Passes/manual-program.mlir).
# tdx.to_local and tdx.from_local: a manual region's edges (tdx.local_map),
# the identity after partitioning (test_manual_regions.py,
# test/Passes/manual-region.mlir). tdx.ragged_all_to_all: a region's dispatch
# of rows whose counts are values (tdx.ragged_all_to_all, ExpertParallel;
# test_expert_parallel.py, test/Dialect/sharding.mlir).
STRUCTURAL = {"tdx.mesh", "tdx.parameter", "tdx.buffer", "tdx.param_ref", "tdx.assign", "tdx.yield",
              "tdx.annotate", "tdx.redistribute", "tdx.all_gather", "tdx.all_reduce",
              "tdx.all_to_all", "tdx.reduce_scatter", "tdx.broadcast", "tdx.chunk",
              "tdx.mesh_coord", "tdx.send", "tdx.recv", "tdx.collective_permute",
              "tdx.to_local", "tdx.from_local", "tdx.ragged_all_to_all"}

# What the backend pipeline (tdx-backend) makes of a partitioned step, after
# placement: no sharding rule and no capture case; lit covers them
# (test/Passes/fuse-elementwise.mlir, async-collectives.mlir,
# test/Dialect/backend-invalid.mlir).
BACKEND = {"tdx.fused", "tdx.start", "tdx.wait"}

# Expected failures per backend: case -> why. A case listed here that
# passes fails the suite (the table must stay true).
XFAIL = {
    "reference": {},
    "cpu": {},
    "cpu-dp2": {},
    "cuda-compile": {},
}
