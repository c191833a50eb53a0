"""tdx's runner (Executable.start): the ranks keep the state between calls,
and the user's own Python loop drives the steps, against eager's loop."""

import functools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import tdx
from test_sharding import GPT2_PLAN
from test_training import (GPT2, OPTIMIZERS, assert_losses_match, assert_matches_eager, batches,
                           full_state, lm_loss, mlp, mlp_loss, rel)

MESHES = {"1": None, "dp2": ((2,), ("dp",))}


def compiled_step(mesh, opt="momentum"):
    """The MLP's training step with lr a runtime input, as the schedule test
    of test_training.py compiles it (the compile cache serves it again)."""
    data = batches("mlp")
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    optimizer = OPTIMIZERS[opt](deferred.parameters())
    prog = tdx.trace_train_step(deferred, optimizer, mlp_loss, *data[0], hyperparameters=("lr",))
    if MESHES[mesh]:
        shape, axes = MESHES[mesh]
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", shape, axes), {}, data_parallel="dp")
    return tdx.compile(prog)


def start_state():
    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in full_state(mlp()).items()}


@pytest.mark.parametrize("mesh", ["1", "dp2"])
def test_a_python_loop_with_a_scheduler_drives_the_runner(mesh, tmp_path):
    # Eager's loop: a cosine schedule that changes lr every step.
    data = batches("mlp")
    torch.manual_seed(0)
    eager = mlp()
    eager_opt = OPTIMIZERS["momentum"](eager.parameters())
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(eager_opt, T_max=len(data))
    lrs, want = [], []
    for x, y in data:
        lrs.append(schedule.get_last_lr())
        eager_opt.zero_grad()
        loss = mlp_loss(eager, x, y)
        loss.backward()
        eager_opt.step()
        schedule.step()
        want.append(loss.item())
    assert len({lr[0] for lr in lrs}) == len(lrs)

    exe = compiled_step(mesh)
    assert exe.entry == "train_step"
    half = len(data) // 2
    losses = []
    with exe.start(params=start_state()) as runner:
        # The same loop, one call per step, lr from the scheduler's list.
        for (x, y), lr in zip(data[:half], lrs[:half]):
            loss = runner.train_step(x, y, lr=lr)
            assert loss.shape == () and loss.dtype == torch.float32
            losses.append(loss.item())
        assert runner.steps == half
        runner.save(tmp_path / "ckpt")
        mid = runner.state_dict(optimizer=True)
        assert runner.state_dict().keys() == eager.state_dict().keys()
    assert {n for n in mid if not n.startswith("optimizer.")} == set(full_state(eager))
    assert any(n.startswith("optimizer.") for n in mid)

    # Resumed from the checkpoint (parameters and momentum) in a new runner.
    with exe.start(params=tmp_path / "ckpt") as runner:
        assert runner.steps == half  # counted on from the checkpoint's step
        assert rel(runner.state_dict()["0.weight"], mid["0.weight"]) == 0
        for (x, y), lr in zip(data[half:], lrs[half:]):
            losses.append(runner(x, y, lr=lr[0]).item())
        final = runner.state_dict()
    assert_matches_eager(losses, want, final, eager)

    # load_state_dict: the mid-run state given to a fresh runner continues
    # the same way.
    with exe.start() as runner:
        runner.load_state_dict(mid)
        again = [runner.train_step(x, y, lr=lr).item()
                 for (x, y), lr in zip(data[half:], lrs[half:])]
    assert again == losses[half:]


