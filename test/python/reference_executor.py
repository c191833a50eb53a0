"""A reference executor for partitioned tdx programs, for the tests.

Runs the per-rank program of every rank of the mesh in one process, op by op
in lockstep, with PyTorch ops for compute and exact in-process collectives,
then puts the outputs back together from their placements. It is an oracle
for the sharding passes (the product runtime runs the same programs as
compiled binaries over MPI/NCCL), so it is written for clarity, not speed.
"""

import itertools
import json
import re

import torch
import torch.nn.functional as F

import tdx

# The dialect's element types and enums, as ODS and DTypes.def define them.
DTYPES = {ir: dtype for ir, dtype, *_ in tdx._C.dtypes()}
ENUMS = dict(tdx._C.dialect_enums())
REDUCE = dict(enumerate(ENUMS["ReduceKind"]))


def reference(text):
    """An op's torchReference (its ODS def, dialects/TdxOpBase.td) as code
    over its arguments by name, `A`."""
    if text not in _REFERENCES:
        _REFERENCES[text] = compile(re.sub(r"\$(\w+)", r'A["\1"]', text), text, "eval")
    return _REFERENCES[text]


_REFERENCES = {}


def parse_placements(text):
    """'#tdx.sharding<@mesh, [Shard(0), Replicate, Partial(sum)]>' -> list."""
    inner = text[text.index("[") + 1:text.rindex("]")]
    out = []
    for part in re.findall(r"Shard\(\d+\)|Replicate(?:\(\))?|Partial(?:\(\w+\))?", inner):
        if part.startswith("Shard"):
            out.append(("S", int(part[6:-1])))
        elif part.startswith("Replicate"):
            out.append(("R",))
        else:
            out.append(("P", part[8:-1] if "(" in part else "sum"))
    return out


