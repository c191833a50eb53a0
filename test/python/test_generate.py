"""Generation from a compiled program (tdx.trace_generate, runner.generate;
docs/serving.md): models nobody here wrote, from small configs, give
Hugging Face generate's tokens on 1 rank, tp2 and dp2; sampling with a
seed gives one answer on every layout; bad requests are named."""

import pytest
import torch

import tdx

VOCAB = 128
_DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
# name -> (model class, config class, config)
MODELS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                  bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", _DECODER),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=8, **_DECODER)),
    # A sliding window (4) shorter than the prompt.
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=4, **_DECODER)),
    # Local (sliding) and global attention interleaved.
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig",
               dict(head_dim=8, sliding_window=4,
                    layer_types=["sliding_attention", "full_attention"], **_DECODER)),
    # Mixtures of experts (issue 55's models), grouped_mm experts.
    "qwen3-moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig",
                  dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                       **_DECODER)),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig",
                dict(num_local_experts=4, num_experts_per_tok=2, **_DECODER)),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig",
              dict(num_experts=4, num_experts_per_tok=2, **_DECODER)),
    # Attention sinks, biases on the experts, a sliding-window layer.
    "gpt-oss": ("GptOssForCausalLM", "GptOssConfig",
                dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8, sliding_window=4,
                     layer_types=["sliding_attention", "full_attention"], **_DECODER)),
    # MLA: the cache holds the compressed latent and the rope keys, one
    # "head" each (Hugging Face's layout), not per-head keys.
    "deepseek-v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config",
                    dict(moe_intermediate_size=16, n_routed_experts=4, n_shared_experts=1,
                         n_group=2, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16,
                         q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
                         num_experts_per_tok=2, **{**_DECODER, "num_key_value_heads": 4})),
}
BATCH, PROMPT, MAX_LENGTH, NEW = 4, 6, 40, 32


def make(name):
    import transformers
    cls, cfg, kw = MODELS[name]
    return getattr(transformers, cls)(getattr(transformers, cfg)(**kw)).eval()


