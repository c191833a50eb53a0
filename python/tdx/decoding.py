"""Decoding from a generation program: ``runner.generate`` and
``runner.stream`` run its prefill and decode entries and pick each step's
tokens (greedy, or sampled by a counter-based draw that is the same on
every layout); ``GenerationSpec`` is what the program was traced for
(docs/serving.md)."""

import torch

from .errors import CaptureError


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