def chunk_range(n, k, c):
    size = -(-n // k) if k else n
    start = min(n, c * size)
    return start, min(n, start + size)


def box(shape, placements, mesh_shape, coords):
    """(offsets, sizes) of the block these coords hold (torch.chunk, nested)."""
    offsets, sizes = [0] * len(shape), list(shape)
    for axis, p in enumerate(placements):
        if p[0] == "S":
            d = p[1]
            s, e = chunk_range(sizes[d], mesh_shape[axis], coords[axis])
            offsets[d] += s
            sizes[d] = e - s
    return offsets, sizes


def local_part(t, placements, mesh_shape, coords):
    offsets, sizes = box(list(t.shape), placements, mesh_shape, coords)
    for d, (o, s) in enumerate(zip(offsets, sizes)):
        t = t.narrow(d, o, s)
    return t.contiguous()


def num(v):
    """A JSON number, or the strings tdx writes for infinities and NaN."""
    return float(v) if isinstance(v, str) else v


class Executor:
    def __init__(self, prog, params):
        prog = prog if isinstance(prog, tdx.Program) else tdx.Program(prog)
        self.mesh_shape = list(prog.mesh.shape)
        self.axes = list(prog.mesh.mesh_dim_names)
        self.fn = json.loads(prog._module.function_to_json("forward"))
        self.params = params
        self.coords = list(itertools.product(*[range(s) for s in self.mesh_shape]))

    def _group(self, coords, axes):
        """The coords of the ranks that share all other axes, in group order."""
        idx = [self.axes.index(a) for a in axes]
        members = []
        for values in itertools.product(*[range(self.mesh_shape[i]) for i in idx]):
            c = list(coords)
            for i, v in zip(idx, values):
                c[i] = v
            members.append(tuple(c))
        return members, idx

    def run(self, inputs, global_types):
        env = {c: {} for c in self.coords}
        for i, (arg, x) in enumerate(zip(self.fn["args"], inputs)):
            placements = parse_placements(arg["sharding"]) if "sharding" in arg else \
                [("R",)] * len(self.mesh_shape)
            for c in self.coords:
                env[c][f"arg{i}"] = local_part(x, placements, self.mesh_shape, c)
        result_names = None
        layouts = {}
        for op in self.fn["ops"]:
            name, a = op["name"], op["attrs"]
            if name == "func.return":
                result_names = op["operands"]
                break
            if "tdx.shardings" in a:
                for r, s in zip(op["results"], a["tdx.shardings"]):
                    layouts[r] = parse_placements(s)
            if op.get("collective"):
                self._collective(env, op)
                continue
            for c in self.coords:
                if "reference" in op:
                    out = self._reference(op, env[c])
                else:
                    vals = [env[c][v] for v in op["operands"]]
                    out = self._compute(name, a, vals, op["types"], c)
                for r, v in zip(op["results"], out if isinstance(out, tuple) else (out,)):
                    env[c][r] = v
        outputs = []
        for name, gtype in zip(result_names, global_types):
            placements = layouts.get(name) or self._arg_layout(name)
            outputs.append(self._assemble(env, name, placements, gtype))
        return outputs

    def _arg_layout(self, name):
        if name.startswith("arg"):
            arg = self.fn["args"][int(name[3:])]
            if "sharding" in arg:
                return parse_placements(arg["sharding"])
        return [("R",)] * len(self.mesh_shape)

    def _assemble(self, env, name, placements, gtype):
        shape, dtype = gtype
        out = torch.zeros(shape, dtype=dtype)
        for c in self.coords:
            if any(p[0] == "R" and c[i] != 0 for i, p in enumerate(placements)):
                continue
            offsets, sizes = box(list(shape), placements, self.mesh_shape, c)
            view = out
            for d, (o, s) in enumerate(zip(offsets, sizes)):
                view = view.narrow(d, o, s)
            view += env[c][name]
        return out

    def _collective(self, env, op):
        a = op["attrs"]
        src, dst = op["operands"][0], op["results"][0]
        new = {}
        for c in self.coords:
            members, idx = self._group(c, a["mesh_axes"])
            parts = [env[m][src] for m in members]
            me = members.index(tuple(c))
            k = len(members)
            name = op["name"]
            if name == "tdx.all_gather":
                new[c] = torch.cat(parts, dim=a["gather_dim"])
            elif name == "tdx.all_reduce":
                new[c] = self._reduce(parts, REDUCE[a["reduce"]])
            elif name == "tdx.reduce_scatter":
                full = self._reduce(parts, REDUCE[a["reduce"]])
                d = a["scatter_dim"]
                s, e = chunk_range(full.shape[d], k, me)
                new[c] = full.narrow(d, s, e - s)
            elif name == "tdx.all_to_all":
                sd, cd = a["split_dim"], a["concat_dim"]
                pieces = []
                for p in parts:
                    s, e = chunk_range(p.shape[sd], k, me)
                    pieces.append(p.narrow(sd, s, e - s))
                new[c] = torch.cat(pieces, dim=cd)
            else:  # broadcast
                root = tuple(a["root"])
                new[c] = parts[[tuple(m[i] for i in idx) for m in members].index(root)]
        for c in self.coords:
            env[c][dst] = new[c].contiguous()

    @staticmethod
    def _reduce(parts, kind):
        stacked = torch.stack(parts)
        if kind == "sum":
            return stacked.sum(0)
        if kind == "avg":
            return stacked.mean(0)
        return stacked.amax(0) if kind == "max" else stacked.amin(0)

    @staticmethod
    def _reference(op, values):
        """A registered op: its torch reference on its arguments by name."""
        def bind(v):
            if isinstance(v, dict) and "operand" in v:
                return values[v["operand"]]
            return [bind(e) for e in v] if isinstance(v, list) else v
        args = {k: bind(v) for k, v in op["args"].items()}
        if "dtype" in args:
            args["dtype"] = DTYPES[args["dtype"]]
        return eval(reference(op["reference"]),
                    {"torch": torch, "F": F, "aten": torch.ops.aten, "A": args})

    def _compute(self, name, a, x, types, coords):
        t0 = types[0] if types else None
        shape = tuple(-1 if d is None else d for d in t0["shape"]) if t0 else None
        dtype = DTYPES.get(t0["dtype"]) if t0 else None
        op = name.split(".", 1)[1]
        if op == "param_ref":
            layout = parse_placements(a["tdx.shardings"][0]) if "tdx.shardings" in a else \
                [("R",)] * len(self.mesh_shape)
            return local_part(self.params[a["name"]], layout, self.mesh_shape, coords)
        if op == "constant":
            values = [num(v) for v in a["value"]["dense"]]
            if len(values) == 1:
                return torch.full(shape, values[0], dtype=dtype)
            return torch.tensor(values, dtype=dtype).reshape(shape)
        if op == "mesh_coord":
            return torch.tensor(coords[self.axes.index(a["axis"])], dtype=torch.int64)
        if op == "chunk":
            n = x[0].shape[a["dim"]]
            s, e = chunk_range(n, a["chunks"], int(x[1]))
            return x[0].narrow(a["dim"], s, e - s)
        if op in ("full", "empty") and "global_shape" in a:
            # Split unevenly: this rank's box of the global shape.
            _, shape = box(list(a["global_shape"]), parse_placements(a["tdx.shardings"][0]),
                           self.mesh_shape, coords)
        if op == "full":
            return torch.full(shape, num(a["value"]), dtype=dtype)
        if op == "empty":
            return torch.zeros(shape, dtype=dtype)
        if op == "aten":
            ns, rest = a["schema"].split("::")
            opname, _, overload = rest.partition(".")
            fn = getattr(getattr(getattr(torch.ops, ns), opname), overload or "default")
            given = a.get("args", {})
            listed = {r["operand"] for v in given.values() if isinstance(v, list)
                      for r in v if isinstance(r, dict)}
            plain = iter([t for i, t in enumerate(x) if i not in listed])
            call = []
            for arg in fn._schema.arguments:
                if arg.name in given:
                    v = given[arg.name]
                    if isinstance(v, list) and any(isinstance(r, dict) for r in v):
                        v = [x[r["operand"]] if isinstance(r, dict) else None for r in v]
                    elif str(arg.type).startswith("Device") and isinstance(v, str):
                        v = torch.device(v)
                    call.append(v)
                elif "Tensor" in str(arg.type) and "[]" not in str(arg.type):
                    call.append(next(plain))
                else:
                    call.append(arg.default_value)
            out = fn(*call)
            return tuple(out) if isinstance(out, (tuple, list)) else out
        raise NotImplementedError(f"reference executor: {name}")