def test_the_binarys_command_line_runs_the_same_engine_as_exe_train(tmp_path):
    """One step engine: exe.train (a loop over the runner) and the standalone
    binary's --batches command line (its flags made into the same requests)
    give bitwise the same losses, final state and checkpoints."""
    exe = compiled_step("dp2")
    data = batches("mlp")[:5]
    lrs = [0.05 * (k + 1) for k in range(len(data))]
    losses, state = exe.train(data, params=start_state(), lr=lrs, checkpoint=tmp_path / "a",
                              save_every=2, keep=0)
    files = {n: str(tmp_path / f"{n}.safetensors") for n in ("batches", "params", "out", "state")}
    steps = exe._with_hyperparameters([tuple(b) for b in data], {"lr": lrs})
    tdx.safetensors.save({f"{k}:input:{i}": x for k, b in enumerate(steps)
                          for i, x in enumerate(b)}, files["batches"])
    tdx.safetensors.save(start_state(), files["params"])
    done = subprocess.run(
        ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", exe.path, "--batches",
         files["batches"], "--steps", str(len(data)), "--params", files["params"], "--outputs",
         files["out"], "--save-state", files["state"], "--save", str(tmp_path / "b"),
         "--save-every", "2", "--save-keep", "0", "--progress"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("tdx: step ") == len(data)
    out = tdx.safetensors.load(files["out"])
    assert [float(out[f"{k}:output:0"]) for k in range(len(data))] == losses
    binary = tdx.safetensors.load(files["state"])
    assert sorted(binary) == sorted(state)
    assert all(torch.equal(binary[k], state[k]) for k in state)
    # Checkpoints after steps 2, 4 and the last, in both.
    saved = lambda root: sorted(n for n in os.listdir(root) if n.startswith("step-"))
    assert saved(tmp_path / "a") == saved(tmp_path / "b") and len(saved(tmp_path / "a")) == 3


def test_a_cuda_program_runs_through_the_runner():
    """exe.start(), exe.train and exe.run serve a CUDA program as they do a
    CPU one (the CUDA driver's --serve): here, with no GPU, its ranks say so
    by name, from the served binary."""
    if not (os.path.exists("/usr/local/cuda/bin/nvcc") or shutil.which("nvcc")):
        pytest.skip("no nvcc on this machine")
    data = batches("mlp")
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    prog = tdx.trace_train_step(deferred, OPTIMIZERS["momentum"](deferred.parameters()), mlp_loss,
                                *data[0], hyperparameters=("lr",))
    exe = tdx.compile(prog, target="cuda")
    missing = r"(?s)ranks ended during ready.*no CUDA device is visible to rank 0"
    with pytest.raises(tdx.TdxError, match=missing):
        exe.start(params=start_state())
    with pytest.raises(tdx.TdxError, match=missing):
        exe.train(data[:2], params=start_state())


def test_runner_misuse_is_named():
    exe = compiled_step("1")
    x, y = batches("mlp")[0]
    with pytest.raises(tdx.TdxError, match="the program runs on 1 process.*but nprocs=2"):
        exe.start(nprocs=2)
    runner = exe.start(params=start_state())
    with pytest.raises(tdx.InputError, match=r"train_step: input 0 is torch.float32 of shape "
                                             r"\(3, 8\); the program was traced for "
                                             r"torch.float32 of shape \(16, 8\)"):
        runner.train_step(x[:3], y)
    with pytest.raises(tdx.InputError, match=r"train_step has 1 input\(s\) but the step takes 2 "
                                             r"\(and lr by keyword\): input 0: torch.float32 "
                                             r"of shape \(16, 8\), input 1: torch.int64"):
        runner.train_step(x)
    with pytest.raises(tdx.InputError, match="train_step: momentum is not a hyperparameter of "
                                             "this step; it takes lr"):
        runner.train_step(x, y, momentum=0.5)
    with pytest.raises(tdx.InputError, match="train_step: lr has 2 values for 1 batches"):
        runner.train_step(x, y, lr=[0.1, 0.2])
    with pytest.raises(tdx.InputError, match="load_state_dict: bogus is not state of this "
                                             "program"):
        runner.load_state_dict({"bogus": torch.zeros(1)})
    with pytest.raises(tdx.InputError, match=r"load_state_dict: 0.bias, 2.bias, 2.weight are missing "
                                             r"\(pass strict=False to keep the current values\)"):
        runner.load_state_dict({"0.weight": torch.zeros(32, 8)})
    with pytest.raises(tdx.InputError, match=r"load_state_dict: 0.weight has shape \(8, 32\); "
                                             r"the program's is \(32, 8\)"):
        runner.load_state_dict({"0.weight": torch.zeros(8, 32)}, strict=False)
    # Misuse refused before it reaches the ranks leaves the runner working.
    assert runner.train_step(x, y).shape == ()
    runner.close()
    runner.close()  # idempotent
    with pytest.raises(tdx.TdxError, match="train_step: the runner is closed; start another "
                                           "with exe.start"):
        runner.train_step(x, y)
    with pytest.raises(tdx.TdxError, match="state_dict: the runner is closed"):
        runner.state_dict()


def test_a_rank_that_fails_mid_call_ends_the_runner_with_its_message():
    exe = compiled_step("dp2")
    runner = exe.start()
    # A request whose input file is gone (what a crashed writer would
    # leave): every rank fails reading it and the runner ends, naming it.
    with pytest.raises(tdx.TdxError, match=r"(?s)ranks ended during call.*rank \d \(host [^)]+\): .*"
                                           r"/nonexistent/in.safetensors"):
        runner._t._request("call", "/nonexistent/in.safetensors")
    with pytest.raises(tdx.TdxError, match="the runner is closed"):
        runner.state_dict()


def test_the_ranks_end_when_the_controller_dies(tmp_path):
    # A notebook killed mid-session leaves no rank behind: the ranks see the
    # controller's process gone and end.
    exe = compiled_step("1")
    exe.save(tmp_path / "model")
    script = textwrap.dedent(f"""
        import sys, time
        import tdx
        runner = tdx.Executable.load({str(tmp_path / "model")!r}, 1).start()
        print(runner._t._proc.pid, flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    mpirun = int(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait()

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 30
    while alive(mpirun) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(mpirun), "the runner's mpirun outlived its controller by 30 s"


def test_progress_shows_on_a_terminal_and_stays_quiet_elsewhere(tmp_path):
    exe = compiled_step("1")
    exe.save(tmp_path / "model")
    here = os.path.dirname(os.path.abspath(__file__))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {here!r})
        import torch, tdx
        from test_training import batches
        exe = tdx.Executable.load({str(tmp_path / "model")!r}, 1)
        with exe.start(progress=True) as runner:
            for x, y in batches("mlp")[:3]:
                runner(x, y, torch.tensor(0.05, dtype=torch.float64))
    """)
    # On a terminal: a tqdm bar with the step count and the loss.
    text, code = read_pty(script)
    assert code == 0, text
    assert "forward: " in text and "3step" in text.replace(" ", "") and "loss=" in text, text
    # Not a terminal: nothing.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "loss=" not in done.stderr and "step/s" not in done.stderr


def read_pty(script, env=None):
    """What `script` (a python -c) writes to stderr when stderr is a
    terminal, and its exit code."""
    import pty
    leader, follower = pty.openpty()
    child = subprocess.Popen([sys.executable, "-c", script], stderr=follower,
                             stdout=subprocess.DEVNULL, env=env)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    code = child.wait(timeout=300)
    os.close(leader)
    return shown.decode(errors="replace"), code


def test_compile_and_train_show_progress_on_a_terminal(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {here!r})
        import torch, tdx
        from test_training import batches, mlp, mlp_loss
        torch.manual_seed(0)
        model = tdx.deferred_init(mlp)
        prog = tdx.trace_train_step(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                    mlp_loss, *batches("mlp")[0])
        exe = tdx.compile(prog)        # compiles: its stages
        assert not exe.from_cache
        again = tdx.compile(prog)      # the compile cache serves it
        assert again.from_cache
        losses, _ = exe.train(batches("mlp")[:3])
    """)
    env = dict(os.environ, TDX_CACHE_DIR=str(tmp_path / "cache"))
    text, code = read_pty(script, env)
    assert code == 0, text
    flat = text.replace(" ", "")
    assert "compile:" in text and "compilingC++" in flat, text
    assert "fromthecompilecache" in flat, text
    assert "train:" in text and "3/3" in flat and "loss=" in text, text
    # Not a terminal: nothing.
    env["TDX_CACHE_DIR"] = str(tmp_path / "cache2")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "loss=" not in done.stderr and "compiling" not in done.stderr


def loop_against_eager(exe, start, eager, opt, loss_fn, data, held_out, k, evaluate):
    """The user's loop: a runner's train_step with lr from a cosine
    schedule and its evaluate entry after every step, next to eager's loop
    of k micro-batches per step (each loss / k backward) on `eager` and
    `opt`. Returns the runner's losses, eager's, both evaluations and the
    runner's final state."""
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(data))
    rows = data[0][0].shape[0] // k
    got, want, evals, eager_evals = [], [], [], []
    with exe.start(params=start) as runner:
        for x, y in data:
            got.append(runner.train_step(x, y, lr=schedule.get_last_lr()).item())
            evals.append(runner.evaluate(*held_out).item())
            opt.zero_grad()
            total = 0.0
            for i in range(k):
                micro = slice(i * rows, (i + 1) * rows)
                loss = loss_fn(eager, x[micro], y[micro])
                (loss / k).backward()
                total += loss.item()
            opt.step()
            schedule.step()
            want.append(total / k)
            with torch.no_grad():
                eager_evals.append(evaluate(eager, *held_out).item())
        state = runner.state_dict()
        assert runner.steps == len(data)  # evaluation is not a step
    return got, want, evals, eager_evals, state


