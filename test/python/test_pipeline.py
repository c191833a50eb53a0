"""Pipeline parallelism (tdx.parallelize(..., pipeline=tdx.Pipeline(...))):
the training step split into stages balanced by cost, each pipeline rank
running its stages' forward and backward on the micro-batches in its
schedule's order, activations and gradients sent point to point. GPT-2 and
LLaMA (tests/python/models.py, written the usual way) on 2 and 4 stages, and
on 2x2 meshes of pp x dp and pp x tp, match eager's full-batch steps;
torchvision's ResNet pipelines as its accumulated step."""

import functools
import re

import pytest
import torch
import torch.nn.functional as F

import tdx
from models import GPT2, Llama
from test_sharding import GPT2_PLAN, LLAMA_PLAN
from test_training import assert_losses_match, eager_steps, rel

STEPS = 4
slow = pytest.mark.slow


def lm_loss(model, ids, targets):
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# Deep enough for 4 ranks x 2 stages each (interleaved): a layer is a block,
# or a module outside the blocks (embeddings, final norm).
MODELS = {"gpt2": functools.partial(GPT2, layers=6), "llama": functools.partial(Llama, layers=6)}
PLANS = {"gpt2": GPT2_PLAN, "llama": LLAMA_PLAN}
MESHES = {"pp2": ((2,), ("pp",)), "pp4": ((4,), ("pp",)),
          "pp2xdp2": ((2, 2), ("pp", "dp")), "pp2xtp2": ((2, 2), ("pp", "tp"))}
# SGD with momentum (optimizer state in every stage): its update is linear
# in the gradient, so the comparison is sharp. (Adam's first steps move
# entries whose gradient is rounding noise by +-lr: eager's own full-batch
# and accumulated steps differ by 1e-4 there.)
OPTIMIZER = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=0.01)
SCHEDULES = {"gpipe": ("gpipe", 1), "1f1b": ("1f1b", 1), "interleaved": ("interleaved-1f1b", 2),
             "zb-h1": ("zb-h1", 1)}


def data(n=STEPS, batch=8):
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, 96, (batch, 8), generator=g),
             torch.randint(0, 96, (batch, 8), generator=g)) for _ in range(n)]


def build(model):
    torch.manual_seed(0)
    deferred = tdx.deferred_init(MODELS[model])
    optimizer = OPTIMIZER(deferred.parameters())
    return deferred, tdx.trace_train_step(deferred, optimizer, lm_loss, *data(1)[0])


def pipelined(model, mesh, schedule, microbatches=4, zero=0):
    _, prog = build(model)
    shape, axes = MESHES[mesh]
    kind, per_rank = SCHEDULES[schedule]
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes),
                    PLANS[model] if "tp" in axes else {},
                    data_parallel="dp" if "dp" in axes else None, zero=zero,
                    pipeline=tdx.Pipeline("pp", microbatches=microbatches, schedule=kind,
                                          stages_per_rank=per_rank))
    return prog


def eager_run(model, batches):
    torch.manual_seed(0)
    eager = MODELS[model]()
    start = {k: v.detach().clone() for k, v in eager.state_dict().items()}
    losses = eager_steps(eager, OPTIMIZER(eager.parameters()), lm_loss, batches)
    return eager, start, losses


CASES = [(m, mesh, s) for m in MODELS for mesh in MESHES for s in SCHEDULES]
# Every model, mesh and schedule is in the default tier at least once; the
# rest of the product runs with TDX_SLOW=1.
# (pp2 x dp2 runs by default in test_pipeline_composes_with_zero.)
QUICK = {("gpt2", "pp2", "interleaved"), ("gpt2", "pp2xtp2", "gpipe"),
         ("llama", "pp4", "1f1b"), ("gpt2", "pp4", "zb-h1")}


@pytest.mark.parametrize("model,mesh,schedule",
                         [c if c in QUICK else pytest.param(*c, marks=slow) for c in CASES])
def test_pipeline_matches_eager(model, mesh, schedule):
    batches = data()
    prog = pipelined(model, mesh, schedule)
    exe = tdx.compile(prog, opt_level=0)
    eager, start, want = eager_run(model, batches)
    losses, state = exe.train(batches, params=start)
    assert len(losses) == STEPS
    assert_losses_match(losses, want)
    for name, p in eager.named_parameters():
        assert rel(state[name], p.detach()) < 1e-4, f"{name} after {STEPS} steps"


