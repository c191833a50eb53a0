"""tdx's runner: a compiled program whose ranks hold its state between calls,
driven step by step from the user's own Python loop (`Executable.start`)."""

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

from . import safetensors
from .errors import InputError, TdxError


class Runner:
    """The ranks of a model binary started once (``exe.start()``), holding its
    parameters, buffers, optimizer state and random-stream counters between
    calls.

    The program's function is a method of the same name,
    ``runner.train_step(x, y, lr=...)`` for a training step or
    ``runner.forward(x)``; ``runner(...)`` calls it too. It takes global
    tensors (each rank reads its box) and returns the gathered global
    outputs: one tensor, or a tuple when the program has several.

    This is the single-controller runner: the calling process is the
    controller and ``nprocs`` worker ranks (mpirun) run the program.
    Requests go through a pipe per rank and tensors through files in
    shared memory (``/dev/shm``). With ``progress=True`` (and a terminal
    on stderr) a tqdm bar shows the step, the loss, the hyperparameters
    given and steps/s.
    The ranks end when :meth:`close` is called, when a ``with`` block
    ends, or when this process dies."""

    def __init__(self, exe, *, params=None, seed=0, nprocs=None, threads=None, store=None,
                 timeout=600, progress=False):
        self._exe = exe
        self._bar = None
        self._timeout = timeout
        self._k = 0
        self._closed = True
        self.steps = 0
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self._dir = tempfile.mkdtemp(prefix="tdx-runner-", dir=shm)
        with open(os.path.join(self._dir, "controller.pid"), "w") as f:
            f.write(str(os.getpid()))
        # One pipe per rank for the requests, one for rank 0's answers;
        # held open for reading and writing, so that neither end blocks on
        # opening or ever reads as closed.
        self._pipes = []
        for path in [f"rank{r}.fifo" for r in range(exe.world_size)] + ["reply.fifo"]:
            os.mkfifo(os.path.join(self._dir, path))
            self._pipes.append(os.open(os.path.join(self._dir, path), os.O_RDWR))
        self._replies = b""
        args = ["--serve", self._dir, "--seed", str(seed)]
        args += exe._params_args(params, self._dir) + exe._store_args(store)
        args += exe._threads_args(threads)
        self._stderr_path = os.path.join(self._dir, "stderr")
        self._proc = exe._start(nprocs, args, self._dir, self._stderr_path)
        self._closed = False
        # The ranks have made or read their state once this is answered,
        # with the step they start from (a runner's checkpoint's, or 0).
        self.steps = int(self._request("ready").split("\t")[1])
        setattr(self, exe.entry, self.__call__)
        if progress and sys.stderr.isatty():
            from tqdm import tqdm
            self._bar = tqdm(desc=exe.entry, unit="step", initial=self.steps, dynamic_ncols=True,
                             leave=True)

    def __call__(self, *inputs, **hyperparameters):
        name = self._exe.entry
        self._check_open(name)
        batch = self._exe._with_hyperparameters([tuple(inputs)], hyperparameters, name)[0]
        batch = self._exe._check_inputs(batch, name)
        path = self._file(self._k + 1, ".in.safetensors")
        safetensors.save({f"input:{i}": x for i, x in enumerate(batch)}, path)
        try:
            self._request("call", path)
            out_path = self._file(self._k, ".out.safetensors")
            got = safetensors.load(out_path)
            os.remove(out_path)
        finally:
            _discard(path)
        self.steps += 1
        outputs = tuple(got[f"output:{i}"] for i in range(len(got)))
        if self._bar is not None:
            # The step, its loss (the first output, when a number) and the
            # hyperparameters given; tqdm adds steps/s.
            shown = {k: f"{float(v[0] if isinstance(v, (list, tuple)) else v):.3g}"
                     for k, v in hyperparameters.items()}
            if outputs and outputs[0].numel() == 1:
                shown = {"loss": f"{outputs[0].item():.4f}", **shown}
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(1)
        return outputs[0] if len(outputs) == 1 else outputs

    def state_dict(self):
        """The global state by name, gathered: parameters and buffers as in
        ``model.state_dict()``, optimizer state as ``optimizer.<param>.<key>``
        (the names of ``exe.train``'s state)."""
        self._check_open("state_dict")
        path = os.path.join(self._dir, "state.safetensors")
        self._request("state", path)
        try:
            return safetensors.load(path)
        finally:
            _discard(path)

    def load_state_dict(self, state_dict, strict=True):
        """Replaces the ranks' state with `state_dict`'s global tensors (each
        rank reads its shard). With ``strict=True`` every parameter and
        buffer of the program must be given; optimizer state that is not
        given is kept."""
        self._check_open("load_state_dict")
        want = {p["name"]: p for p in self._exe.signature()["params"]}
        unknown = sorted(set(state_dict) - set(want))
        if unknown:
            raise InputError(f"load_state_dict: {', '.join(unknown)} "
                             f"{'is' if len(unknown) == 1 else 'are'} not state of this "
                             f"program; it has {', '.join(sorted(want))}")
        missing = sorted(n for n in want if n not in state_dict and
                         not n.startswith("optimizer."))
        if strict and missing:
            raise InputError(f"load_state_dict: {', '.join(missing)} "
                             f"{'is' if len(missing) == 1 else 'are'} missing (pass "
                             f"strict=False to keep the current values)")
        for name, t in state_dict.items():
            shape = tuple(want[name]["shape"])
            if tuple(t.shape) != shape:
                raise InputError(f"load_state_dict: {name} has shape {tuple(t.shape)}; the "
                                 f"program's is {shape}")
        path = os.path.join(self._dir, "load.safetensors")
        safetensors.save(dict(state_dict), path)
        try:
            self._request("load", path)
        finally:
            _discard(path)

    def save(self, checkpoint, keep=2):
        """A sharded, crash-safe checkpoint of the whole state (optimizer
        included) under the directory `checkpoint`, as step ``self.steps``:
        every rank writes its own shards (tdx.checkpoint's format), and
        ``exe.start(params=checkpoint)`` resumes from it on any layout, its
        steps counted on from the saved one and its random ops drawing on
        from the saved stream. Keeps the newest `keep` steps (0: all)."""
        self._check_open("save")
        self._request("save", os.fspath(checkpoint), str(int(keep)))

    def publish(self, store, key):
        """Commits the parameters and buffers (no optimizer state) as the
        next version of `key` in the tensor store `store` (a path or
        :class:`tdx.store.Store`)."""
        self._check_open("publish")
        self._request("publish", os.fspath(getattr(store, "path", store)), key)

    def close(self):
        """Ends the ranks. Idempotent."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._closed:
            return
        try:
            self._request("close")
            self._proc.wait(timeout=60)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            if not self._closed:
                self._end()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
        if hasattr(self, "_pipes"):
            self._end()

    # The requests (the binary's --serve DIR, lib/Runtime/cpu/Driver.cpp):
    # request k is a line "op<TAB>args..." on every rank's pipe, answered by
    # a line on reply.fifo once every rank is done; its tensors are the
    # files k.in.safetensors and k.out.safetensors.

    def _file(self, k, suffix):
        return os.path.join(self._dir, f"{k}{suffix}")

    def _check_open(self, what):
        if self._closed:
            raise TdxError(f"{what}: the runner is closed; start another with exe.start()")

    def _request(self, op, *args):
        if any("\t" in a or "\n" in a for a in args):
            raise ValueError(f"{op}: a path with a tab or newline cannot be sent to the ranks")
        self._k += 1
        line = ("\t".join((op,) + args) + "\n").encode()
        for fd in self._pipes[:-1]:
            os.write(fd, line)
        deadline = time.monotonic() + self._timeout
        reply = self._pipes[-1]
        while b"\n" not in self._replies:
            ready, _, _ = select.select([reply], [], [], 0.5)
            if ready:
                self._replies += os.read(reply, 4096)
                continue
            if self._proc.poll() is not None:
                self._died(op)
            if time.monotonic() > deadline:
                self._proc.kill()
                self._proc.wait()
                self._end()
                raise TdxError(f"the runner's {op} did not finish in {self._timeout} s; its "
                               f"ranks were ended")
        answer, self._replies = self._replies.split(b"\n", 1)
        return answer.decode()

    def _end(self):
        self._closed = True
        for fd in self._pipes:
            os.close(fd)
        self._pipes = []
        shutil.rmtree(self._dir, ignore_errors=True)

    def _died(self, op):
        with open(self._stderr_path) as f:
            log = f.read().strip()
        code = self._proc.returncode
        self._end()
        raise TdxError(f"the runner's ranks ended during {op} (exit {code}):\n{log}")


def _discard(path):
    """Removes a request's file, if the runner has not already (an ended
    runner's directory is gone)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