@pytest.mark.parametrize("mesh", [pytest.param("1", marks=pytest.mark.slow),
                                  pytest.param("dp2", marks=pytest.mark.slow), "tp2"])
def test_a_gpt_trains_from_a_loop_with_a_schedule_and_accumulation(mesh):
    # GPT-2 (the suite's model, written the usual way) on 1 rank, dp2 or
    # tp2 with the Megatron plan, SGD with momentum and weight decay, lr an
    # input that a cosine schedule changes every step, and 2 micro-batches
    # per step: driven call by call from a Python loop, with an evaluation
    # entry run after every step on the weights it left, against eager's
    # loop. 1 rank and dp2 run with TDX_SLOW=1 (a compile each).
    k, data = 2, batches("gpt2")[:6]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(GPT2)
    prog = tdx.trace_train_step(deferred, OPTIMIZERS["momentum"](deferred.parameters()), lm_loss,
                                *data[0], hyperparameters=("lr",), accumulation_steps=k)
    held_out = batches("gpt2")[6]
    prog.add_entry("evaluate", lm_loss, *held_out)
    if mesh == "tp2":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)), GPT2_PLAN)
    elif mesh == "dp2":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    exe = tdx.compile(prog)

    torch.manual_seed(0)
    start = {n: v.detach().clone() for n, v in full_state(GPT2()).items()}
    torch.manual_seed(0)
    eager = GPT2()
    opt = OPTIMIZERS["momentum"](eager.parameters())
    got, want, evals, eager_evals, state = loop_against_eager(
        exe, start, eager, opt, lm_loss, data, held_out, k, lm_loss)
    assert_matches_eager(got, want, state, eager)
    assert_losses_match(evals, eager_evals)


