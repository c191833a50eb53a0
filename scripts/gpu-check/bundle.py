"""Writes the GPU check bundle (scripts/gpu-check.sh bundle OUT): one folder
that a machine with a GPU, nvcc, CUDA, NCCL and a recent PyTorch, but no
Debian packages and no network, builds and runs with `bash OUT/run.sh`.

It holds, for each test model and mesh: the emitted CUDA program (.cu), its
weights and inputs, and the outputs expected from PyTorch eager and from the
CPU model binary, computed here; the CUDA runtime's sources; Open MPI from
Debian's packages (unpacked with dpkg -x); the model code and check.py, which
compares outputs and times that machine's PyTorch eager next to the binaries.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "test", "python"))

import torch  # noqa: E402

import tdx  # noqa: E402
from models import DECODER_VOCAB, GPT2, Decoder, Llama  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check import cosine, eager_loop, eager_with_casts, lm_loss  # noqa: E402  (the GPU side's)

# Program name -> (model, ranks, kind); tp2 runs two ranks on one GPU where
# NCCL allows it. "forward" programs compare their output, "train" ones
# (tdx.trace_train_step with OPTIMIZERS' optimizer, TRAIN_STEPS steps) their loss per step
# and the final state; "train-pp" is a training step pipelined over its
# ranks (1F1B, PIPELINE_MICROBATCHES micro-batches). "loop" programs are a
# user's loop over a step built as a shared object, driven through the
# runner's C ABI on every rank (check.py loop): LOOP_STEPS steps of a
# cosine lr schedule (the step's "lr" input); gpt2 with 2 micro-batches per
# step and an evaluation entry after every step, 2 ranks sharing one GPU on
# tp2 (through host memory); ResNet on dp2 with batch norm's global
# statistics. "train-bf16" is a training step under tdx.MixedPrecision
# (bf16 compute on float32 weights: bf16 softmax, layer norm and cross
# entropy on CUDA), against eager with the same casts (check.py
# eager_with_casts), with SGD and momentum (LOOP_OPTIMIZER).
PROGRAMS = {
    "gpt2-1": ("gpt2", 1, "forward"), "gpt2-tp2": ("gpt2", 2, "forward"),
    "llama-1": ("llama", 1, "forward"), "llama-tp2": ("llama", 2, "forward"),
    "resnet18-1": ("resnet18", 1, "forward"),
    "gpt2-train-1": ("gpt2", 1, "train"), "llama-train-tp2": ("llama", 2, "train"),
    "resnet-tiny-train-1": ("resnet-tiny", 1, "train"),
    "gpt2-train-pp2": ("gpt2", 2, "train-pp"),
    "narrow-1": ("narrow", 1, "forward"), "bf16-mlp-1": ("bf16-mlp", 1, "forward"),
    "decoder-train-1": ("decoder", 1, "train"),
    "gpt2-loop-1": ("gpt2", 1, "loop"), "gpt2-loop-tp2": ("gpt2", 2, "loop"),
    "resnet-tiny-loop-dp2": ("resnet-tiny", 2, "loop"),
    "gpt2-bf16-train-1": ("gpt2", 1, "train-bf16"),
}
# Relative error allowed against eager on the CPU: bf16 and f16 kernels round
# each op's float result, and the GPU's expf may differ from the CPU's by an
# ulp, which can move a bf16 result by one of its own ulps.
TOLERANCE = {"narrow": 1e-2, "bf16-mlp": 1e-2}
# A bf16 step's losses and final state against eager with the same casts:
# bf16 rounds each loss to 2^-8 of itself, and the final parameters of a
# bf16 step and of float32 eager are 1e-2 apart (measured: 9.8e-3 on
# gpt2-bf16-train-1, where tdx's CPU step is 9.0e-3 from eager's casts).
BF16_TOLERANCE = {"output": 2e-2, "state": 2e-2}
TRAIN_STEPS = 5
LOOP_STEPS = 4
PIPELINE_MICROBATCHES = 2
# The runtime a model binary links: tdx/Runtime without LLVM, MLIR or ATen.
# (lib/Runtime), the state format and the networked store it stands on.
RUNTIME = ["Runtime/Mesh.cpp", "Runtime/Options.cpp", "Runtime/SaveCheckpoint.cpp",
           "Runtime/InitProgram.cpp", "Runtime/Placement.cpp", "Runtime/Arena.cpp",
           "Runtime/Serve.cpp", "Runtime/Generate.cpp", "Runtime/Library.cpp",
           "StateFormat/Safetensors.cpp",
           "StateFormat/Checkpoint.cpp", "StateFormat/Crc32c.cpp", "StateFormat/Json.cpp",
           "Store/Ucx.cpp", "Store/Volumes.cpp"]
# With UCX's headers: the networked tensor store's transport (Volumes.cpp).
MPI_PACKAGES = ["openmpi-bin", "openmpi-common", "libopenmpi3", "libopenmpi-dev", "libucx-dev"]
# On every machine already; never bundled.
BASE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libgfortran5", "libquadmath0"}


def ids():
    return torch.randint(0, 96, (4, 8), generator=torch.Generator().manual_seed(1))


class Narrow(torch.nn.Module):
    """bf16, f16 and int8 fused kernels (the CUDA bodies on cuda_bf16.h's and
    cuda_fp16.h's types), summed into a float output."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64) * 0.5)

    def forward(self, x):
        h = (x * self.w).bfloat16()
        y = (h * 0.5).exp() + h
        z = x.half() * 3.0 + 1.0
        return y.float() + z.float() + (x * 40).to(torch.int8).float()


class BF16MLP(torch.nn.Module):
    """bf16 GEMMs (cuBLAS, fp32 accumulation): a linear with its bias and a
    matmul on fp32 weights cast to bf16, as mixed precision computes."""

    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(128, 64) * 0.1)
        self.b1 = torch.nn.Parameter(torch.randn(128) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(64, 128) * 0.1)

    def forward(self, x):
        h = torch.nn.functional.linear(x.bfloat16(), self.w1.bfloat16(), self.b1.bfloat16())
        return (h.relu() @ self.w2.bfloat16().t()).float()


