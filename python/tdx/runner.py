"""tdx's runner: a compiled program whose ranks hold its state between calls,
driven step by step from the user's own Python loop (`Executable.start`)."""

import os
import shutil
import subprocess
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
    Requests and tensors go through files in shared memory (``/dev/shm``).
    The ranks end when :meth:`close` is called, when a ``with`` block
    ends, or when this process dies."""

    def __init__(self, exe, *, params=None, seed=0, nprocs=None, threads=None, store=None,
                 timeout=600):
        self._exe = exe
        self._timeout = timeout
        self._k = 0
        self._closed = True
        self.steps = 0
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self._dir = tempfile.mkdtemp(prefix="tdx-runner-", dir=shm)
        with open(os.path.join(self._dir, "controller.pid"), "w") as f:
            f.write(str(os.getpid()))
        args = ["--serve", self._dir, "--seed", str(seed)]
        args += exe._params_args(params, self._dir) + exe._store_args(store)
        args += exe._threads_args(threads)
        self._stderr_path = os.path.join(self._dir, "stderr")
        self._proc = exe._start(nprocs, args, self._dir, self._stderr_path)
        self._closed = False
        # The ranks have made or read their state once this is answered.
        self._request("ready")
        setattr(self, exe.entry, self.__call__)

    def __call__(self, *inputs, **hyperparameters):
        name = f"{self._exe.entry}"
        self._check_open(name)
        batch = self._exe._with_hyperparameters([tuple(inputs)], hyperparameters, name)[0]
        self._exe._check_inputs(batch, name)
        path = self._file(self._k + 1, ".in.safetensors")
        safetensors.save({f"input:{i}": x for i, x in enumerate(batch)}, path)
        try:
            self._request("call", path)
            out_path = self._file(self._k, ".out.safetensors")
            got = safetensors.load(out_path)
            os.remove(out_path)
        finally:
            if os.path.exists(path):
                os.remove(path)
        self.steps += 1
        outputs = tuple(got[f"output:{i}"] for i in range(len(got)))
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
            os.remove(path)

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
            os.remove(path)

    def save(self, checkpoint, keep=2):
        """A sharded, crash-safe checkpoint of the whole state (optimizer
        included) under the directory `checkpoint`, as step ``self.steps``:
        every rank writes its own shards (tdx.checkpoint's format), and
        ``exe.start(params=checkpoint)`` resumes from it on any layout.
        Keeps the newest `keep` steps (0: all)."""
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
        if self._closed:
            return
        try:
            self._request("close")
            self._proc.wait(timeout=60)
        finally:
            self._closed = True
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
        if getattr(self, "_dir", None):
            shutil.rmtree(self._dir, ignore_errors=True)

    # The requests (the binary's --serve DIR): request k is DIR/k.cmd, its
    # answer DIR/k.reply, written by rank 0 once every rank is done.

    def _file(self, k, suffix):
        return os.path.join(self._dir, f"{k}{suffix}")

    def _check_open(self, what):
        if self._closed:
            raise TdxError(f"{what}: the runner is closed; start another with exe.start()")

    def _request(self, op, *args):
        self._k += 1
        cmd, reply = self._file(self._k, ".cmd"), self._file(self._k, ".reply")
        with open(cmd + ".tmp", "w") as f:
            f.write("\n".join((op,) + args) + "\n")
        os.rename(cmd + ".tmp", cmd)
        deadline = time.monotonic() + self._timeout
        pause = 20e-6
        while not os.path.exists(reply):
            if self._proc.poll() is not None:
                self._died(op)
            if time.monotonic() > deadline:
                self._proc.kill()
                self._proc.wait()
                self._closed = True
                raise TdxError(f"the runner's {op} did not finish in {self._timeout} s; its "
                               f"ranks were ended")
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
        with open(reply) as f:
            answer = f.read()
        os.remove(reply)
        os.remove(cmd)
        return answer

    def _died(self, op):
        self._closed = True
        with open(self._stderr_path) as f:
            log = f.read().strip()
        code = self._proc.returncode
        shutil.rmtree(self._dir, ignore_errors=True)
        raise TdxError(f"the runner's ranks ended during {op} (exit {code}):\n{log}")