def stage_model():
    """Five layers of different widths written as any nn.Sequential is."""
    widths = [16, 128, 16, 16, 16, 16]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def test_five_layers_on_two_stages_are_balanced_by_cost():
    """The layers' cut minimizes the costlier stage (checked against every
    cut), keeps every layer once and in order; with the wide second layer
    that is not the 3 + 2 split of equal layer counts."""
    torch.manual_seed(0)
    model = tdx.deferred_init(stage_model)
    prog = tdx.trace_train_step(model, OPTIMIZER(model.parameters()),
                                lambda m, x, y: F.cross_entropy(m(x), y),
                                torch.randn(8, 16), torch.randint(0, 16, (8,)))
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("pp",)), {},
                    pipeline=tdx.Pipeline("pp", microbatches=2))
    got = prog.pipeline_report()
    layers = [name for name, _ in stage_model().named_children() if name.isdigit()
              and any(True for _ in getattr(stage_model(), name).parameters())]
    assert sum(got["stages"], []) == layers == ["0", "2", "4", "6", "8"]
    costs = got["layer_seconds"]
    assert len(costs) == 5
    best = min(max(sum(costs[:k]), sum(costs[k:])) for k in range(1, 5))
    assert max(got["stage_seconds"]) == pytest.approx(best, rel=1e-9)
    assert [len(s) for s in got["stages"]] != [3, 2]
    # The schedule as the cost model timed it: F and B of each stage on
    # each micro-batch, each rank's bubble next to (p-1)/m.
    tasks = sorted((t["rank"], t["phase"], t["microbatch"]) for t in got["timeline"])
    assert tasks == sorted((r, phase, mb) for r in (0, 1) for phase in "FB" for mb in (0, 1))
    assert got["ideal_bubble"] == 0.5 and len(got["bubble"]) == 2
    assert all(b >= 0 for b in got["bubble"]) and got["end"] >= max(got["busy"])
    with pytest.raises(tdx.TdxError, match="no scheduled pipeline"):
        tdx.parallelize(tdx.trace_train_step(model, OPTIMIZER(model.parameters()),
                                             lambda m, x, y: F.cross_entropy(m(x), y),
                                             torch.randn(8, 16), torch.randint(0, 16, (8,))),
                        tdx.init_device_mesh("cpu", (2,), ("dp",)), {},
                        data_parallel="dp").pipeline_report()