def model(name):
    """(eager model with its weights, deferred model, example inputs, tp plan)."""
    from test_sharding import GPT2_PLAN, LLAMA_PLAN
    # The small modules of this file, by the rows of their one input.
    small = {"narrow": (Narrow, 4), "bf16-mlp": (BF16MLP, 16)}
    if name in small:
        cls, rows = small[name]
        torch.manual_seed(0)
        eager = cls()
        torch.manual_seed(0)
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(0))
        return eager, tdx.deferred_init(cls), (x,), {}
    if name == "resnet-tiny":
        from vision_models import resnet_tiny
        torch.manual_seed(0)
        eager = resnet_tiny()
        torch.manual_seed(0)
        return eager, tdx.deferred_init(resnet_tiny), None, {}
    if name == "resnet18":
        from vision_models import IMAGES
        torch.manual_seed(0)
        eager = IMAGES["resnet18"]().eval()
        with torch.no_grad():
            for p in eager.parameters():
                p.normal_(0, 0.2)
        torch.manual_seed(0)
        deferred = tdx.deferred_init(IMAGES["resnet18"])
        deferred.eval()
        image = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        return eager, deferred, (image,), {}
    cls, plan = {"gpt2": (GPT2, GPT2_PLAN), "llama": (Llama, LLAMA_PLAN),
                 "decoder": (Decoder, {})}[name]
    torch.manual_seed(0)
    eager = cls()
    torch.manual_seed(0)
    return eager, tdx.deferred_init(cls), (ids(),), plan


def state(module):
    out = dict(module.named_parameters())
    out.update(module.named_buffers())
    return {k: v.detach().contiguous() for k, v in out.items()}


def tool(name):
    return os.path.join(ROOT, "build", "bin", name)


def placed(prog, ranks, plan):
    """`prog` with its tensor-parallel plan on `ranks` ranks."""
    if ranks > 1:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (ranks,), ("tp",)), plan)
    return prog


