"""Compiled model binaries: `tdx.compile(prog)` and `Executable.run`."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings

import torch

from . import _C, safetensors
from .checkpoint import latest as latest_checkpoint
from .errors import InputError, TdxError, TdxWarning
from . import log
from .log import _progress_bar
from .tools import _TORCH_DTYPES, _tool, tool_env

def _describe(spec):
    """An input of a --signature, as the errors name it."""
    return f"{_TORCH_DTYPES[spec['dtype']]} of shape {tuple(spec['shape'])}"


def _plain_safetensors(path):
    """The safetensors files of `path` (a file, or a folder of them, as
    save_pretrained writes); [] for a tdx checkpoint (it has every state)."""
    if os.path.isfile(path):
        return [os.fspath(path)]
    if os.path.exists(os.path.join(path, "LATEST")) or \
            os.path.exists(os.path.join(path, "tdx.index.json")):
        return []
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))


class Executable:
    """A model binary for one mesh; runs under mpirun, one rank per device
    (CPU processes, or GPUs for target="cuda")."""

    def __init__(self, path, world_size, target="cpu", memory_plan=None, hyperparameters=None,
                 entry="forward", accumulation_steps=1):
        self.path = path
        # A step with gradient accumulation (trace_train_step's
        # accumulation_steps=k) takes its batch inputs as k micro-batches
        # concatenated along dim 0; the program's inputs stack them.
        self.accumulation_steps = accumulation_steps
        # The program's function: "forward", or "train_step" for a step
        # traced by tdx.trace_train_step (a runner's method of that name).
        self.entry = entry
        # A training step's hyperparameter inputs: name -> default (the
        # traced value), the step's last inputs in this order.
        self.hyperparameters = dict(hyperparameters or {})
        self.world_size = world_size
        self.target = target
        # Per rank, from the compiler: {"working": the most bytes of the
        # step's tensors alive at once, "arena": the bytes of the arena the
        # tensors it makes and drops are placed in, "tensors": how many};
        # None for a binary loaded from a file.
        self.memory_plan = memory_plan

    def signature(self):
        """What the binary says of its program (``--signature``, no mpirun):
        ``{"mesh": [...], "axes": [...], "params": [...], "inputs": [...],
        "outputs": [...]}``, each parameter, input and output with its
        global ``shape``, ``dtype`` (safetensors name: ``"F32"``, ...) and
        ``layout``."""
        if getattr(self, "_signature", None) is None:
            done = subprocess.run([self.path, "--signature"], capture_output=True, text=True,
                                  timeout=60)
            if done.returncode != 0:
                raise TdxError(f"{self.path} --signature failed (exit {done.returncode}): "
                               f"{done.stderr.strip()}; rebuild it with tdx.compile")
            self._signature = json.loads(done.stdout)
        return self._signature

    def tied(self):
        """The tied names of the program's state: ``{name: the parameter or
        buffer it shares}`` (a tied ``lm_head.weight``), from its
        signature."""
        return dict(self.signature().get("tied", {}))

    def non_persistent(self):
        """The buffers registered with ``persistent=False``: state of the
        program, not of ``model.state_dict()``."""
        return list(self.signature().get("non_persistent", []))

    def _with_tied(self, state):
        """`state` with each tied name beside the one it shares (the same
        tensor), as ``model.state_dict()`` has it."""
        for name, owner in self.tied().items():
            if owner in state:
                state[name] = state[owner]
        return state

    def _given_inputs(self):
        """The program's inputs as a caller gives them (its --signature's,
        a step with gradient accumulation's batch inputs with their k
        micro-batches concatenated), and how many are batch inputs (the
        hyperparameters come after them)."""
        specs = self.signature()["inputs"]
        data = len(specs) - self._hyperparameter_inputs()
        if self.accumulation_steps > 1:
            specs = [dict(s, shape=[s["shape"][0] * s["shape"][1]] + s["shape"][2:])
                     if i < data else s for i, s in enumerate(specs)]
        return specs, data

    @property
    def entries(self):
        """The names of the program's other entries (``prog.add_entry``),
        which a runner has as methods."""
        return [e["name"] for e in self.signature().get("entries", [])]

    def _check_inputs(self, inputs, what, shapes=None, entry=0):
        """`inputs` as entry `entry` (0: the main one) takes them; raises
        InputError unless they are what it was traced for: as many, each a
        tensor of the traced shape (or of `shapes`, a rank's boxes) and
        dtype. A step with gradient accumulation takes each batch input as
        its micro-batches concatenated, and gets them stacked."""
        if entry:
            k, want = 1, self.signature()["entries"][entry - 1]["inputs"]
            data = len(want)
        else:
            k = self.accumulation_steps
            want, data = self._given_inputs()
        if shapes is not None:
            want = [dict(w, shape=list(s)) for w, s in zip(want, shapes)]
        if len(inputs) != len(want):
            raise InputError(
                f"{what} has {len(inputs)} input(s) but {'the program' if not entry else what} "
                f"takes {len(want)}: "
                + ", ".join(f"input {i}: {_describe(w)}" for i, w in enumerate(want)))
        for i, (x, spec) in enumerate(zip(inputs, want)):
            expected = _describe(spec)
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                raise InputError(f"{what}: input {i} is a {type(x).__name__}; the program takes "
                                 f"a tensor, {expected}")
            if tuple(x.shape) != tuple(spec["shape"]) or x.dtype != _TORCH_DTYPES[spec["dtype"]]:
                raise InputError(f"{what}: input {i} is {x.dtype} of shape {tuple(x.shape)}; the "
                                 f"program was traced for {expected} (trace it again for other "
                                 f"shapes or dtypes)")
        if k == 1:
            return tuple(inputs)
        return tuple(x.reshape(k, x.shape[0] // k, *x.shape[1:]) if i < data else x
                     for i, x in enumerate(inputs))

    def _mpirun(self, nprocs, args, session):
        """The mpirun command line and environment of a run on `nprocs`."""
        nprocs = self.world_size if nprocs is None else nprocs
        if nprocs != self.world_size:
            raise TdxError(f"the program runs on {self.world_size} process(es) (its mesh's devices, "
                           f"less folded axes) but nprocs={nprocs}; run with "
                           f"nprocs={self.world_size} or parallelize on another mesh")
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(nprocs),
               self.path] + args
        # A session directory of its own (unless the caller chose one): two
        # mpiruns starting at once race to create Open MPI's shared one.
        env = dict(os.environ)
        env.setdefault("OMPI_MCA_orte_tmpdir_base", session)
        return cmd, env

    def _start(self, nprocs, args, workdir, stderr_path):
        """Starts the ranks in the background (a runner's); their output
        goes to files in `workdir`."""
        session = os.path.join(workdir, "mpi")
        os.makedirs(session)
        cmd, env = self._mpirun(nprocs, args, session)
        log.debug("starting the ranks: " + " ".join(cmd))
        with open(os.path.join(workdir, "stdout"), "w") as out, open(stderr_path, "w") as err:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=env)

    def start(self, params=None, seed=0, nprocs=None, threads=None, *, store=None,
              timeout=600, progress=False, local=False):
        """Starts the program's ranks once and returns a :class:`tdx.Runner`
        that holds their state between calls: ``runner.train_step(x, y,
        lr=...)`` from your own loop, ``runner.state_dict()``,
        ``runner.save(dir)``, ``runner.close()`` (or a ``with`` block).

        `params` is as for :meth:`run` (a state dict, a file, a directory, a
        tdx checkpoint to resume from, a torch.distributed.checkpoint (DCP)
        folder, or ``"store:KEY"``); without it the
        ranks make their state from the init programs with `seed`. A call
        that does not answer in `timeout` seconds ends the ranks.
        ``progress=True`` shows a progress bar (step, loss, steps/s) when
        stderr is a terminal.

        In a script run under mpirun (``mpirun -np N python3 train.py`` or
        ``python3 -m tdx.run -n N train.py``) every process is one rank:
        ``start()`` loads the program into the process (:meth:`library`)
        and binds to the MPI world, whose size must be the program's. Each
        rank then passes the global batch and takes its box, or, with
        ``local=True``, passes its own box (DistributedSampler style).

        A CUDA program (``target="cuda"``) runs the same way: its state
        stays on each rank's GPU between calls, a call's batch goes to the
        device once and its outputs come back; ranks that share a GPU
        communicate through host memory."""
        from .runner import Runner
        return Runner(self, params=params, seed=seed, nprocs=nprocs, threads=threads,
                      store=store, timeout=timeout, progress=progress, local=local)

    def library(self):
        """The program as a shared object (``tdx-compile --shared``), which
        an SPMD runner loads into its process: built on first use next to
        the binary. It links the object the binary's compile left in the
        compile cache, so the program's C++ compiles once for both (and once
        for N ranks asking at once)."""
        path = self.path + ".so"
        if os.path.exists(path):
            return path
        source = getattr(self, "_source", None)
        if not source or not os.path.exists(source):
            raise TdxError(f"{self.path} has no program source to build its shared object "
                           f"from; compile the program with tdx.compile in this script")
        extra = ["--shared", f"--opt-level={getattr(self, '_opt_level', 2)}",
                 "--target", self.target]
        if self.target == "cuda":
            extra.append(f"--cuda-arch={getattr(self, '_cuda_arch', 'sm_90')}")
        done = _run_compile(source, path, extra)
        self.library_from_cache = "from the compile cache" in done.stdout
        return path

    def needs_params(self):
        """State whose init program is not pointwise in the global index
        (a complex RoPE table made with torch.polar, say), so no rank can
        make its shard alone: from its signature. When not given, such a
        non-persistent buffer is computed from the traced model's recorded
        ops (:meth:`_derived`); anything else must be given."""
        return list(self.signature().get("needs_params", []))

    def _derived(self, given):
        """The values of needs_params()'s non-persistent buffers missing from
        `given`, each replayed through ATen from the ops it depends on in
        the traced model's recording (no parameter is materialized)."""
        from .errors import InputError
        missing = [n for n in self.needs_params() if n not in given]
        if not missing:
            return {}
        state = {}
        if self._model is not None:
            state = dict(self._model.named_parameters(remove_duplicate=False))
            state.update(self._model.named_buffers(remove_duplicate=False))
        out, transient = {}, set(self.non_persistent())
        for name in missing:
            t = state.get(name)
            recording = _C.recording_of(t) if t is not None and name in transient else None
            if recording is None:
                raise InputError(f"{name}'s init program cannot be made shard by shard and it "
                                 f"is not given: pass it in params= (a state dict or "
                                 f"checkpoint that has it)")
            try:
                out[name] = recording.materialize_ancestors([t])[0]
            except TdxError as e:
                raise InputError(f"{name} is not given and cannot be made shard by shard ({e});"
                                 f" pass it in params=") from None
        return out

    def _params_args(self, params, tmp):
        # The tensor store's key, or a checkpoint on a networked store's
        # volumes: the ranks read it.
        if isinstance(params, str) and params.startswith(("store:", "ucx://")):
            return ["--params", params]
        if isinstance(params, (str, os.PathLike)):
            if not os.path.exists(params):
                raise FileNotFoundError(f"params: no such file or directory: {params}")
            from . import dcp, hf
            if hf.is_hf(params):
                hf.check(params, self.signature(), self.tied())
            if not dcp.is_dcp(params):
                files = _plain_safetensors(params)
                derived = self._derived(hf.headers(files)) if files and self.needs_params() \
                    else {}
                if not derived:
                    return ["--params", os.fspath(params)]
                # The given files and the derived ones, in a folder of links.
                folder = os.path.join(tmp, "params")
                os.makedirs(folder)
                for f in files:
                    os.symlink(os.path.abspath(f), os.path.join(folder, os.path.basename(f)))
                safetensors.save(derived, os.path.join(folder, "tdx-derived.safetensors"))
                return ["--params", folder]
            params = dcp.read(params, self.signature())
        params = dict(params or {})
        params.update(self._derived(params))
        if not params:
            return []
        path = os.path.join(tmp, "params.safetensors")
        safetensors.save(params, path)
        return ["--params", path]

    @staticmethod
    def _threads_args(threads):
        if threads is None:
            return []
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int (ATen threads per rank), got "
                             f"{threads!r}")
        return ["--threads", str(threads)]

    @staticmethod
    def _store_args(store):
        return [] if store is None else ["--store", os.fspath(getattr(store, "path", store))]

    def run(self, *inputs, nprocs=None, params=None, seed=0, verbose=False, steps=1,
            timeout=300, profile=False, store=None, threads=None, overlap=True):
        """Runs one forward step; returns the gathered global outputs.

        `params` is a state dict (e.g. an eager model's), a safetensors file,
        a directory of them, a tdx checkpoint, or ``"store:KEY"`` (the newest
        version of KEY in the tensor store `store`, a path or
        :class:`tdx.store.Store`); each rank reads only its shard of each
        parameter. Without it, every rank makes its own shards from the init
        programs with `seed`. `self.last_log` holds the run's line (ranks,
        init, step time, bytes communicated); `verbose` (or TDX_LOG=info)
        adds every rank's init, reads and memory, `profile` where rank 0's
        step time went. `threads` is the
        ATen threads of each rank (default: the binary's, see its --help).
        ``overlap=False`` waits for every all_reduce and reduce_scatter where
        it starts (``--no-overlap``: what overlap hides, measured)."""
        inputs = self._check_inputs(inputs, "run")
        with self._served(nprocs, params, seed, store, threads, timeout, verbose, profile,
                          overlap) as runner:
            for _ in range(steps):
                out = runner._t.call(inputs)
        self._finished(runner)
        return out

    def _served(self, nprocs, params, seed, store, threads, timeout, verbose=False,
                profile=False, overlap=True, resume=None):
        """The ranks of one exe.run / exe.train / exe.materialize ...: a
        single controller's :class:`tdx.Runner` (never this process as a
        rank, even under mpirun) whose requests all end within `timeout`
        seconds of now; ``resume``: a checkpoint to go on from."""
        from .runner import Runner
        flags = (["--verbose"] if verbose else []) + (["--profile"] if profile else [])
        flags += [] if overlap else ["--no-overlap"]
        return Runner(self, params=params, seed=seed,
                      nprocs=self.world_size if nprocs is None else nprocs, threads=threads,
                      store=store, timeout=timeout, _flags=flags, _resume=resume,
                      _deadline=time.monotonic() + timeout)

    def _finished(self, runner):
        """What the closed `runner`'s ranks printed: their stdout as
        ``self.last_log`` (--verbose's timing lines), and each "tdx: " line
        of their stderr (a --params file that lacks a parameter) as a
        warning."""
        self.last_log = runner.log
        for line in runner.errors.splitlines():
            if line.startswith("tdx: "):
                warnings.warn(line[len("tdx: "):], TdxWarning, stacklevel=3)

    def _hyperparameter_inputs(self):
        """How many inputs the hyperparameters take: one per name, or one per
        name and param group when the optimizer has several."""
        return sum(len(v) if isinstance(v, (list, tuple)) else 1
                   for v in self.hyperparameters.values())

    def _with_hyperparameters(self, batches, given, what="train", one_call=False):
        """Each batch with the step's hyperparameter inputs appended: a value
        given for every step (a number) or per step (a list), else the
        traced one. A step traced with several param groups takes one value
        per group: a number (every group) or a list of one per group; per
        step in ``exe.train``, a list of those. ``one_call`` (a runner's
        call): a list is the groups' values, as ``sched.get_last_lr()``
        gives them."""
        unknown = sorted(set(given) - set(self.hyperparameters))
        if unknown:
            accepted = ", ".join(self.hyperparameters) or "none (trace_train_step(..., "\
                "hyperparameters=(...)) makes some)"
            raise InputError(f"{what}: {', '.join(unknown)} is not a hyperparameter of this "
                             f"step; it takes {accepted}")
        if self.hyperparameters:
            # The batch's own inputs, counted without the keywords.
            specs, data = self._given_inputs()
            for k, batch in enumerate(batches):
                if len(batch) != data:
                    where = what if len(batches) == 1 else f"{what}: batch {k}"
                    raise InputError(
                        f"{where} has {len(batch)} input(s) but the step takes {data} "
                        f"(and {', '.join(self.hyperparameters)} by keyword): "
                        + ", ".join(f"input {i}: {_describe(w)}"
                                    for i, w in enumerate(specs[:data])))
        per_step = {}
        for name, default in self.hyperparameters.items():
            groups = len(default) if isinstance(default, (list, tuple)) else None
            value = given.get(name, default)
            if name not in given or (one_call and groups):
                values = [value] * len(batches)
            else:
                values = list(value) if isinstance(value, (list, tuple)) else \
                    [value] * len(batches)
            if len(values) != len(batches):
                raise InputError(f"{what}: {name} has {len(values)} values for {len(batches)} "
                                 f"batches; give one per batch, or one number for all")
            if groups:
                for k, v in enumerate(values):
                    v = list(v) if isinstance(v, (list, tuple)) else [v] * groups
                    if len(v) != groups:
                        raise InputError(f"{what}: {name} has {len(v)} values; the optimizer "
                                         f"has {groups} param groups: give one number for all, "
                                         f"or one per group")
                    values[k] = v
            else:
                values = [[v] for v in values]
            per_step[name] = values
        return [tuple(batch) + tuple(torch.tensor(float(v), dtype=torch.float64)
                                     for n in self.hyperparameters for v in per_step[n][k])
                for k, batch in enumerate(batches)]

    def train(self, batches, *, nprocs=None, params=None, seed=0, verbose=False, timeout=600,
              checkpoint=None, save_every=None, keep=2, resume=False, store=None, publish=None,
              publish_every=None, threads=None, profile=False, overlap=True, progress=None,
              **hyperparameters):
        """Runs a training step's program (``tdx.trace_train_step``) once per
        batch; returns ``(losses, state)``: the loss of every step run (a
        list of floats) and the final global state by name, parameters as in
        ``model.state_dict()`` and optimizer state as
        ``optimizer.<param name>.<key>``.

        ``batches`` is a list of batches, each a tuple of global tensors in
        the order the step takes them. ``params`` is as for :meth:`run`.

        ``checkpoint`` is a directory: the ranks save their shards there
        (tdx.checkpoint's format) every ``save_every`` steps and after the
        last, keeping the newest ``keep`` (0: all). With ``resume=True`` a
        run continues from the checkpoint's latest step, whatever mesh and
        layout saved it (step k still takes ``batches[k]``), or starts
        afresh when there is none yet; ``losses`` then holds the steps run,
        and ``self.first_step`` says where they began.

        ``profile=True`` prints where rank 0's steps went and
        ``overlap=False`` waits for each collective where it starts, as for
        :meth:`run`.

        ``publish="KEY"`` commits the parameters (no optimizer state) as the
        next version of KEY in the tensor store ``store`` every
        ``publish_every`` steps and after the last.

        ``progress`` (default: when stderr is a terminal) shows a tqdm bar
        with the step, its loss and steps/s.

        The run is a loop over :meth:`start`'s runner: the ranks start once,
        each batch is one call, and ``timeout`` (seconds) bounds the whole
        run, after which the ranks are ended.

        A step traced with ``hyperparameters=("lr", ...)`` takes each by
        keyword: one number for every step or a list with one per batch
        (``lr=[sched.get_last_lr()[0] ...]``); one not given is its traced
        value. The binary is the same for every value."""
        batches = [tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in batches]
        if not batches:
            raise ValueError("train needs at least one batch")
        if (save_every is not None or resume) and checkpoint is None:
            raise ValueError("save_every and resume need checkpoint=<directory>")
        if resume and params is not None:
            raise ValueError("resume=True reads the state from the checkpoint; drop params")
        batches = self._with_hyperparameters(batches, hyperparameters)
        batches = [self._check_inputs(batch, f"batch {k}") for k, batch in enumerate(batches)]
        resume = os.fspath(checkpoint) if resume and _C.is_checkpoint(os.fspath(checkpoint)) \
            else None
        last = len(batches)
        losses = []
        with self._served(nprocs, params, seed, store, threads, timeout, verbose, profile,
                          overlap, resume) as runner:
            self.first_step = runner.steps
            bar = _progress_bar(progress, "train", last, self.first_step)
            try:
                for k in range(self.first_step, last):
                    out = runner._t.call(batches[k])
                    losses.append(float(out[0]))
                    if bar is not None:
                        bar.step(losses[-1])
                    if checkpoint is not None and (k + 1 == last or
                                                   (save_every and (k + 1) % save_every == 0)):
                        runner._t.save(os.fspath(checkpoint), int(keep))
                    if publish and (k + 1 == last or
                                    (publish_every and (k + 1) % publish_every == 0)):
                        runner.publish(store, publish)
            finally:
                if bar is not None:
                    bar.close()
            final = self._with_tied(runner._t.state())
        if bar is not None:
            log.run_line(runner.log)
        self._finished(runner)
        return losses, final

    def save_init(self, checkpoint, *, nprocs=None, params=None, seed=0, keep=2, timeout=300):
        """Makes the state as :meth:`run` would (each rank its own shards,
        from the init programs with ``seed`` or from ``params``) and saves it
        as step 0 of the checkpoint directory ``checkpoint``: no rank ever
        holds a global tensor. Returns the step directory."""
        with self._served(nprocs, params, seed, None, None, timeout) as runner:
            runner.save(checkpoint, keep)
        self._finished(runner)
        return latest_checkpoint(checkpoint)

    def publish(self, store, key, *, nprocs=None, params=None, seed=0, timeout=300):
        """Makes the state as :meth:`run` would and commits its parameters as
        the next version of ``key`` in the tensor store ``store`` (a path or
        :class:`tdx.store.Store`), each rank writing its own shards."""
        with self._served(nprocs, params, seed, store, None, timeout) as runner:
            runner.publish(store, key)
        self._finished(runner)

    def last_step_ms(self):
        """The step time (ms) of the last ``run``, from the binary's line
        "tdx: N ranks: init A ms, step B ms, C bytes ..."."""
        found = re.search(r"ranks: init [\d.]+ ms, step ([\d.]+) ms", getattr(self, "last_log", ""))
        if not found:
            raise TdxError("no step time: run the binary (exe.run) first")
        return float(found.group(1))

    def materialize(self, nprocs=None, seed=0, timeout=300, params=None, store=None):
        """The gathered global parameters after sharded init (or after each
        rank read its shards of ``params``, as for :meth:`run`), by
        qualified name."""
        with self._served(nprocs, params, seed, store, None, timeout) as runner:
            state = runner._t.state()
        self._finished(runner)
        return state

    def save(self, path):
        shutil.copyfile(self.path, path)
        os.chmod(path, 0o755)

    @classmethod
    def load(cls, path, world_size, target="cpu", *, entry="forward", accumulation_steps=1):
        """A saved model binary. The binary holds the program, not what the
        Python `Program` knew of it: give ``entry`` (the step's name, e.g.
        ``"train_step"``, which the runner calls it by) and
        ``accumulation_steps`` as the program was traced with (default: a
        ``forward`` without accumulation), and pass hyperparameters as the
        step's last inputs (0-D float64 tensors), as docs/training.md says."""
        if not os.path.exists(path):
            raise TdxError(f"no model binary at {path}")
        return cls(os.path.abspath(path), world_size, target, entry=entry,
                   accumulation_steps=accumulation_steps)


