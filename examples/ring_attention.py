"""Context parallelism written by hand: causal ring attention in a tdx manual
region (docs/mpi.md, "Manual regions").

The sequence is split over the mesh axis ``cp``: each rank holds one block
of the queries, keys and values. The key/value blocks travel around the
ring (``funcol.permute_tensor``, one step per rank of ``cp``); at each step
every rank attends its queries to the block it holds, masked causally by
the blocks' global positions, and merges the result into its running output
with the online softmax (log-sum-exp) rule. The program around the region
(projections, RoPE, MLPs, the loss, data parallelism over ``dp``) is placed
by tdx itself.

``RingAttention`` has the signature of torchtitan's SDPA wrapper, so it
replaces a torchtitan Llama's ``attention.inner_attention`` as torchtitan's
own context parallelism hooks SDPA:

    python examples/ring_attention.py          # dp2 x cp2 against eager, 3 SGD steps
"""

import functools

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn

import tdx
from tdx import Replicate, Shard


def ring_attention(q, k, v, mesh, axis="cp", scale=None):
    """Causal attention of this rank's query block ``q`` (batch, heads,
    block, head_dim) over every rank's key/value blocks, which go around the
    ring of ``axis``; ``k`` and ``v`` may have fewer heads (grouped
    queries). Per-shard code: call it inside a manual region."""
    n = mesh.size(mesh.axis(axis))
    rank = mesh.get_local_rank(axis)          # a 0-D tensor, this rank's own
    block = q.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    repeat = q.shape[1] // k.shape[1]
    offsets = torch.arange(block)
    q_pos = rank * block + offsets            # the queries' global positions
    ring = [(r + 1) % n for r in range(n)]    # rank r sends to r + 1
    out = lse = None
    for step in range(n):
        owner = torch.remainder(rank - step, n)  # whose block this rank holds now
        k_pos = owner * block + offsets
        kb = k.repeat_interleave(repeat, 1) if repeat > 1 else k
        vb = v.repeat_interleave(repeat, 1) if repeat > 1 else v
        scores = (q @ kb.transpose(-2, -1)) * scale
        future = k_pos[None, :] > q_pos[:, None]
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
        block_lse = torch.logsumexp(scores, -1, keepdim=True)
        block_out = torch.softmax(scores, -1) @ vb
        if out is None:   # step 0: the diagonal block, never fully masked
            out, lse = block_out, block_lse
        else:             # a fully masked block has weight exp(min - lse) = 0
            merged = torch.logaddexp(lse, block_lse)
            out = out * torch.exp(lse - merged) + block_out * torch.exp(block_lse - merged)
            lse = merged
        if step + 1 < n:
            k = funcol.permute_tensor(k, ring, (mesh, axis))
            v = funcol.permute_tensor(v, ring, (mesh, axis))
    return out


class RingAttention(nn.Module):
    """Causal SDPA as ring attention over ``axis`` of ``mesh``: a manual
    region whose inputs and output are split along the sequence (dim 2) over
    ``axis`` and along the batch over ``batch_axis`` (if the mesh has it)."""

    def __init__(self, mesh, axis="cp", batch_axis="dp"):
        super().__init__()
        self.mesh, self.axis = mesh, axis
        self.placements = tuple(
            Shard(2) if a == axis else Shard(0) if a == batch_axis else Replicate()
            for a in mesh.mesh_dim_names)

    def forward(self, q, k, v, *, scale=None, enable_gqa=False, is_causal=True):
        if not is_causal:
            raise NotImplementedError("RingAttention is causal attention")
        p = self.placements
        body = functools.partial(ring_attention, mesh=self.mesh, axis=self.axis, scale=scale)
        return tdx.local_map(body, out_placements=(p,), in_placements=(p, p, p),
                             mesh=self.mesh)(q, k, v)


def llama3(vocab=64, seq=16, dim=32, layers=2):
    """torchtitan's Llama 3, a small config (built, then initialized, as
    torchtitan's trainer does)."""
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs
    model = Transformer(TransformerModelArgs(dim=dim, n_layers=layers, n_heads=4, n_kv_heads=2,
                                             vocab_size=vocab, multiple_of=16,
                                             max_seq_len=seq))
    with torch.no_grad():
        model.init_weights()
    return model


def with_ring_attention(model, mesh, axis="cp"):
    """`model` (a torchtitan Llama) with every layer's SDPA made ring
    attention over `axis`."""
    for layer in model.layers.values():
        layer.attention.inner_attention = RingAttention(mesh, axis)
    return model


def loss_fn(model, ids, targets):
    logits = model(ids)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batches(steps, batch=4, seq=16, vocab=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(vocab, (batch, seq), generator=g),
             torch.randint(vocab, (batch, seq), generator=g)) for _ in range(steps)]


def main():
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("dp", "cp"))
    data = batches(3)
    torch.manual_seed(0)
    eager = llama3()
    start = {k: v.detach().clone() for k, v in eager.state_dict().items()}
    opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    want = []
    for ids, targets in data:
        opt.zero_grad()
        loss = loss_fn(eager, ids, targets)
        loss.backward()
        opt.step()
        want.append(loss.item())
    torch.manual_seed(0)
    model = tdx.deferred_init(lambda: with_ring_attention(llama3(), mesh))
    prog = tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                loss_fn, *data[0])
    tdx.parallelize(prog, mesh, {}, data_parallel="dp")
    losses, _ = tdx.compile(prog).train(data, params=start)
    for k, (got, ref) in enumerate(zip(losses, want)):
        print(f"step {k}: ring attention on dp2 x cp2 {got:.6f}   eager full attention {ref:.6f}")
    worst = max(abs(got - ref) / abs(ref) for got, ref in zip(losses, want))
    print(f"largest relative loss difference: {worst:.1e}")
    if worst > 1e-5:
        raise SystemExit("the ring's losses are not eager's")


if __name__ == "__main__":
    main()
