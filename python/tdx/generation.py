"""``tdx.trace_generate``: a generation program, two entries over one state
(issue 56). ``prefill`` (the main entry, ``forward``) runs a batch of
left-padded prompts and writes their keys and values into the cache;
``decode`` runs one token per sequence at the next position and writes
its keys and values there. The cache is state of the program, as Hugging
Face's ``StaticCache`` lays it out (``(batch, kv heads, max_length,
head dim)`` per layer, written in place with ``index_copy_`` at its
position counter), so tdx places it like any state: tp splits its heads,
dp its batch. The weights are read, never written. Each entry returns the
logits of the last position, ``(batch, vocab)``; the runner's
``generate`` picks the tokens.
"""

import torch

from . import _C
from .errors import CaptureError

# The buffers of the cache live on this submodule of the model (not
# persistent: a state dict does not hold them).
HOLDER = "tdx_kv_cache"


class GenerationSpec:
    """What a generation program was traced for: ``max_batch`` sequences,
    prompts left-padded to ``prompt_length``, ``max_length`` positions in
    all (prompt and new tokens), ``vocab_size`` logits; the model's
    ``eos_token_id`` and ``pad_token_id`` (its generation config's)."""

    def __init__(self, max_batch, prompt_length, max_length, vocab_size, eos_token_id,
                 pad_token_id):
        self.max_batch, self.prompt_length, self.max_length = max_batch, prompt_length, max_length
        self.vocab_size = vocab_size
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id

    def __repr__(self):
        return (f"GenerationSpec(max_batch={self.max_batch}, prompt_length={self.prompt_length}, "
                f"max_length={self.max_length})")


def _probed_shapes(model, cache, run, inputs):
    """Each layer's (keys shape, values shape, dtype) as the model hands
    them to its cache, its batch and positions those of the cache: one
    throwaway trace of the prefill whose layers record what they are given
    (MLA caches a latent, others their kv heads; the model knows)."""
    from .deferred import _python_guards, model_code_tracing
    shapes = {}
    for i, layer in enumerate(cache.layers):
        def lazy(key_states, value_states, i=i, layer=layer):
            k, v, n = key_states.shape, value_states.shape, layer.max_cache_len
            shapes[i] = ((k[0], k[1], n) + tuple(k[3:]), (v[0], v[1], n) + tuple(v[3:]),
                         key_states.dtype)
            layer.keys = key_states.new_zeros(shapes[i][0])
            layer.values = value_states.new_zeros(shapes[i][1])
            layer.dtype, layer.device = key_states.dtype, key_states.device
            layer.is_initialized = True
        layer.lazy_initialization = lazy
    with torch.no_grad(), _python_guards(fake_cuda=True), _C.TraceMode(_C.Trace()), \
            model_code_tracing():
        run(model, *inputs)
    for layer in cache.layers:
        del layer.lazy_initialization
        layer.is_initialized = False
    return [shapes[i] for i in range(len(cache.layers))]


def _cache_holder(model, shapes, recording):
    """The model's submodule of cache buffers, ``keys_i``/``values_i``
    shaped as `shapes` (one (keys shape, values shape, dtype) per layer)
    and a position counter ``length_i`` each, deferred buffers made once
    (a second trace of the model with the same shapes reuses them)."""
    holder = getattr(model, HOLDER, None)
    want = [s for k, v, _ in shapes for s in (k, v)]
    if holder is None or [tuple(b.shape) for n, b in holder.named_buffers()
                          if not n.startswith("length")] != want:
        def make():
            h = torch.nn.Module()
            for i, (k, v, dtype) in enumerate(shapes):
                h.register_buffer(f"keys_{i}", torch.zeros(k, dtype=dtype), persistent=False)
                h.register_buffer(f"values_{i}", torch.zeros(v, dtype=dtype), persistent=False)
                # The layer's position counter (HF's cumulative_length).
                h.register_buffer(f"length_{i}", torch.zeros((), dtype=torch.int64),
                                  persistent=False)
            setattr(model, HOLDER, h)
        _C.deferred_init_into(recording, make)
        holder = getattr(model, HOLDER)
    return holder