def compile(prog, target="cpu", output=None, cuda_arch="sm_90", keep_source=False,
            progress=None, opt_level=None):
    """Compiles a (parallelized) program into a model binary.

    target="cpu" links the CPU runtime (ATen + MPI); target="cuda" emits CUDA
    (cuBLAS, NCCL, fused kernels) and compiles it with nvcc for `cuda_arch`.
    `keep_source` keeps the emitted source next to the binary. `progress`
    (default: when stderr is a terminal) shows a tqdm bar over tdx-compile's
    stages (placing and partitioning, emitting, compiling), or that the
    compile cache served the binary; ``exe.from_cache`` says so too.
    `opt_level` is the C++ compiler's (0 to 3; default: $TDX_OPT_LEVEL,
    else 2): 0 compiles in a third to half of 2's time (both have a
    precompiled runtime header) and runs its fused kernels slower, for
    binaries that run little (the test suite compiles at 0)."""
    _check_target(target)
    from . import collectives, regions
    prog = collectives.lowered(prog)
    regions.check(prog)
    if opt_level is None:
        opt_level = os.environ.get("TDX_OPT_LEVEL", "2")
        if opt_level not in ("0", "1", "2", "3"):
            raise ValueError(f"TDX_OPT_LEVEL must be 0, 1, 2 or 3, not {opt_level!r}")
        opt_level = int(opt_level)
    if opt_level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level must be 0, 1, 2 or 3, not {opt_level!r}")
    text = prog.mlir
    out_dir = tempfile.mkdtemp(prefix="tdx-")
    src = os.path.join(out_dir, "model.mlir")
    with open(src, "w") as f:
        f.write(text)
    binary = output or os.path.join(out_dir, "model")
    extra = ["--target", target, "--memory-report", f"--opt-level={opt_level}"]
    if target == "cuda":
        extra.append(f"--cuda-arch={cuda_arch}")
    if keep_source:
        extra.append("--emit-source")
    bar = _progress_bar(progress, "compile", 3, unit="stage")
    try:
        done = _run_compile(src, binary, extra + (["--progress"] if bar else []),
                            None if bar is None else bar.stage_line)
        if bar is not None:
            bar.bar.update(3 - bar.bar.n)
    finally:
        if bar is not None:
            bar.close()
    plan = re.search(r"working memory of a step (\d+) bytes, arena (\d+) bytes for (\d+) tensors",
                     done.stdout)
    memory_plan = plan and dict(zip(("working", "arena", "tensors"), map(int, plan.groups())))
    exe = Executable(os.path.abspath(binary), prog.world_size, target, memory_plan,
                     getattr(prog, "hyperparameters", {}), prog._module.entry(),
                     getattr(prog, "accumulation_steps", 1))
    exe._source = src
    exe._model = getattr(prog, "_model", None)  # makes what needs_params() names
    exe.generation = getattr(prog, "generation", None)  # trace_generate's spec
    exe._opt_level = opt_level  # the shared object links the same object
    exe._cuda_arch = cuda_arch
    # Whether the compile cache served the binary (tdx-compile says so).
    exe.from_cache = "from the compile cache" in done.stdout
    return exe


