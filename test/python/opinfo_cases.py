"""PyTorch's OpInfo database (torch.testing._internal.common_methods_invocations.
op_db, 644 ops with a float32 CPU sample in torch 2.15) as tdx cases: each op's first
float32 sample on the CPU, and per stage the ops expected to fail, with
why. test_opinfo.py runs them.

A case is named as OpInfo's tests name the op: `name` or
`name.variant_test_name`. Its forward runs the op on the sample's tensors
(every tensor in the input, the args and the kwargs is an input of the
traced program; everything else is a constant). Its backward makes the
sample's first floating tensor a parameter and takes one SGD step on
`sum(out * ramp)` over the op's floating outputs (`ramp` a fixed ramp in
[0.5, 1.5) of each output's shape), against autograd's gradient.
"""

import torch


def op_db():
    """The OpInfo database (torch's test utilities import `expecttest`,
    which requirements.txt pins)."""
    from torch.testing._internal.common_methods_invocations import op_db as db
    return db


def _flat(x, acc):
    if isinstance(x, torch.Tensor):
        acc.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _flat(v, acc)
    elif isinstance(x, dict):
        for v in x.values():
            _flat(v, acc)
    return acc


def _rebuild(x, it):
    if isinstance(x, torch.Tensor):
        return next(it)
    if isinstance(x, list):
        return [_rebuild(v, it) for v in x]
    if isinstance(x, tuple):
        return tuple(_rebuild(v, it) for v in x)
    if isinstance(x, dict):
        return {k: _rebuild(v, it) for k, v in x.items()}
    return x


def ramp(out):
    """The backward's fixed weights of one output: a ramp in [0.5, 1.5)."""
    n = max(out.numel(), 1)
    return (torch.arange(out.numel(), dtype=out.dtype) / n + 0.5).reshape(out.shape)


class Case:
    """One op's first float32 sample: `inputs` (its tensors, in order) and
    `__call__(*inputs)`, the op's tensor outputs as a tuple."""

    def __init__(self, op):
        self.op = op
        self.name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        torch.manual_seed(0)
        sample = next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=False)))
        self.structure = (sample.input, sample.args, sample.kwargs)
        self.inputs = tuple(t.detach().clone() for t in _flat(self.structure, []))
        # The backward's parameter: the first floating input.
        self.param = next((i for i, t in enumerate(self.inputs) if t.is_floating_point()), None)

    def __call__(self, *xs):
        inp, args, kwargs = _rebuild(self.structure, iter(xs))
        return tuple(_flat(self.op(inp, *args, **kwargs), []))

    def loss(self, *xs):
        """The backward's loss: sum(out * ramp) over the floating outputs."""
        total = None
        for out in self(*xs):
            if out.is_floating_point():
                term = (out * ramp(out)).sum()
                total = term if total is None else total + term
        return total


# Ops whose result eager does not define or draws at random: tdx's Philox
# streams are its own (docs/dialect.md, tdx.uniform), and an empty tensor's
# values are whatever memory held. Their outputs are checked for shape and
# dtype only.
UNDEFINED_VALUES = {
    "bernoulli", "empty_like", "new_empty", "new_empty_strided", "normal", "normal.number_mean",
    "rand_like", "randint_like", "randn_like", "uniform", "nn.functional.dropout",
    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train", "nn.functional.rrelu",
    "empty", "randn", "multinomial", "cauchy", "exponential", "geometric", "log_normal",
    "normal.in_place",
}


def cases():
    """Every op of the database with a float32 sample whose first sample
    eager runs, that has a tensor input and a tensor output; and the ops
    left out, with why."""
    out, left_out = [], {}
    for op in op_db():
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if torch.float32 not in op.supported_dtypes("cpu"):
            left_out[name] = "no float32 on the CPU"
            continue
        try:
            case = Case(op)
            want = case(*case.inputs)
        except Exception as e:  # e.g. jiterator's ops: CUDA only
            left_out[name] = f"its sample does not run eagerly here: {str(e).splitlines()[0]}"
            continue
        if not case.inputs or not want:
            left_out[name] = "no tensor input or no tensor output (a factory or a predicate)"
            continue
        out.append(case)
    return out, left_out


# --- expected failures, per stage and op, with why ---------------------------

_DATA = ("its output's shape depends on the data: a static program cannot hold it (refused at "
         "trace, naming the op and the rewrite)")
_SPECIAL_NAN = ("non-finite values where eager has them differ: tdx computes the op through "
                "ATen, which the comparison must check")

_TRACE = {
    "to_sparse": "sparse tensors are not captured (tdx programs are dense)",
    **{n: _DATA for n in ("masked_select", "unique", "unique_consecutive", "nonzero",
                           "argwhere")},
    "chalf": "complex32 (ComplexHalf) has no tdx element type: complex64 and complex128 do",
    "istft": "torch checks its window's overlap-add through aten::equal (reads data)",
    "sparse.sampled_addmm": "sparse tensors are not captured (tdx programs are dense)",
    "tensor_split": ("its split points are a tensor's values (the sample's), so the pieces' "
                     "shapes depend on data; split points given as ints trace"),
    "sparse.mm.reduce": "sparse tensors are not captured (tdx programs are dense)",
    "hash_tensor": "its result is uint64, which has no tdx element type",
    **{n: ("writes its running statistics (arguments it does not return) in place beside "
           "its new tensors: refused at trace, naming F.batch_norm")
       for n in ("_native_batch_norm_legit", "_batch_norm_with_update")},
    "nn.functional.rrelu": ("training mode's rrelu_with_noise writes its noise argument in "
                            "place beside its result: refused at trace, naming the op"),
    **{n: ("a custom op torch defines in Python (torch_nn::_linear_cross_entropy_*): a "
           "compiled program's ATen, C++ only, does not have it (refused when it runs)")
       for n in ("nn.functional.linear_cross_entropy.chunked",
                 "nn.functional.linear_cross_entropy.chunked_none")},
    "nn.functional.gaussian_nll_loss": ("data-dependent control flow in torch's Python (it "
                                        "checks that var is positive)"),
}

_SCALAR_BACKWARD = ("its backward formula in torch reads a value (the reduce mode's "
                    "zeros, through aten::_local_scalar_dense) even for fake tensors")
# Trace failures of the training step only.
_TRACE_BACKWARD = {
    "nn.functional.embedding_bag": (
        "torch's meta kernel for _embedding_bag gives the CUDA kernel's offset2bag shape "
        "on meta tensors (the CPU runtime's shape check names it), and its CPU backward "
        "resizes a tensor in place"),
    "index_reduce": _SCALAR_BACKWARD,
}

STAGES = ("forward", "forward-dp2", "backward", "backward-dp2")
# What fails at trace or check fails in every stage.
XFAIL = {stage: dict(_TRACE) for stage in STAGES}
for _stage in ("backward", "backward-dp2"):
    XFAIL[_stage].update(_TRACE_BACKWARD)
