"""Deferred init: no storage while building, bitwise eager values after."""

import resource

import pytest
import torch

import tdx
from models import GPT2, ConvNet, Llama, ViewInit

MODELS = [GPT2, Llama, ConvNet, ViewInit]


def eager_state(model_cls, seed):
    torch.manual_seed(seed)
    return model_cls().state_dict(keep_vars=True)


@pytest.mark.parametrize("model_cls", MODELS, ids=lambda c: c.__name__)
def test_deferred_init_allocates_no_storage(model_cls):
    torch.manual_seed(0)
    m = tdx.deferred_init(model_cls)
    assert tdx.is_deferred(m)
    tensors = list(m.parameters()) + list(m.buffers())
    assert tensors
    for t in tensors:
        assert tdx.is_fake(t) and tdx.is_deferred(t)
        assert t.data_ptr() == 0, "a deferred tensor must own no storage"


@pytest.mark.parametrize("model_cls", MODELS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("seed", [0, 1234])
def test_materialize_is_bitwise_eager(model_cls, seed):
    expected = eager_state(model_cls, seed)
    torch.manual_seed(seed)
    m = tdx.deferred_init(model_cls)
    torch.manual_seed(seed + 99)  # whatever happens to the RNG in between
    torch.rand(7)
    tdx.materialize_module(m)
    assert not tdx.is_deferred(m)
    got = m.state_dict(keep_vars=True)
    assert list(got) == list(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype, name
        assert got[name].shape == value.shape, name
        assert torch.equal(got[name], value), f"{name} differs from eager"


def test_materialized_model_runs_like_eager():
    torch.manual_seed(3)
    eager = GPT2()
    torch.manual_seed(3)
    m = tdx.materialize_module(tdx.deferred_init(GPT2))
    ids = torch.randint(0, 128, (2, 8))
    assert torch.equal(m(ids), eager(ids))


def test_tied_weights_stay_tied():
    torch.manual_seed(0)
    m = tdx.deferred_init(GPT2)
    assert m.lm_head.weight is m.wte.weight
    tdx.materialize_module(m)
    assert m.lm_head.weight is m.wte.weight
    assert not tdx.is_fake(m.wte.weight)
    assert isinstance(m.wte.weight, torch.nn.Parameter) and m.wte.weight.requires_grad


def test_buffers_only_and_check_fn():
    torch.manual_seed(0)
    m = tdx.deferred_init(ConvNet)
    tdx.materialize_module(m, buffers_only=True)
    assert not tdx.is_fake(m.bn1.running_mean)
    assert tdx.is_fake(m.conv1.weight)
    tdx.materialize_module(m, check_fn=lambda mod: isinstance(mod, torch.nn.Conv2d))
    assert not tdx.is_fake(m.conv1.weight)
    assert tdx.is_fake(m.fc.weight)
    tdx.materialize_module(m)
    assert not tdx.is_deferred(m)


def test_materialize_tensor_matches_eager():
    expected = eager_state(Llama, 5)
    torch.manual_seed(5)
    m = tdx.deferred_init(Llama)
    w = tdx.materialize_tensor(m.layers[1].w2.weight)
    assert isinstance(w, torch.nn.Parameter)
    assert torch.equal(w, expected["layers.1.w2.weight"])


def test_rss_growth_is_small():
    """A 64M-parameter model (256 MiB of float32) builds without the memory."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    m = tdx.deferred_init(
        lambda: torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    params = sum(p.numel() for p in m.parameters())
    assert params > 64_000_000
    assert (after - before) * 1024 < 0.01 * params * 4


def test_fake_mode_factories_and_cuda():
    with tdx.fake_mode(fake_cuda=True):
        t = torch.ones(10, device="cuda")
        u = torch.randn(3, 4) @ torch.randn(4, 5)
    assert tdx.is_fake(t) and t.device.type == "cuda"
    assert "fake=True" in repr(t)
    assert u.shape == (3, 5) and tdx.is_fake(u)
    m = tdx.meta_like(u)
    assert m.device.type == "meta" and m.shape == u.shape


@pytest.mark.parametrize("read", ["item", "tolist", "numpy"])
def test_reading_fake_data_raises(read):
    with tdx.fake_mode():
        t = torch.ones(3)
    with pytest.raises(tdx.FakeTensorError, match="materialize"):
        getattr(t, read)()


def test_op_without_meta_kernel_is_named():
    with tdx.fake_mode():
        t = torch.ones(4, 4)
        with pytest.raises(NotImplementedError, match=r"tdx: aten::binomial has no meta kernel "
                                                      r"in torch 2\.\d+"):
            torch.binomial(t, t / 2)


def test_deferred_init_needs_a_callable():
    with pytest.raises(TypeError, match="callable"):
        tdx.deferred_init(42)
    with pytest.raises(TypeError, match="already built"):
        tdx.deferred_init(torch.nn.Linear(2, 2))


def test_a_constructor_reads_values_computed_without_random_draws():
    # timm's models compute drop-path rates with
    # torch.linspace(0, rate, depth).tolist() in their constructors: such a
    # value is replayed from the ops it depends on alone, so construction
    # goes on, and materialization stays bitwise eager's. A value drawn at
    # random has no value before materialization: named.
    class Rated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rates = torch.linspace(0, 0.1, 4).tolist()
            self.steps = int(torch.arange(5).sum().item())
            self.fc = torch.nn.Linear(4, 4)

    torch.manual_seed(0)
    deferred = tdx.deferred_init(Rated)
    torch.manual_seed(0)
    eager = Rated()
    assert deferred.rates == eager.rates and deferred.steps == eager.steps == 10
    assert tdx.is_fake(deferred.fc.weight)
    tdx.materialize_module(deferred)
    assert torch.equal(deferred.fc.weight, eager.fc.weight)

    class Random(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = torch.randn(3).tolist()

    with pytest.raises(tdx.FakeTensorError, match=r"Tensor.tolist\(\) at .*test_deferred_init.py"):
        tdx.deferred_init(Random)
    # Outside construction a deferred tensor's value is never read (a traced
    # forward must not bake a state's value in).
    with pytest.raises(tdx.FakeTensorError):
        tdx.deferred_init(torch.nn.Linear, 2, 2).bias.tolist()


def test_a_write_through_an_expand_that_repeats_nothing_is_a_reshape():
    # Hugging Face's BERT keeps position_ids = arange(n).expand((1, -1)) and
    # its _init_weights copies into it: an expand that repeats no element is
    # a reshape, written through as one; its init program (an expand) is
    # evaluated shard by shard like the rest. One that repeats elements
    # (a broadcast) is refused by name.
    class Positions(torch.nn.Module):
        def __init__(self, repeat=1):
            super().__init__()
            self.register_buffer("ids", torch.arange(8).expand((repeat, -1)), persistent=False)
            self.ids.copy_((torch.arange(8) * 3).expand((repeat, -1)))
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x) + self.ids.float()

    torch.manual_seed(0)
    eager = Positions()
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(Positions), torch.zeros(2, 8))
    x = torch.randn(2, 8)
    got, = tdx.compile(prog, opt_level=0).run(x, params=eager.state_dict())
    torch.testing.assert_close(got, eager(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(tdx.CaptureError, match="a write through a view made by aten::expand"):
        tdx.trace(tdx.deferred_init(Positions, 2), torch.zeros(2, 8))


def test_a_buffer_no_rank_can_make_alone_is_computed_from_its_recorded_ops():
    # torchtitan's Llama keeps its RoPE table as a complex non-persistent
    # buffer made with torch.polar: no init program makes it shard by
    # shard (exe.needs_params() names it), and model.state_dict() does not
    # hold it; tdx computes it from the ops it depends on in the recording
    # (no parameter materialized). A buffer drawn at random and then
    # reshuffled cannot be: named, with what to pass.
    class Rotary(torch.nn.Module):
        def __init__(self, random=False):
            super().__init__()
            angles = torch.outer(torch.arange(4.0), 1.0 / 10.0 ** torch.arange(0, 4, 2.0))
            self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles),
                                 persistent=False)
            if random:
                self.register_buffer("noise", torch.randn(4, 4).t(), persistent=False)
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            z = torch.view_as_complex(self.fc(x).reshape(4, 2, 2))
            return torch.view_as_real(z * self.freqs).flatten(1)

    torch.manual_seed(0)
    eager = Rotary()
    prog = tdx.trace(tdx.deferred_init(Rotary), torch.zeros(4, 4))
    exe = tdx.compile(prog, opt_level=0)
    assert exe.needs_params() == ["freqs"]
    assert "freqs" not in eager.state_dict()
    x = torch.randn(4, 4)
    got, = exe.run(x, params=eager.state_dict())
    torch.testing.assert_close(got, eager(x), rtol=1e-6, atol=1e-6)
    exe = tdx.compile(tdx.trace(tdx.deferred_init(Rotary, True), torch.zeros(4, 4)), opt_level=0)
    assert sorted(exe.needs_params()) == ["freqs", "noise"]
    with pytest.raises(tdx.InputError, match="noise is not given and cannot be made shard by "
                                             "shard .*pass it in params="):
        exe.run(x, params=eager.state_dict())