def test_add_entry_misuse_is_named():
    data = batches("mlp")
    torch.manual_seed(0)
    deferred = tdx.deferred_init(mlp)
    prog = tdx.trace_train_step(deferred, OPTIMIZERS["momentum"](deferred.parameters()),
                                mlp_loss, *data[0])
    prog.add_entry("evaluate", mlp_loss, *data[0])
    assert prog.entries == ["train_step", "evaluate"]
    with pytest.raises(tdx.CaptureError, match="the program has a @evaluate already"):
        prog.add_entry("evaluate", mlp_loss, *data[0])
    with pytest.raises(ValueError, match="must be a Python identifier"):
        prog.add_entry("eval loss", mlp_loss, *data[0])
    with pytest.raises(tdx.CaptureError, match="does not know its model"):
        tdx.Program(prog.mlir).add_entry("logits", lambda m, x: m(x), data[0][0])

    def writes(m, x):  # an entry that writes the state
        m[0].weight.add_(1.0)
        return m(x)
    with pytest.raises(tdx.CaptureError, match="the entry writes 0.weight; an entry reads the "
                                               "state"):
        prog.add_entry("bad", writes, data[0][0])
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    with pytest.raises(tdx.CaptureError, match="the program is placed already; add every entry "
                                               "before tdx.parallelize"):
        prog.add_entry("logits", lambda m, x: m(x), data[0][0])
    # The evaluation's batch is split like the step's: no all_gather of it.
    exe = tdx.compile(prog)
    assert exe.entries == ["evaluate"]
    x, y = data[1]
    with exe.start() as runner:
        with pytest.raises(tdx.InputError, match=r"evaluate: input 0 is torch.float32 of shape "
                                                 r"\(3, 8\); the program was traced for"):
            runner.evaluate(x[:3], y)
        with pytest.raises(tdx.InputError, match=r"evaluate has 1 input\(s\) but evaluate "
                                                 r"takes 2"):
            runner.evaluate(x)
        before = runner.state_dict()
        runner.evaluate(x, y)
        assert all(rel(runner.state_dict()[n], t) == 0 for n, t in before.items() if t.norm())


