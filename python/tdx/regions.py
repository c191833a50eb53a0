"""Manual regions: per-shard code with the user's collectives inside a
program tdx places (``tdx.local_map``, torch's ``local_map`` signature, and
``tdx.shard_map``, JAX's).

Inside a trace, a region's inputs enter through ``torch.ops.tdx.to_local``
(this rank's piece of the global value under the input's placements) and
its outputs leave through ``torch.ops.tdx.from_local``; the region's body is
recorded between them with the per-rank shapes, and its collectives
(``tdx.mpi``'s, torch's functional collectives) are the user's. The IR keeps
the edges as ``tdx.to_local`` / ``tdx.from_local``: propagation places the
program around the region and nothing in it, ``tdx-check-replication``
checks the outputs claimed Replicate, and ``tdx-partition`` makes the body
each rank's code (docs/mpi.md, "Manual regions").

Adjoints, in the sum semantics of the collectives' own (all_reduce <->
all_reduce, as mpi4torch's): ``to_local`` <-> ``from_local`` with the
gradient placements (``in_grad_placements``; by default Shard stays Shard,
a Replicate input's gradient is the ranks' sum, Partial, and a Partial
input's is Replicate); a Replicate output's gradient is shared among its n
equal copies (each rank gets 1/n of it), a Partial output's is every
rank's whole. With these a region's gradients are eager's.
"""

import functools
import re

import torch
import torch.utils._pytree as pytree

from . import collectives as _c
from .errors import CaptureError
from .placements import Partial, Replicate, Shard

_LIB = _c._LIB
_EDGE = "str sharding, int[] mesh_shape, str mesh_axes, str site"
_LIB.define(f"to_local(Tensor x, {_EDGE}, str grad_sharding) -> Tensor")
_LIB.define(f"from_local(Tensor x, {_EDGE}, bool unchecked) -> Tensor")


def _eager(name):
    def run(*args):
        raise CaptureError(f"torch.ops.tdx.{name} is a manual region's edge inside a program "
                           f"tdx traces; call tdx.local_map / tdx.shard_map")
    return run


for _name in ("to_local", "from_local"):
    _LIB.impl(_name, _eager(_name), "CompositeExplicitAutograd")


def _placements(sharding):
    inner = re.search(r"\[(.*)\]", sharding).group(1)
    return [p.strip() for p in inner.split(",")]


def _local_shape(shape, sharding, mesh_shape, site, grow=False):
    shape = list(shape)
    for axis, p in enumerate(_placements(sharding)):
        m = re.fullmatch(r"Shard\((\d+)\)", p)
        if not m:
            continue
        d = int(m.group(1))
        if d >= len(shape):
            raise CaptureError(f"the region at {site} places Shard({d}) on a {len(shape)}-D "
                               f"tensor; give a dim it has")
        if grow:
            shape[d] *= mesh_shape[axis]
        elif shape[d] % mesh_shape[axis]:
            raise CaptureError(f"the region at {site}: dim {d} of size {shape[d]} does not "
                               f"split evenly over {mesh_shape[axis]} ranks; a manual "
                               f"region's pieces are equal (pad the tensor)")
        else:
            shape[d] //= mesh_shape[axis]
    return shape


@torch.library.register_fake("tdx::to_local")
def _(x, sharding, mesh_shape, mesh_axes, site, grad_sharding):
    return x.new_empty(_local_shape(x.shape, sharding, mesh_shape, site))


@torch.library.register_fake("tdx::from_local")
def _(x, sharding, mesh_shape, mesh_axes, site, unchecked):
    return x.new_empty(_local_shape(x.shape, sharding, mesh_shape, site, grow=True))


def _save(ctx, inputs, output):
    ctx.args = inputs[1:]


def _to_local_backward(ctx, g):
    sharding, mesh_shape, mesh_axes, site, grad_sharding = ctx.args
    out = torch.ops.tdx.from_local(g, grad_sharding, mesh_shape, mesh_axes,
                                   site + " (backward)", False)
    return (out,) + (None,) * 5


def _from_local_backward(ctx, g):
    sharding, mesh_shape, mesh_axes, site, unchecked = ctx.args
    # A Partial output's gradient is every rank's whole gradient; a
    # Replicate one's is shared: each of the n equal copies gets 1/n (the
    # collectives' adjoints sum what the ranks hold, as mpi4torch's do).
    back = re.sub(r"Partial\(\w+\)", "Replicate", sharding)
    out = torch.ops.tdx.to_local(g, back, mesh_shape, mesh_axes, site + " (backward)", back)
    copies = 1
    for axis, p in enumerate(_placements(sharding)):
        if p == "Replicate":
            copies *= mesh_shape[axis]
    if copies > 1:
        out = out / copies
    return (out,) + (None,) * 5