def test_pipeline_refusals():
    mesh = tdx.init_device_mesh("cpu", (2, 2), ("pp", "dp"))
    with pytest.raises(ValueError, match="schedule must be one of"):
        tdx.Pipeline("pp", schedule="zero-bubble")
    with pytest.raises(ValueError, match="stages_per_rank=2 is for schedule='interleaved-1f1b'"):
        tdx.Pipeline("pp", stages_per_rank=2)
    _, prog = build("gpt2")
    with pytest.raises(ValueError, match="the pipeline's axis 'stages' is not an axis"):
        tdx.parallelize(prog, mesh, {}, pipeline=tdx.Pipeline("stages"))
    with pytest.raises(ValueError, match="cannot also be data_parallel"):
        tdx.parallelize(prog, mesh, {}, data_parallel="pp", pipeline=tdx.Pipeline("pp"))
    with pytest.raises(ValueError, match="not a multiple of 2"):
        tdx.parallelize(prog, mesh, {}, pipeline=tdx.Pipeline(
            "pp", microbatches=3, schedule="interleaved-1f1b", stages_per_rank=2))
    forward = tdx.trace(tdx.deferred_init(MODELS["gpt2"]), torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="a pipeline splits a training step"):
        tdx.parallelize(forward, mesh, {}, pipeline=tdx.Pipeline("pp"))
    # A model with fewer layers than stages: named by the compiler.
    torch.manual_seed(0)
    small = tdx.deferred_init(torch.nn.Linear, 4, 4)
    prog = tdx.trace_train_step(small, OPTIMIZER(small.parameters()),
                                lambda m, x: m(x).sum(), torch.randn(4, 4))
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("pp",)), {},
                    pipeline=tdx.Pipeline("pp", microbatches=2))
    with pytest.raises(tdx.TdxError, match="too few for 2 pipeline stages"):
        tdx.compile(prog)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_a_stage_that_dies_ends_the_run(tmp_path, signal_name):
    """A pipeline rank killed (or stopped) mid-run: the job ends within 30 s
    with an error naming it (a lost rank), or what waits for it (a stuck
    one), never hangs."""
    import os
    import signal
    from test_runtime import end_within_30s, launch_two
    prog = pipelined("gpt2", "pp2", "1f1b", microbatches=2)
    exe = tdx.compile(prog, opt_level=0)
    steps = 5000
    ids = torch.randint(0, 96, (2, 4, 8))
    tdx.safetensors.save({f"{k}:input:{i}": ids for k in range(steps) for i in (0, 1)},
                         str(tmp_path / "batches.safetensors"))
    # A lost rank is mpirun's to report (the collective timeout long enough
    # that the survivor's own never comes first); a stuck one the survivor's.
    timeout = "20" if signal_name == "SIGKILL" else "3"
    job, ranks = launch_two([exe.path, "--batches", str(tmp_path / "batches.safetensors"),
                             "--steps", str(steps), "--collective-timeout", timeout, "--verbose"])
    assert job.poll() is None, "the run ended before a stage was lost"
    # The last stage's rank (pp coordinate 1).
    stage = [int(r) for r in ranks if b"OMPI_COMM_WORLD_RANK=1" in
             open(f"/proc/{r}/environ", "rb").read().split(b"\0")][0]
    os.kill(stage, getattr(signal, signal_name))
    text = end_within_30s(job, ranks)
    assert job.returncode != 0
    if signal_name == "SIGKILL":
        assert re.search(r"process rank 1 with PID \d+ on node \S+ exited on signal 9", text), text
    else:
        # Rank 0 waits for the stopped stage in whichever collective it was
        # in (a recv or send over {pp}, the loss's gather or a request's
        # barrier over {all}: timing's choice), naming its group of both.
        assert re.search(r"tdx: rank \d \(host \S+\): .+? over mesh axes \{(pp|all)\} did "
                         r"not complete in 3 s: a rank of its group \(ranks 0 on \S+, 1 on "
                         r"\S+\) is lost, stuck or cut off", text), text


def test_each_pipeline_rank_holds_its_own_stages_state():
    """State is laid out Stage(r): a rank allocates its stages' parameters
    and optimizer state only (the others' boxes are empty), the ranks'
    states add up to the model's, and prog.memory_report() (the pipeline
    rank whose step peaks highest: rank 0, with the embeddings the tied
    head reads) counts that rank's."""
    prog = pipelined("gpt2", "pp2", "1f1b", microbatches=2)
    exe = tdx.compile(prog, opt_level=0)
    batches = data(2)
    _, start, want = eager_run("gpt2", batches)
    losses, _ = exe.train(batches, params=start, verbose=True)
    assert_losses_match(losses, want)
    held = {int(r): int(b) for r, b in
            re.findall(r"rank (\d): state (\d+) bytes", exe.last_log)}
    torch.manual_seed(0)
    eager = MODELS["gpt2"]()
    params = sum(p.numel() * 4 for p in eager.parameters())
    buffers = sum(b.numel() * b.element_size() for b in eager.buffers())
    # SGD with momentum: one buffer per parameter.
    total = 2 * params + buffers
    assert sorted(held) == [0, 1]
    assert all(b < 0.75 * total for b in held.values()), (held, total)
    assert abs(sum(held.values()) - total) <= 64, (held, total)
    report = prog.memory_report()
    assert report["parameters"] + report["optimizer"] == held[0], (report, held)


