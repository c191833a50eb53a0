"""Hugging Face checkpoint folders (tdx.hf): a model.safetensors (or its
shards and index) written by transformers' save_pretrained loads into tdx
and gives eager's logits; tdx's runner.save(folder, format="hf") loads back
with from_pretrained (a local folder, nothing downloaded); what cannot be
loaded is named before any rank starts."""

import os
import shutil

import pytest
import torch

import tdx
from test_hf_models import MODELS, VOCAB, adamw, data, loss_fn_of

SHARD = 20_000  # bytes: the small GPT-2 below makes several shards


def _gpt2():
    torch.manual_seed(0)
    return MODELS["gpt2"][0]()


def _forward(build):
    ids = data("lm")[0][0]
    prog = tdx.trace(tdx.deferred_init(build), ids, use_cache=False)
    return tdx.compile(prog, opt_level=0), ids


@pytest.mark.parametrize("shards", [None, SHARD], ids=["one-file", "sharded"])
def test_save_pretrained_folder_loads_with_eagers_logits(tmp_path, shards):
    model = _gpt2()
    folder = tmp_path / "gpt2"
    model.save_pretrained(folder, **({"max_shard_size": shards} if shards else {}))
    assert os.path.isfile(folder / ("model.safetensors.index.json" if shards else
                                    "model.safetensors"))
    exe, ids = _forward(lambda: type(model)(model.config))
    got = exe.run(ids, params=os.fspath(folder))[0]
    want = model(ids, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shards", [None, SHARD], ids=["one-file", "sharded"])
def test_runner_export_loads_with_from_pretrained(tmp_path, shards):
    import transformers
    model = _gpt2()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    batches = data("lm")
    deferred = tdx.deferred_init(lambda: type(model)(model.config))
    prog = tdx.trace_train_step(deferred, adamw(deferred.parameters()), loss_fn_of("lm"),
                                *batches[0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)),
                    tdx.auto_parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)))["plan"])
    with tdx.compile(prog, opt_level=0).start(params=start) as runner:
        for batch in batches[:2]:
            runner.train_step(*batch)
        trained = runner.state_dict()
        runner.save(tmp_path / "out", format="hf", config=model.config, max_shard_size=shards)
        with pytest.raises(tdx.CheckpointError, match="already holds a Hugging Face checkpoint"):
            runner.save(tmp_path / "out", format="hf")
    files = sorted(os.listdir(tmp_path / "out"))
    assert "config.json" in files and not any(f.startswith(".tdx-hf-") for f in files), files
    assert ("model.safetensors.index.json" in files) == bool(shards), files
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out")
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, trained[name]), name
    # The tied head is the embedding, as in the model that was trained.
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    model.load_state_dict(trained)
    ids = batches[2][0]
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_bad_hf_folders_are_named(tmp_path):
    from safetensors.torch import load_file, save_file
    model = _gpt2()
    exe, ids = _forward(lambda: type(model)(model.config))
    good = tmp_path / "good"
    model.save_pretrained(good, max_shard_size=SHARD)

    def variant(name, edit):
        folder = tmp_path / name
        shutil.copytree(good, folder)
        edit(folder)
        return os.fspath(folder)

    def rename(folder):
        first = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))[0]
        tensors = load_file(folder / first)
        key = sorted(tensors)[0]
        tensors[key.replace("transformer.", "transformer.extra.")] = tensors.pop(key)
        save_file(tensors, folder / first, metadata={"format": "pt"})

    with pytest.raises(tdx.CheckpointError, match=r"transformer\.extra\..* is no state of this "
                                                  r"program"):
        exe.run(ids, params=variant("unknown", rename))
    with pytest.raises(tdx.CheckpointError, match="a shard is missing"):
        exe.run(ids, params=variant("missing", lambda f: os.remove(
            f / sorted(x for x in os.listdir(f) if x.endswith(".safetensors"))[-1])))
    with pytest.raises(tdx.CheckpointError, match="is not a readable safetensors file"):
        exe.run(ids, params=variant("corrupt", lambda f: open(
            f / sorted(x for x in os.listdir(f) if x.endswith(".safetensors"))[0], "r+b"
        ).truncate(100)))
    # A checkpoint of another config: the first tensor of another shape.
    other = type(model)(type(model.config)(**{**model.config.to_dict(), "n_embd": 48}))
    other.save_pretrained(tmp_path / "wide")
    with pytest.raises(tdx.CheckpointError, match=r"c_attn.bias has shape \(144,\); the program's .* is \(96,\)"):
        exe.run(ids, params=os.fspath(tmp_path / "wide"))


def test_a_config_asking_for_what_tdx_cannot_take_is_refused_by_name():
    # attn_implementation="flex_attention": FlexAttention is built on
    # torch.compile; named at trace with what to use instead, never a crash.
    import transformers
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=16,
                                      attn_implementation="flex_attention")
    deferred = tdx.deferred_init(lambda: transformers.LlamaForCausalLM(config))
    with pytest.raises(tdx.CaptureError, match=r"FlexAttention .* is not supported by tdx yet"
                                               r".*attn_implementation='sdpa'"):
        tdx.trace(deferred, data("lm")[0][0], use_cache=False)


def test_trace_takes_keyword_constants_and_names_a_cache_output():
    # A Hugging Face model returns its key/value cache unless told not to:
    # named with the fix; keywords are constants, a tensor keyword is not.
    ids = data("lm")[0][0]
    deferred = tdx.deferred_init(_gpt2)
    with pytest.raises(tdx.CaptureError, match=r"got DynamicCache .*use_cache=False"):
        tdx.trace(deferred, ids)
    with pytest.raises(tdx.CaptureError, match="keyword 'attention_mask' is a tensor"):
        tdx.trace(deferred, ids, attention_mask=torch.ones_like(ids))
    # An evaluation entry runs the model's own code as the forward does.
    prog = tdx.trace_train_step(deferred, adamw(deferred.parameters()), loss_fn_of("lm"),
                                *data("lm")[0])
    prog.add_entry("logits", lambda m, x: m(x, use_cache=False).logits, ids)
    with tdx.compile(prog, opt_level=0).start(params=_gpt2().state_dict()) as runner:
        got = runner.logits(ids)
    torch.testing.assert_close(got, _gpt2()(ids, use_cache=False).logits, rtol=1e-6, atol=1e-6)