def emit_cuda(prog, folder):
    prog.partition()
    prog.save(os.path.join(folder, "program.mlir"))
    subprocess.run([tool("tdx-translate"), "--tdx-to-cuda", os.path.join(folder, "program.mlir"),
                    "-o", os.path.join(folder, "program.cu")], check=True)
    os.remove(os.path.join(folder, "program.mlir"))


# The optimizer of each model's training program, as torch.optim's class
# and arguments (written to the program's optimizer.json, which check.py's
# eager timing builds too).
OPTIMIZERS = {"resnet-tiny": ("SGD", {"lr": 1e-2, "momentum": 0.9}),
              "gpt2": ("AdamW", {"lr": 1e-3, "weight_decay": 0.1}),
              "llama": ("AdamW", {"lr": 1e-3, "weight_decay": 0.1}),
              "decoder": ("AdamW", {"lr": 1e-3, "weight_decay": 0.1})}


# A loop's optimizer: SGD with momentum, whose final state is well
# conditioned (AdamW's update divides by the root of small squared
# gradients, which lifts rounding to the size of a step).
LOOP_OPTIMIZER = ("SGD", {"lr": 5e-2, "momentum": 0.9})


def optimizer(model_name, params, spec=None):
    name, kwargs = spec or OPTIMIZERS[model_name]
    return getattr(torch.optim, name)(params, foreach=False, **kwargs)