def _static_cache(model, cache, length, recording, run, inputs):
    """A StaticCache whose layers' tensors are deferred buffers of the
    model (made once: a second trace of the model reuses them), shaped as
    the prefill `run(model, *inputs)` writes them."""
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, StaticSlidingWindowLayer):
            # A sliding-window layer keeps every position too: its mask
            # (the model's sliding-window mask) limits what it attends to,
            # where HF's rolling buffer decides by a Python counter a static
            # program cannot branch on. The same keys are attended.
            cache.layers[i] = StaticLayer(max_cache_len=length)
        elif type(layer) is not StaticLayer:
            raise CaptureError(f"trace_generate: layer {i} of {type(model).__name__} keeps a "
                               f"{type(layer).__name__}; tdx generates with static "
                               f"key/value caches (StaticLayer) only")
    holder = _cache_holder(model, _probed_shapes(model, cache, run, inputs), recording)
    for i, layer in enumerate(cache.layers):
        layer.keys, layer.values = getattr(holder, f"keys_{i}"), getattr(holder, f"values_{i}")
        layer.dtype, layer.device = layer.keys.dtype, layer.keys.device
        layer.batch_size, layer.num_heads = layer.keys.shape[0], layer.keys.shape[1]
        layer.k_head_dim, layer.v_head_dim = layer.keys.shape[-1], layer.values.shape[-1]
        layer.cumulative_length = getattr(holder, f"length_{i}")
        layer.is_initialized = True
    return holder


class _CachedAttention(torch.nn.Module):
    """What a torchtitan attention's ``inner_attention`` becomes while
    trace_generate records it: the rotated keys and values of the step
    written into layer `i`'s cache at its position counter (``index_copy_``
    along the positions), the queries attending over the whole cache under
    the step's attention mask (a key at or before the query's slot whose
    mask is set; each query sees at least itself, so a padding row stays
    finite). Grouped kv heads are repeated as the model's own SDPA call
    (``enable_gqa``) would."""

    def __init__(self, holder, i, step):
        super().__init__()
        # A tuple: the holder is the model's, not a submodule of this one.
        self._refs = (holder, i, step)

    def forward(self, q, k, v, *, scale=None, enable_gqa=False, is_causal=True):
        h, i, step = self._refs
        keys, values = getattr(h, f"keys_{i}"), getattr(h, f"values_{i}")
        length = getattr(h, f"length_{i}")
        slots = length + torch.arange(k.shape[2])
        keys.index_copy_(2, slots, k)
        values.index_copy_(2, slots, v)
        length.add_(k.shape[2])
        cached = torch.arange(keys.shape[2])
        allowed = (cached[None, :] <= slots[:, None])[None, None] & \
            (step["mask"] != 0)[:, None, None, :]
        allowed = allowed | (cached[None, :] == slots[:, None])[None, None]
        if q.shape[1] != keys.shape[1]:
            keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], 1)
            values = values.repeat_interleave(q.shape[1] // values.shape[1], 1)
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values,
                                                                attn_mask=allowed, scale=scale)


def _titan_attentions(model):
    """torchtitan attention modules of `model` (their ``inner_attention``
    is where the cache goes), in layer order."""
    return [m for m in model.modules() if type(m).__module__.startswith("torchtitan.")
            and hasattr(m, "inner_attention") and hasattr(m, "wk") and hasattr(m, "head_dim")]