def nanogpt_groups(model, lr):
    """nanoGPT's configure_optimizers grouping: weight decay on the
    matrices, none on biases and norms; here the no-decay group also steps
    at half lr. SGD with momentum, not nanoGPT's AdamW: Adam divides by the
    root of the squared gradients, which turns the rounding in GPT-2's key
    bias gradient (zero but for rounding: softmax ignores a shift of the
    keys) into steps of lr's size, 3e-4 off eager after 4 steps whatever
    the program (docs/runtime.md, the GPU check)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.SGD([{"params": decay, "weight_decay": 0.01},
                            {"params": no_decay, "weight_decay": 0.0, "lr": lr / 2}],
                           lr=lr, momentum=0.9, foreach=False)


def test_param_groups_each_take_their_own_hyperparameters():
    # Two param groups (nanoGPT's), lr a runtime input per group, driven by
    # a cosine schedule's get_last_lr() (one value per group), against
    # eager's loop with the same schedule.
    data = batches("gpt2")[:4]
    torch.manual_seed(0)
    deferred = tdx.deferred_init(GPT2)
    prog = tdx.trace_train_step(deferred, nanogpt_groups(deferred, 0.05), lm_loss, *data[0],
                                hyperparameters=("lr",))
    assert prog.hyperparameters == {"lr": [0.05, 0.025]}
    exe = tdx.compile(prog)
    torch.manual_seed(0)
    start = {n: v.detach().clone() for n, v in full_state(GPT2()).items()}
    torch.manual_seed(0)
    eager = GPT2()
    opt = nanogpt_groups(eager, 0.05)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(data))
    got, want, seen = [], [], []
    with exe.start(params=start) as runner:
        for x, y in data:
            lrs = schedule.get_last_lr()
            seen.append(lrs)
            assert len(lrs) == 2 and lrs[0] != lrs[1]
            got.append(runner.train_step(x, y, lr=lrs).item())
            opt.zero_grad()
            loss = lm_loss(eager, x, y)
            loss.backward()
            opt.step()
            schedule.step()
            want.append(loss.item())
        with pytest.raises(tdx.InputError, match="train_step: lr has 3 values; the optimizer "
                                                 "has 2 param groups"):
            runner.train_step(x, y, lr=[0.1, 0.2, 0.3])
        state = runner.state_dict()
        # The tied lm_head.weight is there, as in model.state_dict(): the
        # user's own model loads the runner's state strictly; given back,
        # a tied name that disagrees with the one it shares is refused.
        assert exe.tied() == {"lm_head.weight": "wte.weight"}
        assert state["lm_head.weight"] is state["wte.weight"]
        mine = GPT2()
        mine.load_state_dict(state, strict=True)
        runner.load_state_dict(mine.state_dict())
        bad = dict(state, **{"lm_head.weight": state["wte.weight"] + 1})
        with pytest.raises(tdx.InputError, match="lm_head.weight is tied to wte.weight"):
            runner.load_state_dict(bad)
    assert_matches_eager(got, want, state, eager)
    # exe.train: per step, one value per group (or a number for every group).
    losses, _ = exe.train(data[:3], params=start, lr=seen[:3])
    assert_losses_match(losses, want[:3])
    same, _ = exe.train(data[:3], params=start, lr=0.05)
    assert same[2] != pytest.approx(want[2], rel=1e-5)  # the no-decay group at 0.05 differs


def resnet18_case():
    """torchvision's ResNet-18 as torchvision builds it (11.2M parameters,
    batch norm in training mode) with SGD and momentum: its builder, the
    optimizer's, 3 batches of 2 micro-batches and a held-out batch."""
    import torchvision
    build = functools.partial(torchvision.models.resnet18, num_classes=10)
    g = torch.Generator().manual_seed(3)
    # 64x64 images: at 32x32 ResNet-18's last stage is 1x1, and batch norm
    # over a micro-batch of 2 such values is chaotic (eager itself, weights
    # moved by 1e-7, is 0.19 off its own loss after one step); here 1e-6.
    # Well-conditioned so, eager float32 is the reference its tests hold
    # tdx to: within 2.5e-7 of eager float64's losses, 1.4e-7 of its
    # evaluations and 7.7e-6 of its parameters (measured; the tests allow
    # 1e-5 and 1e-4).
    data = [(torch.randn(4, 3, 64, 64, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(3)]
    held_out = (torch.randn(4, 3, 64, 64, generator=g), torch.randint(0, 10, (4,), generator=g))

    def sgd(params):
        return torch.optim.SGD(params, lr=3e-5, momentum=0.9)
    return build, sgd, data, held_out


def resnet18_step(mesh):
    """ResNet-18's step (lr a runtime input, 2 micro-batches per step, an
    evaluation entry in eval mode: the running statistics the steps update)
    compiled on `mesh` ("1" or "dp2"), as test_spmd.py's script compiles it
    too (the compile cache serves it); with the eager model it starts from
    (its state dict is the start) and that model's optimizer."""
    build, sgd, data, held_out = resnet18_case()
    torch.manual_seed(0)
    deferred = tdx.deferred_init(build)
    prog = tdx.trace_train_step(deferred, sgd(deferred.parameters()), mlp_loss, *data[0],
                                hyperparameters=("lr",), accumulation_steps=2)
    prog.add_entry("evaluate", resnet18_evaluate, *held_out)
    if mesh == "dp2":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("dp",)), {}, data_parallel="dp")
    exe = tdx.compile(prog)
    torch.manual_seed(0)
    eager = build()
    return exe, eager, sgd(eager.parameters())