torch.library.register_autograd("tdx::to_local", _to_local_backward, setup_context=_save)
torch.library.register_autograd("tdx::from_local", _from_local_backward, setup_context=_save)


def check(prog):
    """tdx-check-replication on a copy of an unplaced `prog` with manual
    regions, here where the IR still has the user's lines (tdx-compile
    places it from the printed program, which has not; a placed program
    was checked by tdx-place)."""
    if prog.is_partitioned or prog._module.is_placed() or \
            not prog._module.has_manual_regions():
        return
    prog.copy().run_pipeline("tdx-check-replication")


def torch_wrapped(original):
    """A stand-in for torch's ``_func_map._local_map_wrapped`` (what the
    function torch's ``local_map`` returns calls) that makes tdx's region:
    torch's local_map called inside a trace records one."""
    import inspect
    params = list(inspect.signature(original).parameters.values())
    fixed = next(i for i, p in enumerate(params) if p.kind is p.VAR_POSITIONAL)

    def wrapped(*a, **kwargs):
        func, out, inp, grad, mesh = a[:5]
        return local_map(func, out, inp, grad, mesh)(*a[fixed:], **kwargs)
    return wrapped


# -- the API -----------------------------------------------------------------

def _mesh_of(mesh):
    """(name, shape, axes) of a tdx or torch DeviceMesh."""
    if mesh is None:
        raise CaptureError("a manual region needs its mesh: give mesh= (a tdx.DeviceMesh, "
                           "tdx.init_device_mesh)")
    names = getattr(mesh, "mesh_dim_names", None)
    ranks = getattr(mesh, "mesh", None)
    shape = tuple(ranks.shape) if isinstance(ranks, torch.Tensor) else \
        tuple(getattr(mesh, "shape", ()))
    if not shape:
        raise CaptureError(f"a manual region's mesh is a DeviceMesh, not {type(mesh).__name__}")
    names = tuple(names or (f"dim{i}" for i in range(len(shape))))
    return getattr(mesh, "name", "mesh"), shape, names


def _is_placement(p):
    from . import torch_plans
    try:
        torch_plans.placement(p)
        return True
    except TypeError:
        return False


def _spec(spec, ndim, what):
    """tdx placements, one per mesh axis, for one tensor's spec."""
    from . import torch_plans
    if _is_placement(spec):
        spec = (spec,)
    spec = [torch_plans.placement(p) for p in spec]
    if len(spec) != ndim:
        raise CaptureError(f"{what} has {len(spec)} placement(s) for a {ndim}-D mesh; give "
                           f"one per mesh axis")
    return spec


def _sharding(name, spec):
    return f"#tdx.sharding<@{name}, [{', '.join(str(p) for p in spec)}]>"


def _default_grad(spec):
    # Shard stays Shard; a Replicate input's gradient is the sum of what
    # the ranks computed from it (Partial); a Partial input's is the whole
    # gradient on every rank (Replicate).
    return [p if isinstance(p, Shard) else Replicate() if isinstance(p, Partial) else Partial()
            for p in spec]


def local_map(func=None, out_placements=None, in_placements=None, in_grad_placements=None,
              device_mesh=None, *, mesh=None, redistribute_inputs=True, check_replication=True):
    """Runs ``func`` on each rank's pieces of its tensor arguments, as torch's
    ``torch.distributed.tensor.experimental.local_map`` (same signature; its
    ``device_mesh`` may be given as ``mesh=``).

    ``in_placements``: per flattened argument, its placements (one per mesh
    axis), or None for a non-tensor (a tensor with None is read whole).
    ``out_placements``: the same per flattened output (one spec for a single
    output): Shard concatenates the ranks' pieces, Partial sums them,
    Replicate claims they are equal, which tdx checks at compile time
    (``check_replication=False`` turns that off). ``in_grad_placements``:
    the inputs' gradients' placements; by default Shard for a Shard input,
    Partial (the ranks' sum) for a Replicate one, Replicate for a Partial
    one; a Replicate output's gradient is shared among its equal copies, so
    with the collectives' adjoints the gradients are eager's.

    Inside ``tdx.trace`` / ``tdx.trace_train_step`` the body is a manual
    region: collectives inside it (``tdx.mpi.comm(mesh, axis)``, torch's
    functional collectives with ``(mesh, axis)``) are the user's; the
    program around it is placed as any other. Outside a trace, on plain
    tensors, ``func`` runs as it is (torch's local_map does the same).
    A function built with torch's ``local_map`` may be given as ``func``:
    its arguments are read from it. ``redistribute_inputs`` is accepted
    for torch's signature: tdx always moves an input to its
    ``in_placements`` (propagation picks the collective)."""
    if func is None:
        return functools.partial(local_map, out_placements=out_placements,
                                 in_placements=in_placements,
                                 in_grad_placements=in_grad_placements,
                                 device_mesh=device_mesh, mesh=mesh,
                                 redistribute_inputs=redistribute_inputs,
                                 check_replication=check_replication)
    inner = _from_torch(func)
    if inner is not None:
        func, out_placements, in_placements, in_grad_placements, torch_mesh = inner
        device_mesh = device_mesh or torch_mesh
    the_mesh = mesh if mesh is not None else device_mesh

    @functools.wraps(func)
    def run(*args, **kwargs):
        if _c.recording() is None:
            return func(*args, **kwargs)
        return _region(func, args, kwargs, out_placements, in_placements, in_grad_placements,
                       the_mesh, check_replication, _c.site())
    return run


