"""tdx's runner: a compiled program whose ranks hold its state between calls,
driven step by step from the user's own Python loop (`Executable.start`)."""

import ctypes
import functools
import os
import select
import shutil
import sys
import tempfile
import time

import torch

from . import safetensors
from .errors import InputError, TdxError
from . import log
from .log import _progress_bar
from .tools import _TORCH_DTYPES


class Runner:
    """The ranks of a compiled program started once (``exe.start()``),
    holding its parameters, buffers, optimizer state and random-stream
    counters between calls.

    The program's function is a method of the same name,
    ``runner.train_step(x, y, lr=...)`` for a training step or
    ``runner.forward(x)``; ``runner(...)`` calls it too. It takes global
    tensors (each rank takes its box; with ``local=True``, each rank's own
    box) and returns the gathered global outputs: one tensor, or a tuple
    when the program has several.

    Two controllers:

    - **single controller** (a plain ``python3`` process, a notebook): the
      calling process is the controller and ``nprocs`` worker ranks
      (mpirun) run the program. Requests go through a pipe per rank and
      tensors through files in shared memory (``/dev/shm``).
    - **SPMD** (the script runs under ``mpirun -np N python3 train.py`` or
      ``python3 -m tdx.run -n N train.py``): every process is a rank. The
      program is built as a shared object and loaded into each process;
      inputs are read from the caller's tensors without a copy where the
      layout allows, and every rank gets the outputs.

    With ``progress=True`` (and a terminal on stderr; rank 0 under SPMD) a
    tqdm bar shows the step, the loss, the hyperparameters given and
    steps/s. The ranks end when :meth:`close` is called, when a ``with``
    block ends, or when this process dies."""

    def __init__(self, exe, *, params=None, seed=0, nprocs=None, threads=None, store=None,
                 timeout=600, progress=False, local=False, _flags=(), _resume=None,
                 _deadline=None):
        # exe.run, exe.train and the like drive a runner too: with the
        # binary's _flags (--verbose, --profile, --no-overlap), resuming
        # from the checkpoint _resume (its seed, step and stream), every
        # request ending by the time.monotonic() _deadline.
        self._exe = exe
        self._bar = None
        self._t = None
        self._t_closed = False
        self._local = bool(local)
        spmd = nprocs is None and "OMPI_COMM_WORLD_SIZE" in os.environ
        if local and not spmd:
            raise TdxError("local=True needs an SPMD script (mpirun -np N python3 script.py): "
                           "each rank passes its own part of the batch; a single controller "
                           "passes the global batch")
        if spmd:
            self._t = _InProcess(exe, params=params, seed=seed, nprocs=nprocs, threads=threads,
                                 store=store, timeout=timeout)
        else:
            self._t = _Workers(exe, params=params, seed=seed, nprocs=nprocs, threads=threads,
                               store=store, timeout=timeout, flags=list(_flags),
                               resume=_resume, deadline=_deadline)
        self.steps = self._t.steps
        setattr(self, exe.entry, self.__call__)
        # The program's other entries (prog.add_entry): runner.evaluate(x, y).
        for k, name in enumerate(exe.entries, start=1):
            setattr(self, name, functools.partial(self._call_entry, k, name))
        self._bar = _progress_bar(bool(progress) and sys.stderr.isatty() and self._t.rank == 0,
                                  exe.entry, None, self.steps)

    def generate(self, input_ids, attention_mask=None, max_new_tokens=20, do_sample=False,
                 temperature=1.0, top_k=None, top_p=None, eos_token_id=None,
                 pad_token_id=None, seed=None):
        """Generates from a program :func:`tdx.trace_generate` made, with
        Hugging Face ``generate``'s meaning of each argument: left-padded
        prompts ``(batch, length)``, greedy or sampled (temperature, top-k,
        top-p; ``seed`` makes the draw the same on every layout), stopping
        each sequence at its end-of-sequence token. Returns the prompts
        with the new tokens appended; ``runner.last_generation`` holds the
        time to the first token and the tokens per second."""
        from .decoding import generate
        return generate(self, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                        do_sample=do_sample, temperature=temperature, top_k=top_k,
                        top_p=top_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                        seed=seed)

    def stream(self, input_ids, attention_mask=None, **options):
        """:meth:`generate`, one step at a time: ``for tokens in
        runner.stream(ids, max_new_tokens=32): ...`` yields each step's new
        token of every sequence, ``(batch,)``."""
        from .decoding import stream
        return stream(self, input_ids, attention_mask, **options)

    def _call_entry(self, k, name, *inputs):
        """Entry `k` of the program (prog.add_entry's `name`) on the current
        state: its outputs, gathered; not a step."""
        self._check_open(name)
        outputs = self._call(k, name, inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def _call(self, k, name, batch):
        """Entry `k` on `batch`, checked against what it was traced for (with
        local=True, this rank's boxes): its outputs."""
        shapes = self._t.local_shapes(k) if self._local else None
        batch = self._exe._check_inputs(tuple(batch), name, shapes=shapes, entry=k)
        return self._t.call(batch, self._local, k)

    @property
    def rank(self):
        """This process's rank under SPMD (``OMPI_COMM_WORLD_RANK``); 0 for
        a runner that drives its ranks from one process."""
        return self._t.rank

    @property
    def log(self):
        """What the ranks printed on stdout (``--verbose``'s lines), once the
        runner is closed; "" under SPMD, where the ranks print to the
        script's own stdout."""
        return getattr(self._t, "log", "")

    @property
    def errors(self):
        """What the ranks printed on stderr, once the runner is closed."""
        return getattr(self._t, "errors", "")

    @property
    def spmd(self):
        """Whether this process is one rank of an SPMD script."""
        return isinstance(self._t, _InProcess)

    def __call__(self, *inputs, **hyperparameters):
        name = self._exe.entry
        self._check_open(name)
        batch = self._exe._with_hyperparameters([tuple(inputs)], hyperparameters, name,
                                                one_call=True)[0]
        outputs = self._call(0, name, batch)
        self.steps += 1
        if self._bar is not None:
            # The step, its loss (the first output, when a number) and the
            # hyperparameters given; tqdm adds steps/s.
            shown = {k: f"{float(v[0] if isinstance(v, (list, tuple)) else v):.3g}"
                     for k, v in hyperparameters.items()}
            if outputs and outputs[0].numel() == 1:
                shown = {"loss": f"{outputs[0].item():.4f}", **shown}
            self._bar.bar.set_postfix(shown, refresh=False)
            self._bar.bar.update(1)
        return outputs[0] if len(outputs) == 1 else outputs

    def state_dict(self, *, optimizer=False, dtensor=False):
        """The global state by name, gathered, as ``model.state_dict()`` has
        it: parameters, persistent buffers, and each tied name
        (``lm_head.weight`` sharing ``transformer.wte.weight``: the same
        tensor), so the user's own model takes it with
        ``model.load_state_dict(runner.state_dict(), strict=True)``.
        ``optimizer=True``: the whole state a resume needs, with the
        optimizer's as ``optimizer.<param>.<key>`` (the names of
        ``exe.train``'s state) and the non-persistent buffers. Under SPMD
        every rank gets it.

        ``dtensor=True`` (SPMD only): the same names, each a torch DTensor
        of this rank's shard on torch's ``DeviceMesh`` of the program's
        mesh, over the job's gloo process group (made if the script has
        none; tdx.dtensor): what DCP's ``dcp.save``, ``full_tensor()`` and
        torchtitan's checkpointer take."""
        self._check_open("state_dict")
        if dtensor and not self.spmd:
            raise InputError("state_dict(dtensor=True) is for SPMD scripts (python3 -m tdx.run "
                             "or mpirun: every rank holds its shard); here state_dict() gives "
                             "the full tensors")
        state = self._exe._with_tied(self._t.state())
        if not optimizer:
            dropped = set(self._exe.non_persistent())
            state = {k: v for k, v in state.items()
                     if not k.startswith("optimizer.") and k not in dropped}
        if not dtensor:
            return state
        from . import dtensor as dt
        sig = self._exe.signature()
        if getattr(self, "_torch_mesh", None) is None:  # made once, its groups kept
            self._torch_mesh = dt.device_mesh(sig, self._t.rank, self._t._dir)
        return dt.to_dtensors(state, sig, self._exe.tied(), self._torch_mesh, self._t.rank)

    def load_state_dict(self, state_dict, strict=True):
        """Replaces the ranks' state with `state_dict`'s global tensors (each
        rank reads its shard). With ``strict=True`` every parameter and
        persistent buffer of the program must be given (``model.state_dict()``
        of the user's model is enough; its tied names must agree); optimizer
        state and non-persistent buffers that are not given are kept. Under SPMD every rank passes the same dict."""
        self._check_open("load_state_dict")
        want = {p["name"]: p for p in self._exe.signature()["params"]}
        # A tied name (as model.state_dict() has it) must hold what the name
        # it shares holds; it is not state of its own.
        state_dict = dict(state_dict)
        for name, owner in self._exe.tied().items():
            if name not in state_dict:
                continue
            value = state_dict.pop(name)
            if owner not in state_dict:
                state_dict[owner] = value
            elif value is not state_dict[owner] and not torch.equal(value, state_dict[owner]):
                raise InputError(f"load_state_dict: {name} is tied to {owner} (the same "
                                 f"tensor in this program), but the two values given differ")
        unknown = sorted(set(state_dict) - set(want))
        if unknown:
            raise InputError(f"load_state_dict: {', '.join(unknown)} "
                             f"{'is' if len(unknown) == 1 else 'are'} not state of this "
                             f"program; it has {', '.join(sorted(want))}")
        from .tools import required_state
        missing = sorted(n for n in required_state(self._exe.signature())
                         if n not in state_dict)
        if strict and missing:
            raise InputError(f"load_state_dict: {', '.join(missing)} "
                             f"{'is' if len(missing) == 1 else 'are'} missing (pass "
                             f"strict=False to keep the current values)")
        for name, t in state_dict.items():
            shape = tuple(want[name]["shape"])
            if tuple(t.shape) != shape:
                raise InputError(f"load_state_dict: {name} has shape {tuple(t.shape)}; the "
                                 f"program's is {shape}")
        self._t.load(dict(state_dict))

    def save(self, checkpoint, keep=2, *, format="tdx", config=None, max_shard_size=None):
        """A sharded, crash-safe checkpoint of the whole state (optimizer
        included) under the directory `checkpoint`, as step ``self.steps``:
        every rank writes its own shards (tdx.checkpoint's format), and
        ``exe.start(params=checkpoint)`` resumes from it on any layout, its
        steps counted on from the saved one and its random ops drawing on
        from the saved stream. Keeps the newest `keep` steps (0: all).

        ``format="dcp"``: a torch.distributed.checkpoint folder instead
        (``model.<name>``, ``optim.state.<param>.<key>``; tdx.dcp), which
        torch's ``dcp.load`` reads and ``exe.start(params=...)`` too; the
        gathered state is written by one process (rank 0 under SPMD).

        ``format="hf"``: a Hugging Face folder (tdx.hf): the model's state
        (no optimizer state) in ``model.safetensors``, or shards of at most
        `max_shard_size` bytes with their index, tied aliases left out as
        ``save_pretrained`` leaves them; with ``config=model.config`` also
        its ``config.json``, so ``from_pretrained(checkpoint)`` loads it."""
        self._check_open("save")
        if format not in ("tdx", "dcp", "hf"):
            raise ValueError(f"save: format is 'tdx', 'dcp' or 'hf', got {format!r}")
        if format != "hf" and (config is not None or max_shard_size is not None):
            raise ValueError("save: config= and max_shard_size= are for format='hf'")
        if format == "dcp":
            from . import dcp
            state = self.state_dict(optimizer=True)
            if self._t.rank == 0:
                dcp.write(os.fspath(checkpoint), state)
            return
        if format == "hf":
            from . import hf
            state = self.state_dict()
            if self._t.rank == 0:
                hf.write(os.fspath(checkpoint), state, self._exe.tied(), config=config,
                         max_shard_size=max_shard_size)
            return
        self._t.save(os.fspath(checkpoint), int(keep))

    def publish(self, store, key, *, keep=2):
        """Commits the parameters and buffers (no optimizer state) as the
        next version of `key` in the tensor store `store` (a path,
        ``ucx://HOST:PORT,...`` or a :class:`tdx.store.Store`); all but the
        newest ``keep`` versions are then dropped (0 keeps all). Each rank
        hands over its own shards (on a networked store, to its host's
        volume)."""
        self._check_open("publish")
        self._t.publish(os.fspath(getattr(store, "path", store)), key, int(keep))

    def load_weights(self, store, key, *, version=None):
        """Replaces the parameters and buffers with the newest version of
        `key` in `store` (a :class:`tdx.store.Store`, a path or
        ``ucx://...``), or `version`, each rank reading only its own boxes
        in this program's layout, whatever layout the writer had; the
        compiled program stays (a generator refreshed from a trainer's
        ``publish``). Every parameter and persistent buffer must be there
        with this program's shape; non-persistent buffers (a generation
        program's key/value cache) are kept. Returns ``{"version",
        "seconds", "bytes", "GB/s"}``: the bytes are those of the boxes the
        ranks read."""
        from . import store as _store
        from .tools import required_state
        self._check_open("load_weights")
        store = store if isinstance(store, _store.Store) else _store.Store(store)
        signature = self._exe.signature()
        held = store.tensors(key, version=version)
        params = {p["name"]: p for p in signature["params"]}
        names = required_state(signature)
        missing = [n for n in names if n not in held and n not in self._exe.tied()]
        if missing:
            raise InputError(f"load_weights: key '{key}' of {store.path} has no "
                             f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
                             f"({len(missing)} of the program's {len(names)} parameters and "
                             f"buffers): is it another model's?")
        wrong = [f"{n} is {list(held[n][0])} there, {params[n]['shape']} here"
                 for n in names if n in held and list(held[n][0]) != params[n]["shape"]]
        if wrong:
            raise InputError(f"load_weights: key '{key}' of {store.path} holds another "
                             f"shape: {'; '.join(wrong[:3])}")
        start = time.perf_counter()
        for attempt in range(8):
            v = version if version is not None else store.versions(key)[-1]
            try:
                self._t.load_path(f"{store._root(key)}/step-{int(v):08d}")
                break
            except TdxError:
                # Dropped by its writer meanwhile (a newer one committed):
                # the newest, again.
                if version is not None or store.versions(key)[-1] == v or attempt == 7:
                    raise
        seconds = time.perf_counter() - start
        moved = _box_bytes(signature, [n for n in names if n in held])
        return {"version": int(v), "seconds": seconds, "bytes": moved,
                "GB/s": moved / seconds / 1e9 if seconds > 0 else float("inf")}

    def close(self):
        """Ends the ranks (under SPMD: this rank's session; every rank
        closes). Idempotent."""
        shown = self._bar is not None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._t is not None and not self._t_closed:
            self._t_closed = True
            self._t.close()
            # The ranks' lines (every rank's under TDX_LOG=info; the run's
            # one line under a progress bar); under SPMD they printed them.
            log.echo(self.log)
            if shown:
                log.run_line(self.log)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self, what):
        if self._t is None or self._t.closed:
            raise TdxError(f"{what}: the runner is closed; start another with exe.start()")