def test_a_pipeline_checkpoint_resumes_on_another_layout(tmp_path):
    """Each stage's ranks write their state (Stage(r)): a checkpoint saved by
    2 pipeline ranks after 2 steps resumes on one rank without a pipeline,
    and the 4 steps match eager's."""
    batches = data(4)
    eager, start, want = eager_run("gpt2", batches)
    piped = tdx.compile(pipelined("gpt2", "pp2", "1f1b", microbatches=2), opt_level=0)
    losses, _ = piped.train(batches[:2], params=start, checkpoint=tmp_path / "ckpt")
    _, prog = build("gpt2")
    one = tdx.compile(prog, opt_level=0)
    rest, state = one.train(batches, checkpoint=tmp_path / "ckpt", resume=True)
    assert one.first_step == 2
    assert_losses_match(losses + rest, want)
    for name, p in eager.named_parameters():
        assert rel(state[name], p.detach()) < 1e-4, name


def test_a_torchvision_resnet_pipelines_as_its_accumulated_step():
    """torchvision's ResNet (BasicBlock [1, 1, 1, 1]; batch norm in training
    mode, its running statistics state the step writes) on 2 stages, 1F1B
    with 2 micro-batches: its layers (the stem's conv1 and bn1, each
    layerN.0, fc) are split whole, and the step is bitwise the 1-rank step
    with accumulation_steps=2 (the same micro-batches: batch norm's
    statistics are a micro-batch's).

    Reference: eager's loop of micro-batches in float64 (reference.py).
    Batch norm over a 2-sample micro-batch of layer4's 1x1 maps normalizes
    2 values to about +-1, and its backward is the difference of two
    nearly equal terms: eager's own float32 run is 0.5% off float64's loss
    at step 2 and 50% off a momentum buffer (measured), and any summation
    order, eager's on another machine, moves it by 3e-5. tdx's losses and
    final state (parameters, running statistics, momentum) are each within
    twice the farthest of eager float32's summation orders (threads, oneDNN
    on and off, each micro-batch's samples reversed: reference.py) from
    float64 eager's, plus 1e-6: measured, that farthest is 1.0e-2 (2.8%
    relative) on a momentum buffer whose nearest order is 5.1e-3 away."""
    from reference import assert_losses_near_float64, assert_state_near_float64, eager_runs
    from vision_models import resnet18_small
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))
               for _ in range(3)]
    optimizer = functools.partial(torch.optim.SGD, lr=3e-5, momentum=0.9)
    loss = lambda m, x, y: F.cross_entropy(m(x), y)

    def micro_batches(model, opt, data):
        losses = []
        for x, y in data:
            opt.zero_grad()
            parts = [loss(model, xs, ys) / 2 for xs, ys in zip(x.chunk(2), y.chunk(2))]
            for part in parts:
                part.backward()
            opt.step()
            losses.append(sum(part.item() for part in parts))
        return losses

    torch.manual_seed(0)
    eager = resnet18_small()
    start = {k: v.detach().clone() for k, v in eager.state_dict().items()}
    fp32, fp64 = eager_runs(eager, optimizer, micro_batches, batches, blocks=2)
    runs = {}
    for mesh in (None, "pp2"):
        torch.manual_seed(0)
        model = tdx.deferred_init(resnet18_small)
        prog = tdx.trace_train_step(model, optimizer(model.parameters()), loss, *batches[0],
                                    accumulation_steps=2)
        if mesh:
            tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("pp",)), {},
                            pipeline=tdx.Pipeline("pp", microbatches=2))
            stages = prog.pipeline_report()["stages"]
            assert sorted(sum(stages, [])) == sorted(
                ["conv1", "bn1", "layer1.0", "layer2.0", "layer3.0", "layer4.0", "fc"]), stages
        runs[mesh] = tdx.compile(prog, opt_level=0).train(batches, params=start)
    (losses, state), (one_losses, one_state) = runs["pp2"], runs[None]
    assert losses == one_losses
    assert state.keys() == one_state.keys() and start.keys() <= state.keys()
    assert all(torch.equal(state[k], one_state[k]) for k in state)
    assert_losses_near_float64(losses, fp32, fp64)
    assert_state_near_float64(state, fp32, fp64)


@pytest.mark.parametrize("zero", [pytest.param(1, marks=slow), 3])
def test_pipeline_composes_with_zero(zero):
    """pp x dp with ZeRO on the dp axis: each stage's optimizer state (and,
    ZeRO-3, its parameters) split over dp, the step still eager's."""
    batches = data()
    exe = tdx.compile(pipelined("gpt2", "pp2xdp2", "1f1b", zero=zero), opt_level=0)
    eager, start, want = eager_run("gpt2", batches)
    losses, state = exe.train(batches, params=start)
    assert_losses_match(losses, want)
    for name, p in eager.named_parameters():
        assert rel(state[name], p.detach()) < 1e-4, name