def _from_torch(func):
    """(func, out, in, in_grad, mesh) of a function torch's local_map made."""
    if not isinstance(func, functools.partial):
        return None
    try:
        from torch.distributed.tensor.experimental import _func_map
    except ImportError:
        return None
    if func.func is not getattr(_func_map, "_local_map_wrapped", None):
        return None
    f, out, inp, grad, mesh = func.args[:5]
    return f, out, inp, grad, mesh


def _region(func, args, kwargs, out_placements, in_placements, in_grad_placements, mesh,
            check, site):
    name, shape, axes = _mesh_of(mesh)
    ndim = len(shape)
    common = (list(shape), ",".join(axes))
    flat, tree = pytree.tree_flatten(args)
    if in_placements is not None and len(in_placements) != len(flat):
        raise CaptureError(f"the region at {site} has {len(flat)} argument(s) but "
                           f"{len(in_placements)} in_placements; give one per argument "
                           f"(None for a non-tensor)")
    if in_grad_placements is not None and len(in_grad_placements) != len(flat):
        raise CaptureError(f"the region at {site}: in_grad_placements has "
                           f"{len(in_grad_placements)} entries for {len(flat)} argument(s)")
    local = []
    for i, a in enumerate(flat):
        spec = in_placements[i] if in_placements is not None else None
        if not isinstance(a, torch.Tensor) or spec is None:
            if spec is not None:
                raise CaptureError(f"the region at {site}: argument {i} is not a tensor, so "
                                   f"its in_placements entry must be None")
            local.append(a)
            continue
        spec = _spec(spec, ndim, f"in_placements[{i}] of the region at {site}")
        given = in_grad_placements[i] if in_grad_placements is not None else None
        grad = _spec(given, ndim, f"in_grad_placements[{i}]") if given is not None \
            else _default_grad(spec)
        local.append(torch.ops.tdx.to_local(a, _sharding(name, spec), *common, site,
                                            _sharding(name, grad)))
    out = func(*pytree.tree_unflatten(local, tree), **kwargs)
    flat_out, out_tree = pytree.tree_flatten(out)
    specs = out_placements
    if specs is None or _is_placement(specs) or (
            isinstance(specs, (tuple, list)) and specs and all(map(_is_placement, specs))
            and len(flat_out) == 1):
        specs = (specs,)
    if len(specs) != len(flat_out):
        raise CaptureError(f"the region at {site} returns {len(flat_out)} value(s) but has "
                           f"{len(specs)} out_placements; give one per output (None for a "
                           f"non-tensor)")
    result = []
    for j, (o, spec) in enumerate(zip(flat_out, specs)):
        if not isinstance(o, torch.Tensor):
            if spec is not None:
                raise CaptureError(f"the region at {site}: output {j} is not a tensor, so its "
                                   f"out_placements entry must be None")
            result.append(o)
            continue
        if spec is None:
            raise CaptureError(f"the region at {site}: output {j} is a tensor; give its "
                               f"placements in out_placements")
        spec = _spec(spec, ndim, f"out_placements[{j}] of the region at {site}")
        result.append(torch.ops.tdx.from_local(o, _sharding(name, spec), *common, site,
                                               not check))
    return pytree.tree_unflatten(result, out_tree)


def _is_pspec(s):
    """Whether `s` is one PartitionSpec (entries: an axis name or None)."""
    return s is None or (isinstance(s, tuple) and
                         all(e is None or isinstance(e, str) for e in s))


def _partition_spec(spec, axes, ndim_tensor, what):
    """JAX's PartitionSpec (per tensor dim: an axis name, a tuple of names or
    None) as tdx placements."""
    placements = [Replicate() for _ in axes]
    if spec is None:
        return placements
    spec = tuple(spec)
    for d, entry in enumerate(spec):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        if len(names) > 1:
            raise CaptureError(f"{what}: dim {d} is split over {names}; tdx splits one dim "
                               f"over one mesh axis")
        for n in names:
            if n not in axes:
                raise CaptureError(f"{what}: the mesh has no axis {n!r} (its axes: {axes})")
            if not isinstance(placements[axes.index(n)], Replicate):
                raise CaptureError(f"{what}: axis {n!r} splits two dims")
            placements[axes.index(n)] = Shard(d)
    return placements