class _Workers:
    """The single controller's ranks: the binary's --serve DIR
    (PipeRequests, lib/Runtime/Serve.cpp). Request k is a line "op<TAB>args..." on
    every rank's pipe, answered by a line on reply.fifo once every rank is
    done; its tensors are the files k.in.safetensors and k.out.safetensors."""

    rank = 0
    log = errors = ""

    def __init__(self, exe, *, params, seed, nprocs, threads, store, timeout, flags=(),
                 resume=None, deadline=None):
        self._timeout = timeout
        self._deadline = deadline
        self._k = 0
        self.closed = True
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
        args = ["--serve", self._dir] + list(flags)
        if resume is not None:
            args += ["--resume", resume]
        else:
            args += ["--seed", str(seed)] + exe._params_args(params, self._dir)
        args += exe._store_args(store) + exe._threads_args(threads)
        self._stderr_path = os.path.join(self._dir, "stderr")
        self._proc = exe._start(nprocs, args, self._dir, self._stderr_path)
        self.closed = False
        # The ranks have made or read their state once this is answered,
        # with the step they start from (a runner's checkpoint's, or 0).
        self.steps = int(self._request("ready").split("\t")[1])

    def call(self, batch, local=False, entry=0):
        path = self._file(self._k + 1, ".in.safetensors")
        safetensors.save({f"input:{i}": x for i, x in enumerate(batch)}, path)
        try:
            self._request("call", path, str(entry))
            out_path = self._file(self._k, ".out.safetensors")
            got = safetensors.load(out_path)
            os.remove(out_path)
        finally:
            _discard(path)
        return tuple(got[f"output:{i}"] for i in range(len(got)))

    def state(self):
        path = os.path.join(self._dir, "state.safetensors")
        self._request("state", path)
        try:
            return safetensors.load(path)
        finally:
            _discard(path)

    def load(self, state_dict):
        path = os.path.join(self._dir, "load.safetensors")
        safetensors.save(state_dict, path)
        try:
            self._request("load", path)
        finally:
            _discard(path)

    def load_path(self, path):
        self._request("load", path)

    def save(self, checkpoint, keep):
        self._request("save", checkpoint, str(keep))

    def publish(self, store, key, keep):
        self._request("publish", store, key, str(keep))

    def close(self):
        if self.closed:
            return
        try:
            self._request("close")
            self._proc.wait(timeout=60)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            if not self.closed:
                self._end()

    def __del__(self):
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
        if hasattr(self, "_pipes"):
            self._end()

    def _file(self, k, suffix):
        return os.path.join(self._dir, f"{k}{suffix}")

    def _request(self, op, *args):
        if any("\t" in a or "\n" in a for a in args):
            raise ValueError(f"{op}: a path with a tab or newline cannot be sent to the ranks")
        self._k += 1
        line = ("\t".join((op,) + args) + "\n").encode()
        for fd in self._pipes[:-1]:
            os.write(fd, line)
        deadline = time.monotonic() + self._timeout
        if self._deadline is not None:
            deadline = min(deadline, self._deadline)
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
                if self._deadline is not None:
                    raise TdxError(f"the model's ranks did not finish in the {self._timeout} s "
                                   f"given (timeout=); they were ended during {op}")
                raise TdxError(f"the runner's {op} did not finish in {self._timeout} s; its "
                               f"ranks were ended")
        answer, self._replies = self._replies.split(b"\n", 1)
        return answer.decode()

    def _end(self):
        self.closed = True
        # What the ranks printed, kept before their directory goes.
        for attr, name in (("log", "stdout"), ("errors", "stderr")):
            try:
                with open(os.path.join(self._dir, name)) as f:
                    setattr(self, attr, f.read())
            except OSError:
                pass
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