def trace_generate(model, example_ids, *, max_length, max_batch=None):
    """Traces generation for a deferred-init causal language model (a
    Hugging Face ``*ForCausalLM``, or torchtitan's Llama 3 ``Transformer``)
    into a program with two entries sharing one state: ``forward`` (the
    prefill: ``ids (B, P), attention_mask (B, max_length), position_ids
    (B, P)`` -> logits of each sequence's last position ``(B, vocab)``, its
    keys and values written at positions ``0..P-1`` of the cache) and
    ``decode`` (``ids (B, 1), attention_mask (B, max_length), position_ids
    (B, 1)`` -> ``(B, vocab)``, written at the next position). ``B`` is
    ``max_batch`` (default ``example_ids.shape[0]``), ``P``
    ``example_ids.shape[1]`` (the longest prompt; shorter ones are
    left-padded), ``max_length`` the positions of the cache, prompt and new
    tokens. Parallelize and compile it like any program;
    ``runner.generate`` runs it."""
    from .program import _checked_entries, _fake_inputs
    config = getattr(model, "config", None)
    titan = _titan_attentions(model) if config is None else []
    if not titan and (config is None or not hasattr(model, "generation_config")):
        raise CaptureError(f"trace_generate takes a Hugging Face causal language model "
                           f"(transformers' *ForCausalLM) or torchtitan's Llama 3 Transformer, "
                           f"got {type(model).__name__}")
    if not isinstance(example_ids, torch.Tensor) or example_ids.dim() != 2 or \
            example_ids.dtype != torch.int64:
        raise CaptureError("trace_generate: example_ids must be an int64 tensor (batch, prompt "
                           "length): the widest prompt batch the program takes")
    batch = int(max_batch if max_batch is not None else example_ids.shape[0])
    prompt = int(example_ids.shape[1])
    if not isinstance(max_length, int) or max_length <= prompt:
        raise ValueError(f"trace_generate: max_length ({max_length!r}) must be an int larger "
                         f"than the prompt length {prompt} (it counts the prompt and the new "
                         f"tokens)")
    if batch < 1:
        raise ValueError(f"trace_generate: max_batch must be >= 1, got {batch}")
    _, recording = _checked_entries(model, "trace_generate")

    def inputs(width):
        return _fake_inputs([torch.zeros(batch, width, dtype=torch.int64),
                             torch.zeros(batch, max_length, dtype=torch.int64),
                             torch.zeros(batch, width, dtype=torch.int64)], "input",
                            "trace_generate")

    if titan:
        return _trace_titan(model, titan, batch, prompt, max_length, recording, inputs)
    from transformers import StaticCache
    cache = StaticCache(config=config, max_cache_len=max_length)

    def step(reset):
        def run(m, ids, mask, positions):
            if reset:       # a new batch starts at position 0
                for layer in cache.layers:
                    layer.cumulative_length.zero_()
            out = m(input_ids=ids, attention_mask=mask, position_ids=positions,
                    past_key_values=cache, use_cache=True)
            return out.logits[:, -1].float()
        return run

    _static_cache(model, cache, max_length, recording, step(False), inputs(prompt))
    gen = model.generation_config
    eos = gen.eos_token_id if gen.eos_token_id is not None else config.eos_token_id
    pad = gen.pad_token_id if gen.pad_token_id is not None else config.pad_token_id
    vocab = config.get_text_config().vocab_size if hasattr(config, "get_text_config") \
        else config.vocab_size
    return _two_entries(model, step, inputs, GenerationSpec(batch, prompt, max_length, vocab,
                                                            eos, pad))


def _two_entries(model, step, inputs, spec):
    """The prefill traced as the program's main entry (its counters reset
    first), the decode added beside it; `spec` the program's
    GenerationSpec."""
    from .program import _traced
    with torch.no_grad():
        prog, log = _traced(model, step(True), inputs(spec.prompt_length), "trace_generate",
                            write_state=True)
    prog._model = model
    prog.forward_op_names = log.op_names()
    prog.add_entry("decode", step(False), *inputs(1), _writes=True)
    prog.generation = spec
    return prog


def _trace_titan(model, attentions, batch, prompt, max_length, recording, inputs):
    """trace_generate of a torchtitan Transformer: each attention's inner
    SDPA swapped, while the program is recorded, for one over a cache of
    ``(batch, kv heads, max_length, head dim)`` (_CachedAttention); the
    model's own forward ``model(tokens, positions=...)`` does the rest
    (its RoPE table indexed by the positions)."""
    args = getattr(model, "model_args", None)
    if getattr(args, "max_seq_len", max_length) < max_length:
        raise ValueError(f"trace_generate: max_length={max_length} is longer than the model's "
                         f"RoPE table (model_args.max_seq_len={args.max_seq_len})")
    for a in attentions:
        if getattr(a, "attn_type", "sdpa") != "sdpa":
            raise CaptureError(f"trace_generate: torchtitan attention with attn_type="
                               f"{a.attn_type!r}; generation takes attn_type='sdpa' (flex and "
                               f"varlen masks are built per document, not over a cache)")
    shapes = []
    for a in attentions:
        kv = a.wk.weight.shape[0] // a.head_dim
        shape = (batch, kv, max_length, a.head_dim)
        shapes.append((shape, shape, a.wk.weight.dtype))
    holder = _cache_holder(model, shapes, recording)
    feed = {"mask": None}
    inner = [a.inner_attention for a in attentions]

    def step(reset):
        def run(m, ids, mask, positions):
            if reset:
                for i in range(len(attentions)):
                    getattr(holder, f"length_{i}").zero_()
            feed["mask"] = mask
            return m(ids, positions=positions)[:, -1].float()
        return run

    for i, a in enumerate(attentions):
        a.inner_attention = _CachedAttention(holder, i, feed)
    try:
        vocab = model.output.out_features if getattr(model, "output", None) is not None \
            else args.vocab_size
        return _two_entries(model, step, inputs,
                            GenerationSpec(batch, prompt, max_length, vocab, None, None))
    finally:
        for a, m in zip(attentions, inner):
            a.inner_attention = m


