"""Hugging Face's own parallel plans, taken as they are: a model config's
``base_model_tp_plan`` and ``base_model_ep_plan`` (module or parameter name
pattern -> transformers' style name, relative to the base model) given to
:func:`tdx.parallelize` as its plan.

transformers' styles (``transformers/distributed/tensor_parallel.py`` and
``expert_parallel.py``) say where each parameter lives and which
collectives its forward runs; tdx takes the first and lets propagation
insert the second:

- ``colwise``, ``colwise_rep``, ``colwise_gather_output``: ColwiseParallel;
  ``rowwise``, ``rowwise_rep``, ``rowwise_split_input``: RowwiseParallel;
  ``embedding_rowwise``: the vocabulary split (VocabParallel);
  ``embedding_colwise``: the embedding dim split; ``sequence_parallel``:
  SequenceParallel; all over the mesh axis ``"tp"`` (or a 1-D mesh's axis);
- ``ep_dispatch_experts`` on an experts module: ``tdx.ExpertParallel`` over
  ``"ep"`` (or a 1-D mesh's axis), whose weights are the ``grouped_gemm``
  entries under it;
- ``replicate``, ``replicated_with_grad_allreduce``, ``all_reduce``,
  ``local_params``, ``moe_identity_expert``, ``moe_tp_experts``: replicated
  weights, or the collectives of a forward that tdx's placements insert
  themselves: nothing to place;
- ``packed_colwise``, ``packed_rowwise`` (experts' stacked gate/up halves
  each split) and ``mla_kv_a_proj``: layouts that no DTensor placement
  spells; tdx leaves those parameters to propagation and says so in a
  warning.
"""

import fnmatch
import warnings

from .errors import TdxWarning

_COLWISE = {"colwise", "colwise_rep", "colwise_gather_output"}
_ROWWISE = {"rowwise", "rowwise_rep", "rowwise_split_input"}
_NOTHING = {"replicate", "replicated_with_grad_allreduce", "all_reduce", "local_params",
            "moe_identity_expert", "moe_tp_experts"}
_UNSPELLED = {"packed_colwise", "packed_rowwise", "mla_kv_a_proj"}
_EXPERTS, _EXPERT_WEIGHT = "ep_dispatch_experts", "grouped_gemm"
KNOWN = (_COLWISE | _ROWWISE | _NOTHING | _UNSPELLED |
         {"embedding_rowwise", "embedding_colwise", "sequence_parallel", _EXPERTS, _EXPERT_WEIGHT})


def _axis(mesh, name, kind):
    if name in mesh.mesh_dim_names:
        return name
    if mesh.ndim == 1:
        return mesh.mesh_dim_names[0]
    raise ValueError(f"Hugging Face's {kind} styles go over the mesh axis named {name!r} (or a "
                     f"1-D mesh's one axis); this mesh's axes are {list(mesh.mesh_dim_names)}")


def translate(model, mesh, plan, styles):
    """tdx's plan for `plan` on `model` (the traced nn.Module): the entries
    whose style is one of transformers' names made absolute (the base
    model's prefix added where the pattern names nothing as it is) and
    turned into tdx styles, the others kept. Entries with nothing to place,
    and a model family's entries that name nothing in this model, are
    dropped (as transformers drops them); unknown names are refused.
    `styles` makes tdx's styles (the caller's, so that this module imports
    none of them): ``colwise``, ``rowwise``, ``vocab``, ``sequence``,
    ``experts`` take a mesh axis; ``placed(axis, {parameter: dim})``
    splits the named parameters of a module along those dims."""
    modules = dict(model.named_modules()) if model is not None else {}
    params = {n: p.dim() for n, p in model.named_parameters()} if model is not None else {}
    prefix = getattr(model, "base_model_prefix", "")
    prefix = f"{prefix}." if prefix and prefix in modules else ""

    def matching(pattern, names):
        return [n for n in names if fnmatch.fnmatchcase(n, pattern)]

    def absolute(pattern):
        if matching(pattern, list(modules) + list(params)) or not prefix:
            return pattern
        return prefix + pattern

    unknown = {k: v for k, v in plan.items() if isinstance(v, str) and v not in KNOWN}
    if unknown:
        raise ValueError(f"plan entries {unknown} name no Hugging Face parallel style tdx "
                         f"knows; the styles are {sorted(KNOWN)}")
    experts = {absolute(k) for k, v in plan.items() if v == _EXPERTS}
    out, left, split = {}, [], {}
    for key, name in plan.items():
        if not isinstance(name, str):
            out[key] = name
            continue
        pattern = absolute(key)
        weights = matching(pattern, params)
        if model is not None and not weights and not matching(pattern, modules):
            continue  # a model family's entry this model has not (transformers skips it too)
        if name in _NOTHING or (name == _EXPERT_WEIGHT and pattern.rpartition(".")[0] in experts):
            continue
        if name == _EXPERT_WEIGHT:
            raise ValueError(f"plan entry {key!r}: 'grouped_gemm' splits an experts module's "
                             f"weights over ep, but no 'ep_dispatch_experts' entry names its "
                             f"module ({pattern.rpartition('.')[0]!r}); give the plan whole "
                             f"(config.base_model_ep_plan)")
        if name in _UNSPELLED:
            left.append(f"{key} ({name})")
            continue
        if name == _EXPERTS:
            out[pattern] = styles.experts(_axis(mesh, "ep", "expert-parallel"))
            continue
        axis = _axis(mesh, "tp", "tensor-parallel")
        if weights and name in _COLWISE | _ROWWISE:
            # A parameter named itself (an experts module's stacked weight,
            # (experts, out, in)): split its out dim (colwise) or its in
            # dim (rowwise), as transformers' styles shard a parameter.
            module, _, leaf = pattern.rpartition(".")
            rank = params[weights[0]]
            if name in _COLWISE:
                split.setdefault((module, axis), {})[leaf] = max(rank - 2, 0)
            elif rank > 1:     # a rowwise bias stays whole
                split.setdefault((module, axis), {})[leaf] = rank - 1
        elif name in _COLWISE:
            out[pattern] = styles.colwise(axis)
        elif name in _ROWWISE:
            out[pattern] = styles.rowwise(axis)
        elif name == "embedding_rowwise":
            out[pattern] = styles.vocab(axis)
        elif name == "embedding_colwise":
            out[pattern] = styles.placed(axis, {"weight": 1})
        else:
            out[pattern] = styles.sequence(axis)
    for (module, axis), dims in split.items():
        if module in out:
            raise ValueError(f"plan entries place parameters of {module!r} ({sorted(dims)}) and "
                             f"the module whole ({out[module]!r}); give one of the two")
        out[module] = styles.placed(axis, dims)
    if left:
        warnings.warn(f"tdx: Hugging Face plan entries {left} split a tensor in a way no "
                      f"DTensor placement spells (packed halves); tdx leaves them to "
                      f"propagation, which places them by cost", TdxWarning, stacklevel=3)
    return out