def prompts(seed=0):
    """4 prompts of 6, 4, 2 and 5 tokens, left-padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB - 1, (BATCH, PROMPT), generator=g)
    mask = torch.ones(BATCH, PROMPT, dtype=torch.int64)
    mask[1, :2] = 0
    mask[2, :4] = 0
    mask[3, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


def runner(name, layout, model):
    prog = tdx.trace_generate(tdx.deferred_init(make, name), torch.zeros(BATCH, PROMPT,
                                                                        dtype=torch.int64),
                              max_length=MAX_LENGTH)
    if layout == "tp2":
        tdx.auto_parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)))
    elif layout == "dp2":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    return prog, tdx.compile(prog).start(params=model.state_dict())


def same_as_hf(got, hf, prompt_width):
    """Token for token; where they part, tdx's token must be one HF's
    scores rank in their top 5 at that step with the two within float
    rounding (1e-4) of each other (vLLM's check): returns the steps where
    that fallback was taken, as (sequence, step)."""
    want = hf.sequences
    assert got.shape == want.shape, (got.shape, want.shape)
    fallbacks = []
    for b in range(got.shape[0]):
        for t in range(want.shape[1] - prompt_width):
            mine, theirs = got[b, prompt_width + t].item(), want[b, prompt_width + t].item()
            if mine == theirs:
                continue
            scores = hf.scores[t][b]
            top = scores.topk(5)
            assert mine in top.indices.tolist(), (b, t, mine, top)
            assert (scores[theirs] - scores[mine]).abs().item() < 1e-4, (b, t, scores[theirs],
                                                                          scores[mine])
            fallbacks.append((b, t))
            break                   # the sequences part from here on
    return fallbacks


@pytest.mark.parametrize("layout", ["1", "tp2", "dp2"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_generation_equals_hugging_faces(name, layout):
    """32 new tokens for 4 left-padded prompts of 6, 4, 2 and 5 tokens,
    stopping at EOS per sequence, as HF generate(do_sample=False) makes
    them."""
    torch.manual_seed(0)
    model = make(name)
    ids, mask = prompts()
    hf = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                        pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    prog, r = runner(name, layout, model)
    with r:
        got = r.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0)
        report = r.last_generation
    fallbacks = same_as_hf(got, hf, PROMPT)
    assert not fallbacks, f"{name} {layout}: a float-rounding tie at {fallbacks}"
    assert report["new_tokens"] == hf.sequences.shape[1] - PROMPT
    assert report["time_to_first_token_s"] > 0 and report["tokens_per_s"] > 0


def _titan_llama3():
    # torchtitan's Llama 3 (RoPE from a complex table indexed by positions,
    # grouped-query attention, SDPA), initialized as its trainer does, then
    # with wider weights so that greedy decoding does not settle into a loop.
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs
    model = Transformer(TransformerModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                             vocab_size=VOCAB, multiple_of=16, max_seq_len=64))
    with torch.no_grad():
        model.init_weights()
        for p in model.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def _titan_eager(model, ids, mask):
    """Greedy decoding by torchtitan's own forward with no cache at all: each
    prompt alone (unpadded), the whole sequence recomputed every step; the
    sequences left-padded and each step's scores, as HF generate returns."""
    rows, scores = [], [torch.zeros(BATCH, VOCAB) for _ in range(NEW)]
    with torch.no_grad():
        for b in range(BATCH):
            seq = ids[b][mask[b] == 1].tolist()
            for t in range(NEW):
                logits = model(torch.tensor([seq]))[0, -1]
                scores[t][b] = logits
                seq.append(int(logits.argmax()))
            rows.append(torch.cat([ids[b][mask[b] == 0], torch.tensor(seq)]))
    from types import SimpleNamespace
    return SimpleNamespace(sequences=torch.stack(rows), scores=scores)


@pytest.mark.parametrize("layout", ["1", "tp2", "dp2"])
def test_torchtitans_llama3_generates_its_own_forwards_tokens(layout):
    """torchtitan's Llama 3 Transformer (no cache of its own: trace_generate
    gives its attention one) against its eager forward recomputing every
    sequence without a cache, 32 new tokens for the 4 left-padded prompts;
    tp2 with torchtitan's own apply_tp plan, each rank caching its heads."""
    torch.manual_seed(0)
    model = _titan_llama3()
    ids, mask = prompts()
    want = _titan_eager(model, ids, mask)
    prog = tdx.trace_generate(tdx.deferred_init(_titan_llama3),
                              torch.zeros(BATCH, PROMPT, dtype=torch.int64),
                              max_length=MAX_LENGTH)
    if layout == "tp2":
        from torchtitan.models.llama3.infra.parallelize import apply_tp
        mesh = tdx.init_device_mesh("cpu", (2,), ("tp",))
        tdx.parallelize(prog, mesh, tdx.recorded_plan(apply_tp, prog._model, mesh,
                                                      loss_parallel=False,
                                                      enable_float8_tensorwise_tp=False))
        # keys and values of 2 layers (4 x 2 heads x 40 x 8 f32), half each.
        assert prog.memory_report()["kv_cache"] == 4 * BATCH * 2 * MAX_LENGTH * 8 * 4 // 2 + 16
    elif layout == "dp2":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    with tdx.compile(prog).start(params=model.state_dict()) as r:
        got = r.generate(ids, attention_mask=mask, max_new_tokens=NEW)
    fallbacks = same_as_hf(got, want, PROMPT)
    assert not fallbacks, f"torchtitan {layout}: a float-rounding tie at {fallbacks}"
    # The tokens are not a loop of a few: a test of the cache over 32 steps.
    assert len(set(got[0, PROMPT:].tolist())) > 16


def test_sampling_with_a_seed_gives_the_same_tokens_on_one_rank_and_tp2():
    """do_sample with temperature, top-k and top-p: one seed, one answer on
    1 rank and tp2; another seed, another answer."""
    torch.manual_seed(0)
    model = make("llama")
    ids, mask = prompts()
    options = dict(attention_mask=mask, max_new_tokens=16, do_sample=True, temperature=0.8,
                   top_k=20, top_p=0.9, seed=7)
    _, one = runner("llama", "1", model)
    with one:
        a = one.generate(ids, **options)
        again = one.generate(ids, **options)
        other = one.generate(ids, **{**options, "seed": 8})
    _, tp = runner("llama", "tp2", model)
    with tp:
        b = tp.generate(ids, **options)
    assert torch.equal(a, again) and torch.equal(a, b)
    assert not torch.equal(a, other)
    assert ((a[:, PROMPT:] >= 0) & (a[:, PROMPT:] < VOCAB)).all()


def test_stream_yields_what_generate_returns_and_the_cache_is_split_on_tp2():
    """runner.stream yields each step's tokens, the same as generate's; on
    tp2 each rank keeps only its heads of the cache (Shard(1)), on dp2 its
    sequences (Shard(0)), and the decode step moves no cache."""
    torch.manual_seed(0)
    model = make("llama")
    ids, mask = prompts()
    prog, r = runner("llama", "tp2", model)
    with r:
        whole = r.generate(ids, attention_mask=mask, max_new_tokens=8)
        steps = list(r.stream(ids, attention_mask=mask, max_new_tokens=8))
    assert len(steps) == whole.shape[1] - PROMPT
    assert torch.equal(torch.stack(steps, 1), whole[:, PROMPT:])
    layouts = {p["name"]: p["layout"] for p in r._exe.signature()["params"]}
    assert layouts["tdx_kv_cache.keys_0"] == "[Shard(1)]"
    assert layouts["tdx_kv_cache.values_1"] == "[Shard(1)]"
    cache = BATCH * 2 * MAX_LENGTH * 8 * 4      # (batch, kv heads, positions, head dim) f32
    report = prog.memory_report()
    largest = {e["name"]: e["bytes"] for e in report["largest"]}
    assert largest.get("state tdx_kv_cache.keys_0", cache // 2) == cache // 2
    # keys and values of 2 layers, half each, and the 2 layers' counters.
    assert report["kv_cache"] == 4 * cache // 2 + 2 * 8
    dp, r2 = runner("llama", "dp2", model)
    r2.close()
    assert dp.memory_report()["kv_cache"] == 4 * cache // 2 + 2 * 8
    assert {p["name"]: p["layout"] for p in r2._exe.signature()["params"]}[
        "tdx_kv_cache.keys_0"] == "[Shard(0)]"


def test_bad_requests_are_named():
    """A prompt wider than the program's, a batch larger than max_batch,
    token ids outside the vocabulary, right padding, more new tokens than
    the cache holds; trace_generate's own bad arguments; generate on a
    program that is not a generation program."""
    torch.manual_seed(0)
    model = make("gpt2")
    _, r = runner("gpt2", "1", model)
    ids, mask = prompts()
    with r:
        with pytest.raises(ValueError, match="longer than the program's 6"):
            r.generate(torch.ones(1, 7, dtype=torch.int64))
        with pytest.raises(ValueError, match="larger than the program's max_batch=4"):
            r.generate(torch.ones(5, 3, dtype=torch.int64))
        with pytest.raises(ValueError, match=r"token id 128 .*outside the vocabulary \[0, 128\)"):
            r.generate(torch.tensor([[1, 2, 128]]))
        with pytest.raises(ValueError, match="padded on the right"):
            r.generate(ids, attention_mask=mask.flip(-1))
        with pytest.raises(ValueError, match="at most 35 new tokens"):
            r.generate(ids, attention_mask=mask, max_new_tokens=36)
        # After the refusals the runner still serves.
        assert r.generate(ids[:1], max_new_tokens=2).shape == (1, PROMPT + 2)
    deferred = tdx.deferred_init(make, "gpt2")
    with pytest.raises(ValueError, match="max_length .* larger than the prompt length 6"):
        tdx.trace_generate(deferred, torch.zeros(1, 6, dtype=torch.int64), max_length=6)
    with pytest.raises(tdx.CaptureError, match="Hugging Face causal language model.*torchtitan"):
        tdx.trace_generate(tdx.deferred_init(torch.nn.Linear, 4, 4),
                           torch.zeros(1, 4, dtype=torch.int64), max_length=8)
    plain = tdx.compile(tdx.trace(tdx.deferred_init(torch.nn.Linear, 4, 4), torch.ones(2, 4)))
    with plain.start() as p, pytest.raises(tdx.CaptureError, match="not traced by "
                                                                   "tdx.trace_generate"):
        p.generate(torch.ones(1, 2, dtype=torch.int64))


def test_the_rl_loop_refreshes_the_generator_from_the_trainers_store(tmp_path, monkeypatch):
    """examples/rl_loop.py through a volume with a job token: a trainer on
    dp2 x tp2 publishes each step, the generator on tp2 refreshes from the
    store without recompiling, and its logits equal eager's on the
    trainer's weights (1e-5) version by version; the volume served the
    generator's boxes and no more (plus the files' headers)."""
    import json
    import os
    import subprocess
    import sys

    from tdx.store import Store, start_volume
    monkeypatch.setenv("TDX_STORE_TOKEN", "rl-loop-token")
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "rl_loop.py")
    with start_volume(0, host="localhost") as volume:
        done = subprocess.run([sys.executable, example, "--rounds", "2", "--json", "--store",
                               f"ucx://{volume.address}"], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        served = Store([volume]).status()[volume.address]["served"]
    assert [r["version"] for r in rows] == [0, 1]
    assert all(r["logits_max_diff"] <= 1e-5 for r in rows), rows
    assert rows[0]["loss"] != rows[1]["loss"]
    boxes = sum(r["refresh_bytes"] for r in rows)
    assert boxes <= served < boxes * 1.1, (boxes, served)
    print(f"refresh: {rows[-1]['refresh_bytes']:,} bytes in {rows[-1]['refresh_s'] * 1e3:.1f} "
          f"ms; the volume served {served:,} bytes for {boxes:,} bytes of boxes")


def test_load_weights_names_a_key_of_another_model(tmp_path):
    """A key holding another shape, or lacking the program's weights, is
    refused by name, and the runner keeps its weights."""
    import transformers
    from tdx.store import Store
    torch.manual_seed(0)
    model = make("llama")
    store = Store(tmp_path)
    wider = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**_DECODER,
                                                                      "hidden_size": 64}))
    store.put("other", dict(wider.state_dict()))
    store.put("part", {"lm_head.weight": model.lm_head.weight.detach()})
    _, r = runner("llama", "1", model)
    ids, mask = prompts()
    with r:
        before = r.generate(ids, attention_mask=mask, max_new_tokens=4)
        with pytest.raises(tdx.InputError, match=r"holds another shape: .* is \[128, 64\] there, "
                                                 r"\[128, 32\] here"):
            r.load_weights(store, "other")
        with pytest.raises(tdx.InputError, match="has no .*another model's"):
            r.load_weights(store, "part")
        assert torch.equal(r.generate(ids, attention_mask=mask, max_new_tokens=4), before)
        store.put("same", dict(model.state_dict()))
        got = r.load_weights(store, "same")
        assert got["version"] == 0 and got["bytes"] > 0
        assert torch.equal(r.generate(ids, attention_mask=mask, max_new_tokens=4), before)