class _InProcess:
    """This process as one rank of an SPMD script: the program's shared
    object (tdx-compile --shared) loaded here, driven through its C ABI
    (lib/Runtime/Library.cpp). A failure inside a step ends every rank
    with that rank's message (mpirun reports it), as the binary's ranks do."""

    def __init__(self, exe, *, params, seed, nprocs, threads, store, timeout):
        self.closed = True
        world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
        if world != exe.world_size:
            raise TdxError(f"this script runs on {world} process(es) (mpirun -np {world}) but "
                           f"the program is for {exe.world_size}; run it with mpirun -np "
                           f"{exe.world_size} (or python3 -m tdx.run -n {exe.world_size})")
        self._exe = exe
        self._lib = _load(exe.library())
        self.rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        # A state dict given is written by each rank to a file of its own.
        self._own = tempfile.mkdtemp(prefix="tdx-rank-", dir=shm)
        args = ["tdx", "--seed", str(seed), "--collective-timeout", str(timeout)]
        args += exe._params_args(params, self._own) + exe._store_args(store)
        args += exe._threads_args(threads)
        argv = (ctypes.c_char_p * len(args))(*[a.encode() for a in args])
        self._h = self._lib.tdx_open(len(args), argv)
        if not self._h:
            raise TdxError(f"the runner could not start: {self._lib.tdx_error().decode()}")
        self.closed = False
        name = ctypes.create_string_buffer(4096)
        self._check(self._lib.tdx_shared_dir(self._h, shm.encode(), name, len(name)), "start")
        self._dir = name.value.decode()
        self.steps = int(self._lib.tdx_steps(self._h))
        sig = exe.signature()
        # Each entry's inputs and outputs: 0 the main one.
        self._inputs = [sig["inputs"]] + [e["inputs"] for e in sig.get("entries", [])]
        self._outputs = [[(tuple(o["shape"]), _TORCH_DTYPES[o["dtype"]]) for o in outputs]
                         for outputs in [sig["outputs"]] +
                         [e["outputs"] for e in sig.get("entries", [])]]

    def local_shapes(self, entry):
        """Each input's box on this rank, as the caller gives it (a step
        with gradient accumulation's micro-batches concatenated)."""
        shapes = []
        data = len(self._inputs[0]) - self._exe._hyperparameter_inputs()
        for i, spec in enumerate(self._inputs[entry]):
            n = len(spec["shape"])
            offset, size = (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)()
            self._lib.tdx_input_box(self._h, entry, i, offset, size)
            size = list(size)
            if entry == 0 and self._exe.accumulation_steps > 1 and i < data:
                size = [size[0] * size[1]] + size[2:]
            shapes.append(size)
        return shapes

    def call(self, batch, local=False, entry=0):
        keep = [x.contiguous() for x in batch]
        pointers = (ctypes.c_void_p * len(keep))(*[x.data_ptr() for x in keep])
        self._check(self._lib.tdx_call(self._h, entry, pointers, len(keep), int(local)),
                    "call")
        out = []
        for i, (shape, dtype) in enumerate(self._outputs[entry]):
            t = torch.empty(shape, dtype=dtype)
            self._lib.tdx_output(self._h, i, ctypes.c_void_p(t.data_ptr()))
            out.append(t)
        return tuple(out)

    def state(self):
        path = os.path.join(self._dir, "state.safetensors")
        self._check(self._lib.tdx_write_state(self._h, path.encode()), "state_dict")
        self._check(self._lib.tdx_barrier(self._h), "state_dict")
        got = safetensors.load(path)
        self._check(self._lib.tdx_barrier(self._h), "state_dict")
        if self.rank == 0:
            _discard(path)
        return got

    def load(self, state_dict):
        path = os.path.join(self._own, "load.safetensors")
        safetensors.save(state_dict, path)
        try:
            self._check(self._lib.tdx_load(self._h, path.encode()), "load_state_dict")
        finally:
            _discard(path)

    def load_path(self, path):
        self._check(self._lib.tdx_load(self._h, path.encode()), "load_weights")

    def save(self, checkpoint, keep):
        self._check(self._lib.tdx_save(self._h, checkpoint.encode(), keep), "save")

    def publish(self, store, key, keep):
        self._check(self._lib.tdx_publish(self._h, store.encode(), key.encode(), keep), "publish")

    def close(self):
        if self.closed:
            return
        self.closed = True
        self._lib.tdx_close(self._h)
        self._h = None
        shutil.rmtree(self._own, ignore_errors=True)
        if self.rank == 0:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _check(self, rc, what):
        if rc != 0:
            raise TdxError(f"{what}: {self._lib.tdx_error().decode()}")


