"""What a run prints (docs/runtime.md, TDX_LOG): one line by default, every
rank's bookkeeping under TDX_LOG=info, the commands and each step's time
under TDX_LOG=debug, an unknown level named."""

import re

import torch

import tdx


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _exe():
    prog = tdx.trace(tdx.deferred_init(MLP), torch.randn(4, 8))
    tdx.parallelize(prog, tdx.init_device_mesh("cpu", (2,), ("tp",)),
                    {"up": tdx.ColwiseParallel(), "down": tdx.RowwiseParallel()})
    return tdx.compile(prog)


def test_a_run_prints_one_line_by_default(monkeypatch, capfd):
    monkeypatch.delenv("TDX_LOG", raising=False)
    exe = _exe()
    capfd.readouterr()
    exe.run(torch.randn(4, 8), nprocs=2, steps=3)
    lines = exe.last_log.strip().splitlines()
    assert len(lines) == 1, exe.last_log
    assert re.fullmatch(r"tdx: 2 ranks: init [\d.]+ ms, step [\d.]+ ms, \d+ bytes communicated",
                        lines[0]), lines
    assert exe.last_step_ms() > 0
    out, err = capfd.readouterr()
    assert "rank 0:" not in out + err


def test_tdx_log_info_brings_every_ranks_lines_back(monkeypatch, capfd):
    monkeypatch.setenv("TDX_LOG", "info")
    exe = _exe()
    capfd.readouterr()
    exe.run(torch.randn(4, 8), nprocs=2)
    for rank in (0, 1):
        assert re.search(rf"tdx: rank {rank}: init [\d.]+ ms", exe.last_log), exe.last_log
        assert re.search(rf"tdx: rank {rank}: arena \d+ bytes", exe.last_log), exe.last_log
    # The runner echoes them on stderr as it closes.
    _, err = capfd.readouterr()
    assert re.search(r"tdx: rank 1: init [\d.]+ ms", err), err
    assert "tdx: step 1:" not in exe.last_log


def test_tdx_log_debug_adds_steps_and_commands(monkeypatch, capfd):
    monkeypatch.setenv("TDX_LOG", "debug")
    exe = _exe()
    exe.run(torch.randn(4, 8), nprocs=2, steps=2)
    assert re.findall(r"tdx: step (\d+): [\d.]+ ms", exe.last_log) == ["1", "2"], exe.last_log
    _, err = capfd.readouterr()
    assert "tdx: starting the ranks: mpirun" in err
    assert re.search(r"tdx: compiling: \S*tdx-compile", err), err


def test_an_unknown_level_is_named(monkeypatch):
    monkeypatch.setenv("TDX_LOG", "loud")
    exe = _exe()
    import warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exe.run(torch.randn(4, 8), nprocs=2)
    said = [str(w.message) for w in seen]
    assert any("TDX_LOG=loud is none of warn, info, debug" in s for s in said), said
    assert len(exe.last_log.strip().splitlines()) == 1