def _serve_lines(proc, until_done):
    """JSON lines from the serving binary until a line with "done" or
    "error" (or end of output)."""
    import json
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            return lines
        if not line.startswith("{"):
            continue
        lines.append(json.loads(line))
        if until_done and ("done" in lines[-1] or "error" in lines[-1]):
            return lines


def test_the_serving_binary_gives_the_runners_tokens_with_no_python(tmp_path):
    """exe.save's binary with --generate on 2 ranks (tp2), run from a shell
    whose PATH has mpirun and no Python: greedy and seeded sampled requests
    give the runner's tokens, malformed requests are answered with their
    error and the next one served, and --refresh-from picks up a version
    published between requests (its tokens then the new weights')."""
    import json
    import os
    import shutil
    import subprocess

    from tdx.store import Store
    torch.manual_seed(0)
    model = make("llama")
    prog, r = runner("llama", "tp2", model)
    rows = [[5, 9, 14, 3, 7, 11], [8, 2, 6, 1], [4, 10], [12, 13, 15, 16, 17]]
    ids = torch.zeros(len(rows), PROMPT, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, PROMPT - len(row):] = torch.tensor(row)
        mask[b, PROMPT - len(row):] = 1
    sampled = dict(do_sample=True, temperature=0.7, top_k=30, top_p=0.9, seed=11)
    torch.manual_seed(1)
    newer = make("llama")
    with r:
        greedy = r.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0)
        drawn = r.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0,
                           **sampled)
        r.load_state_dict(newer.state_dict())
        refreshed = r.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0)

    store = Store(tmp_path / "store")
    store.put("policy", dict(model.state_dict()))
    binary = str(tmp_path / "llama-serve")
    r._exe.save(binary)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("mpirun"), bin_dir / "mpirun")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = str(bin_dir)
    env["OMPI_MCA_orte_tmpdir_base"] = str(tmp_path)
    env["OMPI_MCA_plm_rsh_agent"] = ""      # one host: mpirun needs no ssh on PATH
    assert shutil.which("python3", path=env["PATH"]) is None
    proc = subprocess.Popen(
        ["/bin/sh", "-c", f"exec mpirun --oversubscribe --allow-run-as-root -np 2 {binary} "
                          f"--generate --store {tmp_path / 'store'} --params store:policy "
                          f"--refresh-from store:policy --pad-token-id 0 --eos-token-id 2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env)
    try:
        def ask(request):
            proc.stdin.write(request + "\n")
            proc.stdin.flush()
            return _serve_lines(proc, True)

        got = ask(json.dumps({"id": 1, "input_ids": rows, "max_new_tokens": 12}))
        assert [line["step"] for line in got[:-1]] == list(range(12))
        assert got[-1]["done"] and got[-1]["id"] == 1 and got[-1]["tokens_per_s"] > 0
        assert torch.equal(torch.tensor(got[-1]["sequences"]), greedy[:, PROMPT:])
        bad = ask("this is not JSON")
        assert "one JSON object a line" in bad[-1]["error"]
        bad = ask(json.dumps({"id": 2, "input_ids": [[1, 2, VOCAB]]}))
        assert bad[-1]["id"] == 2 and "token id 128" in bad[-1]["error"]
        bad = ask(json.dumps({"id": 3, "input_ids": [list(range(1, PROMPT + 2))]}))
        assert "more than the program's 6" in bad[-1]["error"]
        got = ask(json.dumps({"id": 4, "input_ids": rows, "max_new_tokens": 12, **sampled}))
        assert torch.equal(torch.tensor(got[-1]["sequences"]), drawn[:, PROMPT:])
        store.put("policy", dict(newer.state_dict()))
        got = ask(json.dumps({"id": 5, "input_ids": rows, "max_new_tokens": 12}))
        assert "refreshed" in got[0] and got[0]["refreshed"].endswith("step-00000001")
        assert torch.equal(torch.tensor(got[-1]["sequences"]), refreshed[:, PROMPT:])
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_serving_binary_takes_eos_and_pad_from_a_hugging_face_folder(tmp_path):
    """--params a folder save_pretrained wrote: with no --eos-token-id the
    binary stops each sequence at the model's end-of-sequence token, as the
    runner (and HF generate) do."""
    import json
    import subprocess
    torch.manual_seed(0)
    model = make("llama")
    _, r = runner("llama", "1", model)
    ids, mask = prompts()
    rows = [ids[b, mask[b] == 1].tolist() for b in range(BATCH)]
    with r:
        free = r.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
        # An end-of-sequence token the first sequence makes at its 4th step,
        # and a pad token, as the saved model's generation config has them.
        eos = int(free[0, PROMPT + 3])
        want = r.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos,
                          pad_token_id=0)[:, PROMPT:]
    assert (want == eos).any()
    model.generation_config.eos_token_id = model.config.eos_token_id = eos
    model.generation_config.pad_token_id = model.config.pad_token_id = 0
    model.save_pretrained(tmp_path / "hf")
    done = subprocess.run(
        ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "1", r._exe.path,
         "--generate", "--params", str(tmp_path / "hf")],
        input=json.dumps({"input_ids": rows, "max_new_tokens": NEW}) + "\n",
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    got = torch.tensor(last["sequences"])
    assert torch.equal(got, want[:, :got.shape[1]]) and got.shape[1] == want.shape[1]
