"""What a run tells its user. TDX_LOG sets how much: ``warn`` (the
default) a progress bar where stderr is a terminal, the model binaries'
one line per run, and warnings and errors; ``info`` also every rank's
init, reads and memory (what ``verbose=True`` and ``--verbose`` print),
echoed to stderr when a runner closes; ``debug`` also the commands tdx
runs and each step's time (docs/runtime.md)."""

import os
import re
import sys

LEVELS = ("warn", "info", "debug")


def level():
    """TDX_LOG's level as an index of LEVELS (an unknown value names
    itself once and counts as warn)."""
    value = os.environ.get("TDX_LOG", "warn") or "warn"
    value = "warn" if value == "warning" else value
    if value not in LEVELS:
        if not getattr(level, "_named", False):
            print(f"tdx: TDX_LOG={value} is none of {', '.join(LEVELS)}; taken as warn",
                  file=sys.stderr)
            level._named = True
        return 0
    return LEVELS.index(value)


def info():
    """Whether TDX_LOG asks for info (or debug)."""
    return level() >= 1


def debug(message):
    """`message` on stderr under TDX_LOG=debug."""
    if level() >= 2:
        print(f"tdx: {message}", file=sys.stderr, flush=True)


def run_line(text):
    """The run's line of the ranks' `text` ("tdx: N ranks: init ..."), on
    stderr: after a progress bar, unless TDX_LOG's echo shows it already."""
    if info():
        return
    for line in text.splitlines():
        if " ranks: init " in line:
            print(line, file=sys.stderr, flush=True)


def echo(text):
    """Lines the ranks printed, on stderr under TDX_LOG=info or debug."""
    if info() and text.strip():
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


class _Bar:
    """A tqdm bar over steps or stages, quiet where stderr is no terminal."""

    def __init__(self, desc, total, initial, unit):
        from tqdm import tqdm
        # A terminal that reports no size (a fresh pty) gets 80 x 24: tqdm
        # 4.70 draws nothing on a screen of 0 lines.
        try:
            columns, lines = os.get_terminal_size(sys.stderr.fileno())
        except (OSError, ValueError):
            columns, lines = 0, 0
        size = {"dynamic_ncols": True} if columns > 0 and lines > 0 else \
            {"ncols": columns or 80, "nrows": lines or 24}
        self.bar = tqdm(desc=desc, total=total, initial=initial, unit=unit, leave=True, **size)

    def step(self, loss):
        """One step more, with its loss."""
        self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        self.bar.update(1)

    def stage_line(self, line):
        """tdx-compile's "tdx-compile: [K/N] what" (--progress)."""
        m = re.match(r"tdx-compile: \[(\d+)/\d+\] (.*)", line)
        if m:
            self.bar.set_postfix_str(m.group(2).strip(), refresh=False)
            self.bar.update(int(m.group(1)) - 1 - self.bar.n)
        elif "from the compile cache" in line:
            self.bar.set_postfix_str("from the compile cache", refresh=False)

    def close(self):
        self.bar.close()


def _progress_bar(progress, desc, total, initial=0, unit="step"):
    """A bar when `progress` (None: when stderr is a terminal), else None;
    `total` None counts without one."""
    if progress is None:
        progress = sys.stderr.isatty()
    return _Bar(desc, total, initial, unit) if progress else None