def write_train_program(out, name, cpu_expected):
    """A whole training step: eager's losses and final parameters after
    TRAIN_STEPS steps of the model's optimizer from the weights in params.safetensors."""
    model_name, ranks, kind = PROGRAMS[name]
    eager, deferred, _, plan = model(model_name)
    folder = os.path.join(out, "programs", name)
    os.makedirs(folder)
    g = torch.Generator().manual_seed(5)
    if model_name == "resnet-tiny":  # images and labels, batch norm on the batch's statistics
        eager.train()
        deferred.train()
        batches = [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))
                   for _ in range(TRAIN_STEPS)]
    else:
        vocab = DECODER_VOCAB if model_name == "decoder" else 96
        batches = [(torch.randint(0, vocab, (4, 8), generator=g),
                    torch.randint(0, vocab, (4, 8), generator=g)) for _ in range(TRAIN_STEPS)]
    bf16 = kind == "train-bf16"
    spec = LOOP_OPTIMIZER if bf16 else OPTIMIZERS[model_name]
    prog = tdx.trace_train_step(deferred, optimizer(model_name, deferred.parameters(), spec),
                                lm_loss, *batches[0])
    if bf16:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (1,), ("dp",)), {},
                        mixed_precision=tdx.MixedPrecision(param_dtype=torch.bfloat16))
    elif kind == "train-pp":
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (ranks,), ("pp",)), {},
                        pipeline=tdx.Pipeline("pp", microbatches=PIPELINE_MICROBATCHES))
    else:
        placed(prog, ranks, plan)
    cpu_prog = prog.copy()
    emit_cuda(prog, folder)
    weights = {k: v.clone() for k, v in state(eager).items()}
    tdx.safetensors.save(weights, os.path.join(folder, "params.safetensors"))
    with open(os.path.join(folder, "optimizer.json"), "w") as f:
        json.dump(spec, f)
    if bf16:
        with open(os.path.join(folder, "precision.json"), "w") as f:
            json.dump({"param_dtype": "bfloat16", "state_tolerance": BF16_TOLERANCE["state"]}, f)
    # A pipeline's binary takes each input as its micro-batches stacked.
    k = PIPELINE_MICROBATCHES if kind == "train-pp" else 1
    tdx.safetensors.save({f"{s}:input:{i}": x.reshape(k, x.shape[0] // k, *x.shape[1:])
                          if k > 1 else x for s, b in enumerate(batches) for i, x in enumerate(b)},
                         os.path.join(folder, "batches.safetensors"))
    opt = optimizer(model_name, eager.parameters(), spec)
    if bf16:
        want = eager_with_casts(eager, opt, batches, lm_loss)
    else:  # a loop at the optimizer's own lr, one micro-batch a step
        want = eager_loop(eager, opt, batches, {"lrs": [spec[1]["lr"]] * TRAIN_STEPS,
                                               "accumulation": 1, "evaluate": False}, lm_loss)
    losses = [want[f"{k}:output:0"] for k in range(TRAIN_STEPS)]
    tdx.safetensors.save(want, os.path.join(folder, "expected.eager.safetensors"))
    tolerance = BF16_TOLERANCE["output"] if bf16 else 1e-5
    entry = {"name": name, "model": model_name, "ranks": ranks, "tolerance": tolerance,
             "kind": "train", "steps": TRAIN_STEPS}
    if cpu_expected:
        got, final = tdx.compile(cpu_prog).train(batches, params=weights)
        for k, (a, b) in enumerate(zip(got, losses)):
            if abs(a - b.item()) > tolerance * abs(b.item()):
                raise SystemExit(f"{name}: the CPU binary's step {k} loss {a} is off eager's "
                                 f"{b.item()}; fix that first")
        cpu = {f"{k}:output:0": torch.tensor(x) for k, x in enumerate(got)}
        cpu.update({f"state:{k}": final[k] for k, _ in eager.named_parameters()})
        tdx.safetensors.save(cpu, os.path.join(folder, "expected.cpu.safetensors"))
    return entry


def write_loop_program(out, name, cpu_expected):
    """A user's loop (check.py loop): eager's losses, evaluations and final
    parameters from its own loop, and tdx's CPU runner driven by the same
    loop (exe.start())."""
    model_name, ranks, _ = PROGRAMS[name]
    eager, deferred, _, plan = model(model_name)
    folder = os.path.join(out, "programs", name)
    os.makedirs(folder)
    g = torch.Generator().manual_seed(7)
    gpt = model_name == "gpt2"
    if gpt:
        batches = [(torch.randint(0, 96, (4, 8), generator=g),
                    torch.randint(0, 96, (4, 8), generator=g)) for _ in range(LOOP_STEPS)]
    else:  # images and labels, batch norm on the global batch's statistics
        eager.train()
        deferred.train()
        batches = [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))
                   for _ in range(LOOP_STEPS)]
    k = 2 if gpt else 1
    rows = batches[0][0].shape[0] // k
    spec = {"lrs": cosine(LOOP_OPTIMIZER[1]["lr"], LOOP_STEPS), "accumulation": k,
            "evaluate": gpt}
    prog = tdx.trace_train_step(deferred, optimizer(model_name, deferred.parameters(),
                                                    LOOP_OPTIMIZER), lm_loss,
                                *batches[0], hyperparameters=("lr",), accumulation_steps=k)
    if gpt:
        prog.add_entry("evaluate", lm_loss, batches[0][0][:rows], batches[0][1][:rows])
        placed(prog, ranks, plan)
    elif ranks > 1:
        tdx.parallelize(prog, tdx.init_device_mesh("cpu", (ranks,), ("dp",)), {},
                        data_parallel="dp")
    cpu_prog = prog.copy()
    emit_cuda(prog, folder)
    weights = {k: v.clone() for k, v in state(eager).items()}
    tdx.safetensors.save(weights, os.path.join(folder, "params.safetensors"))
    tdx.safetensors.save({f"{s}:input:{i}": x for s, b in enumerate(batches)
                          for i, x in enumerate(b)}, os.path.join(folder, "batches.safetensors"))
    for file, value in (("loop.json", spec), ("optimizer.json", LOOP_OPTIMIZER)):
        with open(os.path.join(folder, file), "w") as f:
            json.dump(value, f)
    want = eager_loop(eager, optimizer(model_name, eager.parameters(), LOOP_OPTIMIZER), batches,
                      spec, lm_loss)
    tdx.safetensors.save(want, os.path.join(folder, "expected.eager.safetensors"))
    entry = {"name": name, "model": model_name, "ranks": ranks, "tolerance": 1e-5,
             "kind": "loop", "steps": LOOP_STEPS}
    if cpu_expected:
        got = {}
        with tdx.compile(cpu_prog).start(params=weights) as runner:
            for s, ((x, y), lr) in enumerate(zip(batches, spec["lrs"])):
                got[f"{s}:output:0"] = runner.train_step(x, y, lr=lr)
                if gpt:
                    got[f"{s}:eval:0"] = runner.evaluate(x[:rows], y[:rows])
            final = runner.state_dict()
        got.update({f"state:{n}": final[n] for n, _ in eager.named_parameters()})
        for key, value in want.items():
            rel = ((got[key].double() - value.double()).norm() / value.double().norm()).item()
            if rel > (1e-4 if key.startswith("state:") else 1e-5):
                raise SystemExit(f"{name}: tdx's CPU runner's {key} is {rel:.2e} off eager's; "
                                 f"fix that first")
        tdx.safetensors.save(got, os.path.join(folder, "expected.cpu.safetensors"))
    return entry