_LIBRARIES = {}


def _load(path):
    """The program's shared object, loaded once per process, with Open MPI
    loaded globally first (its components look up its symbols)."""
    if path not in _LIBRARIES:
        if not _LIBRARIES:
            from ._mpi_base import load_mpi_globally
            load_mpi_globally()
        lib = ctypes.CDLL(path)
        lib.tdx_open.restype = ctypes.c_void_p
        lib.tdx_open.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.tdx_error.restype = ctypes.c_char_p
        lib.tdx_steps.restype = ctypes.c_longlong
        handle = ctypes.c_void_p
        lib.tdx_steps.argtypes = [handle]
        lib.tdx_input_box.argtypes = [handle, ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_int64),
                                      ctypes.POINTER(ctypes.c_int64)]
        lib.tdx_call.argtypes = [handle, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.c_int, ctypes.c_int]
        lib.tdx_output.argtypes = [handle, ctypes.c_int, ctypes.c_void_p]
        lib.tdx_write_state.argtypes = [handle, ctypes.c_char_p]
        lib.tdx_load.argtypes = [handle, ctypes.c_char_p]
        lib.tdx_save.argtypes = [handle, ctypes.c_char_p, ctypes.c_int]
        lib.tdx_publish.argtypes = [handle, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
        lib.tdx_barrier.argtypes = [handle]
        lib.tdx_shared_dir.argtypes = [handle, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
        lib.tdx_close.argtypes = [handle]
        _LIBRARIES[path] = lib
    return _LIBRARIES[path]


def _discard(path):
    """Removes a request's file, if the runner has not already (an ended
    runner's directory is gone)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _box_bytes(signature, names):
    """The bytes of the boxes of `names` that every rank holds, summed over
    the ranks (a replicated tensor once per rank)."""
    import itertools
    import math

    from . import _C
    mesh = signature.get("mesh") or []
    params = {p["name"]: p for p in signature["params"]}
    total = 0
    for name in names:
        p = params[name]
        item = torch.empty((), dtype=_TORCH_DTYPES[p["dtype"]]).element_size() \
            if p["dtype"] in _TORCH_DTYPES else 4
        for coords in itertools.product(*(range(n) for n in mesh)) if mesh else [()]:
            _, size = _C.box_of(list(mesh), list(coords), p["shape"], p["layout"]) if mesh \
                else (None, p["shape"])
            total += math.prod(size) * item
    return total