def _eos_list(eos):
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


_MASK = (1 << 64) - 1


def _uniform(seed, step, row):
    """The uniform in [0, 1) sequence `row` draws at step `step` of a
    request with `seed`: splitmix64 of the three (the serving binary's
    draw, lib/Runtime/Generate.cpp, the same bits), so one seed gives the
    same tokens on every layout, from the runner and from the binary."""
    z = ((seed * 1000003 + step) * 1000003 + row) & _MASK
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return (z >> 11) * 2.0 ** -53


def _pick(logits, do_sample, temperature, top_k, top_p, seed, step):
    """The next token of each row, as Hugging Face's generate orders the
    work: argmax, or, sampling, temperature, top-k, top-p (in float64),
    then the token where the row's uniform falls in the cumulative
    probabilities in vocabulary order."""
    if not do_sample:
        return logits.argmax(-1)
    out = []
    for row, values in enumerate(logits.to(torch.float64)):
        scores = values / temperature
        if top_k is not None and top_k < scores.numel():
            kth = scores.topk(top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if top_p is not None and top_p < 1.0:
            ordered, order = scores.sort(stable=True)
            e = (ordered - ordered[-1]).exp()
            cum = (e / e.cumsum(0)[-1]).cumsum(0)     # sums in order, as the binary's
            drop = cum <= 1 - top_p
            drop[-1] = False                    # the most likely token always stays
            scores = scores.clone()
            scores[order[drop]] = float("-inf")
        p = (scores - scores.max()).exp()
        target = _uniform(int(seed), step, row) * p.cumsum(0)[-1].item()
        hit = (p.cumsum(0) > target) & (p > 0)
        index = int(hit.nonzero()[0]) if hit.any() else int((p > 0).nonzero()[-1])
        out.append(index)
    return torch.tensor(out, dtype=torch.int64)


def stream(runner, input_ids, attention_mask=None, max_new_tokens=20, do_sample=False,
           temperature=1.0, top_k=None, top_p=None, eos_token_id=None, pad_token_id=None,
           seed=None):
    """Yields each step's new tokens, ``(batch,)``, as ``generate`` makes
    them (a finished sequence yields its pad token); ends when every
    sequence has met its end-of-sequence token or after `max_new_tokens`."""
    import time
    spec = getattr(runner._exe, "generation", None)
    if spec is None:
        raise CaptureError("generate: this program was not traced by tdx.trace_generate "
                           "(it has no prefill and decode entries)")
    ids = torch.as_tensor(input_ids)
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"generate: input_ids must be integer (batch, length), got "
                         f"{tuple(ids.shape)} {ids.dtype}")
    ids = ids.to(torch.int64)
    batch, width = ids.shape
    mask = torch.ones_like(ids) if attention_mask is None else \
        torch.as_tensor(attention_mask).to(torch.int64)
    if mask.shape != ids.shape:
        raise ValueError(f"generate: attention_mask is {tuple(mask.shape)}, input_ids "
                         f"{tuple(ids.shape)}")
    if batch > spec.max_batch:
        raise ValueError(f"generate: a batch of {batch} sequences is larger than the "
                         f"program's max_batch={spec.max_batch}; split it, or trace with "
                         f"trace_generate(..., max_batch={batch})")
    if width > spec.prompt_length:
        raise ValueError(f"generate: prompts of {width} tokens are longer than the program's "
                         f"{spec.prompt_length} (trace_generate's example_ids width; "
                         f"max_length={spec.max_length}); trace it with wider example_ids")
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise ValueError(f"generate: max_new_tokens must be an int >= 1, got "
                         f"{max_new_tokens!r}")
    if spec.prompt_length + max_new_tokens - 1 > spec.max_length:
        raise ValueError(f"generate: {spec.prompt_length} prompt positions and "
                         f"{max_new_tokens} new tokens need "
                         f"{spec.prompt_length + max_new_tokens - 1} cache positions; the "
                         f"program has max_length={spec.max_length}: ask for at most "
                         f"{spec.max_length - spec.prompt_length + 1} new tokens")
    bad = ((ids < 0) | (ids >= spec.vocab_size)) & (mask != 0)
    if bad.any():
        b, t = bad.nonzero()[0].tolist()
        raise ValueError(f"generate: token id {ids[b, t].item()} (sequence {b}, position "
                         f"{t}) is outside the vocabulary [0, {spec.vocab_size})")
    if (mask.diff(dim=-1) < 0).any():
        raise ValueError("generate: a prompt is padded on the right; pad on the left "
                         "(tokenizer.padding_side = 'left'), as Hugging Face's generate "
                         "expects of decoder-only models")
    if (mask.sum(-1) == 0).any():
        raise ValueError("generate: a prompt has no token (its attention_mask is all zero)")
    if do_sample and not (temperature > 0):
        raise ValueError(f"generate: temperature must be > 0, got {temperature!r}")
    eos = _eos_list(spec.eos_token_id if eos_token_id is None else eos_token_id)
    pad = pad_token_id if pad_token_id is not None else spec.pad_token_id
    if pad is None:
        pad = eos[0] if eos else 0

    B, P, L = spec.max_batch, spec.prompt_length, spec.max_length
    # Left-padded to the program's width; the rows past the batch hold one
    # token each (their results are dropped).
    full_ids = torch.zeros(B, P, dtype=torch.int64)
    prompt = torch.zeros(B, P, dtype=torch.int64)
    full_ids[:batch, P - width:] = ids.masked_fill(mask == 0, 0)
    prompt[:batch, P - width:] = mask
    prompt[batch:, -1] = 1
    full = torch.ones(B, L, dtype=torch.int64)
    full[:, :P] = prompt
    positions = (prompt.cumsum(-1) - 1).masked_fill(prompt == 0, 1)
    if do_sample and seed is None:
        seed = torch.seed() & _MASK

    start = time.perf_counter()
    logits = runner.forward(full_ids, full, positions)
    done = torch.zeros(batch, dtype=torch.bool)
    last = positions[:, -1]
    made = 0
    report = runner.last_generation = {"new_tokens": 0, "time_to_first_token_s": None,
                                       "tokens_per_s": None}
    while True:
        tok = _pick(logits[:batch], do_sample, temperature, top_k, top_p, seed, made)
        tok = torch.where(done, torch.full_like(tok, pad), tok)
        made += 1
        now = time.perf_counter()
        if made == 1:
            report["time_to_first_token_s"] = now - start
        report["new_tokens"] = made
        report["tokens_per_s"] = made * batch / (now - start)
        if eos:
            done |= torch.isin(tok, torch.tensor(eos))
        yield tok
        if made == max_new_tokens or bool(done.all()):
            return
        last = last + 1
        step = torch.zeros(B, 1, dtype=torch.int64)
        step[:batch, 0] = tok
        logits = runner.decode(step, full, last[:, None])