@slow
def test_gradient_clipping_across_stages():
    """max_grad_norm: the global norm sums every stage's gradients (sent
    between the stages) and the scale goes back to each; pp2 x dp2 matches
    eager's clip_grad_norm_."""
    batches = data()
    torch.manual_seed(0)
    deferred = tdx.deferred_init(MODELS["gpt2"])
    prog = tdx.trace_train_step(deferred, OPTIMIZER(deferred.parameters()), lm_loss, *batches[0],
                                max_grad_norm=0.5)
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2, 2), ("pp", "dp")), {},
                    data_parallel="dp", pipeline=tdx.Pipeline("pp", microbatches=4))
    exe = tdx.compile(prog, opt_level=0)
    torch.manual_seed(0)
    eager = MODELS["gpt2"]()
    start = {k: v.detach().clone() for k, v in eager.state_dict().items()}
    optimizer, want = OPTIMIZER(eager.parameters()), []
    for ids, targets in batches:
        optimizer.zero_grad()
        loss = lm_loss(eager, ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.5)
        optimizer.step()
        want.append(loss.item())
    losses, state = exe.train(batches, params=start)
    assert_losses_match(losses, want)
    for name, p in eager.named_parameters():
        assert rel(state[name], p.detach()) < 1e-4, name


def test_the_message_check_passes_every_schedule_and_names_a_dropped_send():
    # tdx-spmd ends with tdx-check-messages: every schedule's per-rank steps
    # (forward and derived backward) pass it as they are.
    for schedule in SCHEDULES:
        prog = pipelined("gpt2", "pp2xdp2", schedule)
        prog.partition()
    text = prog.mlir
    assert "tdx.send" in text
    # The same program with rank 0's first send dropped: rank 1 waits for
    # it while rank 0 waits for rank 1's gradient, a deadlock named at both.
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if "tdx.send" in line)
    lines[first] = ""
    broken = tdx.Program("\n".join(lines))
    with pytest.raises(tdx.CaptureError, match=r"(?s)'tdx.recv' op deadlocks: rank \d \(pp=\d, "
                                               r"dp=\d\) waits here for the message from rank "
                                               r"\d \(pp=\d, dp=\d\) with tag \d+.*note: rank "
                                               r"\d \(pp=\d, dp=\d\) waits here"):
        broken.run_pipeline("tdx-check-messages")


def test_a_hand_written_pipeline_whose_ranks_collect_out_of_order_names_both_lines():
    stage = """
module attributes {tdx.pipeline = {axis = "pp", functions = [@a, @b], microbatches = 1 : i64,
                                   schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> {
    %s = tdx.all_reduce %x on @mesh axes = ["pp"] reduce = sum : tensor<4xf32> -> tensor<4xf32> loc("stage0.py":12:0)
    %m = tdx.all_reduce %s on @mesh axes = ["pp"] reduce = max : tensor<4xf32> -> tensor<4xf32> loc("stage0.py":13:0)
    return %m : tensor<4xf32>
  }
  func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
    %m = tdx.all_reduce %x on @mesh axes = ["pp"] reduce = max : tensor<4xf32> -> tensor<4xf32> loc("stage1.py":20:0)
    %s = tdx.all_reduce %m on @mesh axes = ["pp"] reduce = sum : tensor<4xf32> -> tensor<4xf32> loc("stage1.py":21:0)
    return %s : tensor<4xf32>
  }
}
"""
    with pytest.raises(tdx.CaptureError, match=r"(?s)stage1.py\":20:0\): 'tdx.all_reduce' op "
                                               r"is where rank 1 reaches its group's next "
                                               r"collective, but rank 0 of that group reaches "
                                               r"another 'tdx.all_reduce' \(other attributes.*"
                                               r"stage0.py\":12:0\): note: rank 0's collective"):
        tdx.Program(stage).run_pipeline("tdx-check-messages")
