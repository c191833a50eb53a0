"""The styles of a tensor-parallel plan (``ColwiseParallel``,
``RowwiseParallel``, ``VocabParallel``, ``SequenceParallel``): which
placement each parameter of a matched module gets (docs/sharding.md)."""

from .placements import Replicate, Shard

__all__ = ["ColwiseParallel", "RowwiseParallel", "SequenceParallel", "VocabParallel"]


class _Style:
    def __init__(self, mesh_axis="tp"):
        self.mesh_axis = mesh_axis

    def __repr__(self):
        return f"{type(self).__name__}(mesh_axis={self.mesh_axis!r})"


class _LinearStyle(_Style):
    def __init__(self, mesh_axis="tp", in_out=False):
        super().__init__(mesh_axis)
        self.in_out = in_out  # the weight stored (in, out) rather than (out, in)

    def __repr__(self):
        extra = ", in_out=True" if self.in_out else ""
        return f"{type(self).__name__}(mesh_axis={self.mesh_axis!r}{extra})"


class ColwiseParallel(_LinearStyle):
    """A Linear split by output features: weight Shard(0), bias Shard(0).
    ``in_out=True``: a layer whose weight is (in, out), as Hugging Face's
    ``Conv1D`` (GPT-2's): weight Shard(1)."""

    @property
    def placements(self):
        return {"weight": Shard(1 if self.in_out else 0), "bias": Shard(0)}


class RowwiseParallel(_LinearStyle):
    """A Linear split by input features: weight Shard(1), bias replicated
    (added once, after the reduction). ``in_out=True``: a layer whose weight
    is (in, out), as Hugging Face's ``Conv1D``: weight Shard(0)."""

    @property
    def placements(self):
        return {"weight": Shard(0 if self.in_out else 1), "bias": Replicate()}


class VocabParallel(_Style):
    """An Embedding (or tied output projection) split by vocabulary: weight
    Shard(0). Each rank looks up the ids its rows hold (masked) and one
    all_reduce sums the partial rows; a tied head's cross-entropy stays split
    by class (docs/sharding.md)."""
    placements = {"weight": Shard(0)}


class SequenceParallel(_Style):
    """A norm (LayerNorm, RMSNorm) whose output stays split by sequence
    (``Shard(seq_dim)`` over the axis) between tensor-parallel regions: the
    rowwise linear before it reduce-scatters instead of all-reducing, the
    colwise linear after it all-gathers. Matches the modules that own a
    ``weight``; their uses in the forward are placed."""
    placements = {"weight": None}

    def __init__(self, mesh_axis="tp", seq_dim=1):
        super().__init__(mesh_axis)
        self.seq_dim = seq_dim
