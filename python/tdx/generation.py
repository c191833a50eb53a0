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
from .decoding import GenerationSpec
from .errors import CaptureError
from .kv_cache import cache_holder

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
    holder = cache_holder(model, _probed_shapes(model, cache, run, inputs), recording)
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
    written into layer `i`'s cache at the step's slots (``index_copy_``
    along the positions), the queries attending over the whole cache under
    the step's mask (both made once per step by _trace_titan's run).
    Grouped kv heads are repeated as the model's own SDPA call
    (``enable_gqa``) would."""

    def __init__(self, holder, i, step):
        super().__init__()
        # A tuple: the holder is the model's, not a submodule of this one.
        self._refs = (holder, i, step)

    def forward(self, q, k, v, *, scale=None, enable_gqa=False, is_causal=True):
        h, i, step = self._refs
        keys, values = getattr(h, f"keys_{i}"), getattr(h, f"values_{i}")
        keys.index_copy_(2, step["slots"], k)
        values.index_copy_(2, step["slots"], v)
        if q.shape[1] != keys.shape[1]:
            keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], 1)
            values = values.repeat_interleave(q.shape[1] // values.shape[1], 1)
        return torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=step["allowed"], scale=scale)


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
    holder = cache_holder(model, shapes, recording)
    feed = {}
    inner = [a.inner_attention for a in attentions]
    counters = [getattr(holder, f"length_{i}") for i in range(len(attentions))]

    def step(reset):
        def run(m, ids, mask, positions):
            if reset:
                for c in counters:
                    c.zero_()
            # The step's cache slots (every layer's counter is the same) and
            # what each query attends: a key at or before its slot whose
            # mask is set, and itself always (a padding row stays finite).
            slots = counters[0] + torch.arange(ids.shape[1])
            cached = torch.arange(max_length)
            allowed = (cached[None, :] <= slots[:, None])[None, None] & \
                (mask != 0)[:, None, None, :]
            feed["slots"] = slots
            feed["allowed"] = allowed | (cached[None, :] == slots[:, None])[None, None]
            out = m(ids, positions=positions)[:, -1].float()
            for c in counters:
                c.add_(ids.shape[1])
            return out
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