def generate(runner, input_ids, attention_mask=None, **options):
    """The prompts and their new tokens, ``(batch, length + new)``, as
    Hugging Face's ``generate`` returns them."""
    new = list(stream(runner, input_ids, attention_mask, **options))
    return torch.cat([torch.as_tensor(input_ids).to(torch.int64), torch.stack(new, 1)], 1)


# The projections whose output heads are the cache's heads.
_KEY_PROJECTIONS = ("k_proj.weight", "key.weight", "wk.weight", "k.weight")


def cache_placements(prog, mesh, placed, data_parallel):
    """Where the key/value cache of a generation program is stored on
    `mesh`: its batch split over the data-parallel axis, its heads over the
    axis that splits the key projections by rows (a colwise tp plan: each
    rank caches only its heads); whole elsewhere. `placed` holds the
    plan's weight placements."""
    from .sharding import Replicate, Shard
    heads_axes = {a for name, placements in placed.items() if name.endswith(_KEY_PROJECTIONS)
                  for a, p in enumerate(placements) if isinstance(p, Shard) and p.dim == 0}
    dp = mesh.axis(data_parallel) if data_parallel is not None else None
    out = {}
    for name, shape, _, is_buffer, _ in prog._module.state():
        if not name.startswith(HOLDER + ".") or len(shape) != 4:
            continue
        placements = [Replicate()] * mesh.ndim
        if dp is not None and shape[0] % mesh.shape[dp] == 0:
            placements[dp] = Shard(0)
        for a in heads_axes:
            if a != dp and shape[1] % mesh.shape[a] == 0:
                placements[a] = Shard(1)
        out[name] = placements
    return out


def cache_bytes(prog):
    """The bytes of the key/value cache one rank of `prog` holds: each
    cache buffer's bytes over the ranks of the axes that split it."""
    import math
    from .sharding import Shard
    mesh, placements = getattr(prog, "_cache_placements", (None, {}))
    total = 0
    for name, (shape, dtype) in prog.parameters().items():
        if not name.startswith(HOLDER + "."):
            continue
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        for axis, p in enumerate(placements.get(name, ())):
            if isinstance(p, Shard):
                size //= mesh.shape[axis]
        total += size
    return total