def shard_map(f, mesh, in_specs, out_specs, axis_names=None, check_replication=True,
              check_rep=None):
    """JAX's ``shard_map``: ``f`` runs on each rank's blocks. ``in_specs`` and
    ``out_specs`` are per argument / output a PartitionSpec (a tuple giving
    per tensor dim the mesh axis that splits it, or None); an axis an
    ``out_specs`` entry leaves out claims the output equal across it,
    checked at compile time (``check_replication``, or JAX's ``check_rep``).
    ``axis_names``: the axes ``f`` is manual over (default all); on the
    others tdx computes the region whole on every rank (its body is not
    partitioned over them) and ``f``'s collectives may not name them."""
    if check_rep is not None:
        check_replication = check_rep
    name, shape, axes = _mesh_of(mesh)
    manual = tuple(axis_names) if axis_names is not None else axes
    for a in manual:
        if a not in axes:
            raise CaptureError(f"shard_map: axis_names names {a!r}, which the mesh does not "
                               f"have (its axes: {axes})")
    @functools.wraps(f)
    def run(*args):
        specs = [in_specs] * len(args) if _is_pspec(in_specs) else list(in_specs)
        if len(specs) != len(args):
            raise CaptureError(f"shard_map: {len(args)} argument(s) but {len(specs)} in_specs")
        ins = []
        for i, (a, s) in enumerate(zip(args, specs)):
            if isinstance(a, torch.Tensor):
                p = _partition_spec(s, axes, a.dim(), f"in_specs[{i}]")
                for axis, pl in zip(axes, p):
                    if axis not in manual and not isinstance(pl, Replicate):
                        raise CaptureError(f"shard_map: in_specs[{i}] splits over {axis!r}, "
                                           f"which is not in axis_names")
                ins.append(p)
            else:
                ins.append(None)
        outs = [out_specs] if _is_pspec(out_specs) else list(out_specs)
        outs = [_partition_spec(s, axes, 0, f"out_specs[{j}]") for j, s in enumerate(outs)]
        return local_map(f, out_placements=outs[0] if _is_pspec(out_specs) else tuple(outs),
                         in_placements=tuple(ins), mesh=_Mesh(name, shape, axes),
                         check_replication=check_replication)(*args)
    return run


class _Mesh:
    def __init__(self, name, shape, axes):
        self.name, self.shape, self.mesh_dim_names = name, tuple(shape), tuple(axes)


def recorded_as_regions(prog, style, styles, make_routing, hint):
    """For the plan styles that make regions of a model's modules
    (ContextParallel, ExpertParallel): the styles' one mesh axis, and
    `prog` recorded again, in place, with ``make_routing(modules, axis)``'s
    ``active()`` around this and every later recording of it (mixed
    precision's, a pipeline's). `hint(model)` names modules for a pattern
    that matches none. Returns the axis."""
    import fnmatch
    axes = {s.mesh_axis for s in styles.values()}
    if len(axes) != 1:
        raise ValueError(f"the plan's {style} entries name the axes {sorted(axes)}; one "
                         f"program splits over one axis")
    again, model = getattr(prog, "_retrace", None), getattr(prog, "_model", None)
    if again is None or model is None:
        raise CaptureError(f"{style} records the step again: give a program traced in this "
                           f"process by tdx.trace_train_step or tdx.trace")
    module = prog._module
    if module.is_partitioned() or module.is_placed() or module.meshes():
        raise CaptureError(f"{style} records the step again, which would drop the changes "
                           f"made to the program since it was traced (meshes, placements); "
                           f"give the plan to the first tdx.parallelize call on a freshly "
                           f"traced program")
    modules = []
    for pattern in styles:
        found = [m for name, m in model.named_modules() if fnmatch.fnmatchcase(name, pattern)]
        if not found:
            raise ValueError(f"plan pattern {pattern!r} ({style}) matches no module; "
                             f"{hint(model)}")
        modules += [(pattern, m) for m in found]
    axis = next(iter(axes))
    routing = make_routing(modules, axis)

    def retrace(*args, **kwargs):
        with routing.active():
            return again(*args, **kwargs)

    fresh = retrace(getattr(prog, "mixed_precision", None))
    prog._module = fresh._module
    for key, value in vars(fresh).items():
        if key != "_module":
            setattr(prog, key, value)
    prog._retrace = retrace
    return axis