def resnet18_evaluate(model, x, y):
    model.eval()
    loss = mlp_loss(model, x, y)
    model.train()
    return loss


def assert_state_matches(state, eager):
    """Every tensor of eager's state dict (buffers too) within 1e-4."""
    for name, t in eager.state_dict().items():
        assert torch.allclose(state[name].to(t.dtype), t, rtol=1e-4, atol=1e-6), name


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["1", "dp2"])
def test_torchvision_resnet18_trains_from_a_loop_with_eval_after_every_step(mesh):
    # ResNet-18's step driven from a loop, lr from a cosine schedule and
    # evaluation after every step, against eager's loop. Slow: about a
    # minute of compile per layout.
    exe, eager, opt = resnet18_step(mesh)
    _, _, data, held_out = resnet18_case()
    start = {k: v.clone() for k, v in eager.state_dict().items()}
    got, want, evals, eager_evals, state = loop_against_eager(
        exe, start, eager, opt, mlp_loss, data, held_out, 2, resnet18_evaluate)
    assert_losses_match(got, want)
    assert_losses_match(evals, eager_evals)
    assert_state_matches(state, eager)


def test_the_state_dict_is_the_models_own_for_a_strict_load():
    # LLaMA keeps its rotary tables as buffers registered persistent=False:
    # state of the program (tdx.buffer ... non_persistent), not of
    # model.state_dict(). runner.state_dict() has exactly the model's keys
    # (the user's own model loads it strictly, and the runner loads the
    # model's); optimizer=True adds the optimizer's state and those buffers.
    from models import Llama
    from test_training import MODELS
    torch.manual_seed(0)
    deferred = tdx.deferred_init(Llama)
    prog = tdx.trace_train_step(deferred, OPTIMIZERS["adamw"](deferred.parameters()),
                                MODELS["llama"][1], *batches("llama")[0])
    assert "tdx.buffer @rope_cos : tensor<16x4xf32> non_persistent" in prog.mlir
    exe = tdx.compile(prog)
    assert exe.non_persistent() == ["rope_cos", "rope_sin"]
    torch.manual_seed(0)
    mine = Llama()
    with exe.start(params=mine.state_dict()) as runner:
        runner.train_step(*batches("llama")[0])
        state = runner.state_dict()
        assert state.keys() == mine.state_dict().keys()
        mine.load_state_dict(state, strict=True)
        runner.load_state_dict(mine.state_dict())
        full = runner.state_dict(optimizer=True)
        assert {"rope_cos", "rope_sin"} <= full.keys()
        assert any(k.startswith("optimizer.") for k in full)
