"""The per-rank programs that tdx-partition makes compute what PyTorch eager
computes: every rank of a 2x2 (dp, tp) mesh runs its program in the
reference executor (exact in-process collectives), the outputs are put back
together from their placements and compared with eager on the same weights."""

import itertools
import json

import pytest
import torch

import tdx
from models import GPT2, Llama
from reference_executor import Executor, DTYPES
from test_sharding import GPT2_PLAN, LLAMA_PLAN, MESH, TiedLM


def state(module):
    """Every parameter and buffer (persistent or not) by qualified name."""
    return dict(itertools.chain(module.named_parameters(), module.named_buffers()))


def run_partitioned(prog, params, inputs):
    # The global output types: from the program before partitioning.
    fn = json.loads(prog._module.function_to_json())
    ret = [op for op in fn["ops"] if op["name"] == "func.return"][0]
    types = {}
    for op in fn["ops"]:
        for r, t in zip(op["results"], op["types"]):
            types[r] = (tuple(t["shape"]), DTYPES[t["dtype"]])
    global_types = [types[v] for v in ret["operands"]]
    prog.partition()
    return Executor(prog, params).run(inputs, global_types)


CASES = {
    "llama-tp-dp": (Llama, LLAMA_PLAN, "dp"),
    "llama-sequence-parallel": (Llama, dict(LLAMA_PLAN, **{
        "layers.*.attention_norm": tdx.SequenceParallel(),
        "layers.*.ffn_norm": tdx.SequenceParallel()}), "dp"),
    "gpt2-tp-dp": (GPT2, GPT2_PLAN, "dp"),
    "gpt2-dp-only": (GPT2, {}, "dp"),
    "llama-tp-only": (Llama, LLAMA_PLAN, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_partitioned_forward_matches_eager(case):
    cls, plan, dp = CASES[case]
    torch.manual_seed(0)
    eager = cls().eval()
    ids = torch.randint(0, 96, (4, 8))
    expected = eager(ids)
    torch.manual_seed(0)
    prog = tdx.trace(tdx.deferred_init(cls), ids)
    tdx.parallelize(prog, MESH, plan, data_parallel=dp)
    with torch.no_grad():
        (got,) = run_partitioned(prog, state(eager), [ids])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_vocab_parallel_loss_matches_eager():
    torch.manual_seed(0)
    eager = TiedLM()
    ids = torch.randint(0, 64, (4, 8))
    labels = torch.randint(0, 64, (4, 8))
    labels[0, :3] = -100  # ignored targets
    expected = eager(ids, labels)
    prog = tdx.trace(tdx.deferred_init(TiedLM), ids, labels)
    tdx.parallelize(prog, MESH, {"wte": tdx.VocabParallel()})
    with torch.no_grad():
        (got,) = run_partitioned(prog, state(eager), [ids, labels])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