def write_program(out, name, cpu_expected):
    model_name, ranks, kind = PROGRAMS[name]
    if kind.startswith("train"):
        return write_train_program(out, name, cpu_expected)
    if kind == "loop":
        return write_loop_program(out, name, cpu_expected)
    eager, deferred, inputs, plan = model(model_name)
    folder = os.path.join(out, "programs", name)
    os.makedirs(folder)
    prog = placed(tdx.trace(deferred, *inputs), ranks, plan)
    emit_cuda(prog, folder)
    weights = state(eager)
    tdx.safetensors.save(weights, os.path.join(folder, "params.safetensors"))
    tdx.safetensors.save({f"input:{i}": x for i, x in enumerate(inputs)},
                         os.path.join(folder, "in.safetensors"))
    with torch.no_grad():
        want = eager(*inputs)
    tdx.safetensors.save({"output:0": want}, os.path.join(folder, "expected.eager.safetensors"))
    entry = {"name": name, "model": model_name, "ranks": ranks,
             "tolerance": TOLERANCE.get(model_name, 1e-5), "kind": "forward", "steps": 0}
    if cpu_expected:
        (got,) = tdx.compile(prog).run(*inputs, params=weights)
        rel = ((got - want).norm() / want.norm()).item()
        if rel >= 1e-5:
            raise SystemExit(f"{name}: the CPU binary is {rel:.2e} off eager; fix that first")
        tdx.safetensors.save({"output:0": got}, os.path.join(folder, "expected.cpu.safetensors"))
    return entry


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def mpi_packages():
    """Open MPI's packages and those of the shared libraries it loads (its
    MCA components included), less what every Linux machine has."""
    files = [os.path.realpath(p) for p in
             glob.glob("/usr/lib/x86_64-linux-gnu/openmpi/lib/*.so*") +
             glob.glob("/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so") +
             [shutil.which("orterun") or "/usr/bin/orterun"]]
    libs = set()
    for f in files:
        for line in subprocess.run(["ldd", f], capture_output=True, text=True).stdout.splitlines():
            if "=>" in line and "/" in line.split("=>")[1]:
                libs.add(os.path.realpath(line.split("=>")[1].split()[0]))
    packages = set(MPI_PACKAGES)
    for lib in libs:
        for candidate in (lib, lib.replace("/usr/lib/", "/lib/", 1)):
            found = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
            if found.returncode == 0:
                packages.add(found.stdout.split(":")[0])
                break
    return sorted(packages - BASE_PACKAGES)


def fetch_deb(package, work, offline):
    version = run(["dpkg-query", "-W", "-f=${Version}", package])
    pattern = f"{package}_{version.replace(':', '%3a')}_*.deb"
    cached = glob.glob(os.path.join("/var/cache/apt/archives", pattern))
    if cached:
        return cached[0]
    if not offline:
        subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=work, check=True,
                       capture_output=True)
        got = glob.glob(os.path.join(work, pattern))
        if got:
            return got[0]
    return None