def _check_target(target):
    if target not in ("cpu", "cuda"):
        raise TdxError(f"target '{target}' is not supported; use target='cpu' or 'cuda'")


def _check(text, target):
    """tdx-compile --check on the program text `text`."""
    _check_target(target)
    with tempfile.TemporaryDirectory(prefix="tdx-") as tmp:
        src = os.path.join(tmp, "model.mlir")
        with open(src, "w") as f:
            f.write(text)
        done = subprocess.run([_tool("tdx-compile"), src, "--check", "--target", target],
                              capture_output=True, text=True, env=tool_env())
    if done.returncode != 0:
        raise TdxError(f"tdx-compile --check failed:\n{done.stderr.strip()}")


def _run_compile(source, output, extra, on_line=None):
    """tdx-compile `source` to `output`; raises TdxError with its message.
    `on_line` sees each line of its output as it comes."""
    cmd = [_tool("tdx-compile"), source, "-o", output] + list(extra)
    log.debug("compiling: " + " ".join(cmd))
    if on_line is None:
        done = subprocess.run(cmd, capture_output=True, text=True, env=tool_env())
    else:
        done = _streamed(cmd, tool_env(), 24 * 3600, on_line)
    if done.returncode != 0:
        raise TdxError(f"tdx-compile failed:\n{done.stderr.strip()}")
    return done


def _streamed(cmd, env, timeout, on_line):
    """subprocess.run(cmd, capture_output=True), with `on_line` called on
    each stdout line as it comes; raises TimeoutExpired after `timeout` s."""
    import select
    import time
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        deadline, lines = time.monotonic() + timeout, []
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
                on_line(line)
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise subprocess.TimeoutExpired(cmd, timeout)
        proc.wait()
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), err.read())