def bundle_mpi(out, offline):
    """Debian's Open MPI unpacked under out/mpi (dpkg -x of the .deb files,
    from apt's cache or `apt-get download`; offline and uncached, the
    installed files of the package)."""
    target = os.path.join(out, "mpi")
    work = os.path.join(out, ".debs")
    os.makedirs(work)
    used = []
    for package in mpi_packages():
        deb = fetch_deb(package, work, offline)
        if deb:
            subprocess.run(["dpkg", "-x", deb, target], check=True)
            used.append(os.path.basename(deb))
            continue
        for path in run(["dpkg", "-L", package]).splitlines():
            if os.path.isfile(path) and not os.path.isdir(path):
                dst = target + path
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(path, dst, follow_symlinks=False)
        used.append(f"{package} (installed files)")
    shutil.rmtree(work)
    # What running C programs from a relocated tree does not need: docs,
    # Fortran modules, Java, static libraries.
    lib = os.path.join(target, "usr", "lib", "x86_64-linux-gnu")
    for sub in ("usr/share/doc", "usr/share/man", "usr/share/lintian",
                "usr/lib/x86_64-linux-gnu/fortran"):
        shutil.rmtree(os.path.join(target, sub), ignore_errors=True)
    for pattern in ("openmpi/lib/*.a", "openmpi/lib/*.jar", "openmpi/lib/libmpi_java*"):
        for f in glob.glob(os.path.join(lib, pattern)):
            os.remove(f)
    # Debian's alternatives name mpirun; here it is orterun itself.
    for name in ("mpirun", "mpiexec"):
        link = os.path.join(target, "usr", "bin", name)
        if not os.path.lexists(link):
            os.symlink("orterun", link)
    return used


def copy_runtime(out):
    src = os.path.join(out, "runtime")
    for room in ("Runtime", "StateFormat", "Store"):
        shutil.copytree(os.path.join(ROOT, "include", "tdx", room),
                        os.path.join(src, "include", "tdx", room))
    os.makedirs(os.path.join(src, "lib", "cuda"))
    for path in RUNTIME:       # one folder: the names are unique
        shutil.copy(os.path.join(ROOT, "lib", path), os.path.join(src, "lib", os.path.basename(path)))
    for path in glob.glob(os.path.join(ROOT, "lib", "Runtime", "cuda", "*")):
        shutil.copy(path, os.path.join(src, "lib", "cuda"))


def main():
    parser = argparse.ArgumentParser(description="Writes the GPU check bundle.")
    parser.add_argument("out", help="the bundle's folder (must not exist)")
    parser.add_argument("--programs", default=",".join(PROGRAMS),
                        help=f"which programs (default: all of {', '.join(PROGRAMS)})")
    parser.add_argument("--no-cpu-expected", action="store_true",
                        help="skip the CPU binaries' outputs (eager's are always there)")
    parser.add_argument("--offline", action="store_true",
                        help="never run apt-get download (apt's cache or the installed files)")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    if os.path.exists(out):
        raise SystemExit(f"gpu-check: {out} exists; give a new folder")
    names = [n for n in args.programs.split(",") if n]
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        raise SystemExit(f"gpu-check: unknown program(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(PROGRAMS)}")
    os.makedirs(out)
    manifest = {"programs": [write_program(out, n, not args.no_cpu_expected) for n in names]}
    copy_runtime(out)
    manifest["mpi"] = bundle_mpi(out, args.offline)
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("run.sh", "env.sh", "check.py"):
        shutil.copy(os.path.join(here, name), os.path.join(out, name))
    os.makedirs(os.path.join(out, "models"))
    for name in ("models.py", "vision_models.py"):
        shutil.copy(os.path.join(ROOT, "test", "python", name), os.path.join(out, "models", name))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs
               if not os.path.islink(os.path.join(d, f)))
    print(f"gpu-check: bundle {out}: {len(names)} programs, {size / 2**20:.1f} MiB; "
          f"on a GPU machine: bash {os.path.basename(out)}/run.sh")
    if size > 60 * 2**20:
        raise SystemExit("gpu-check: the bundle is over 60 MiB")


if __name__ == "__main__":
    main()
