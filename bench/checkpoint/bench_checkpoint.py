"""Sharded checkpoints next to their peers on this machine's disk, one run:

  - `dd` writing the same number of bytes sequentially with conv=fsync, and
    reading them back cold (the disk's sequential bandwidth);
  - torch.save of the gathered state dict (one process, then fsync) and
    torch.load of it;
  - torch.save of each rank's shard by N processes at once (each fsynced);
  - tdx: the model binary on N ranks saving its sharded state (--save, every
    rank writes its boxes, rank 0 commits) and loading it back (--params, each
    rank reads its boxes; the init time of that run), plus a resharding load:
    a checkpoint saved as Shard(0) over 4 ranks read as Shard(1) over 2, with
    the bytes each rank read against the bytes it needed (--verbose).

Reads are cold: every file is dropped from the page cache
(posix_fadvise DONTNEED after fsync) before it is read. Times are the best of
--rounds rounds; os.sync() runs before each, so that no measurement pays for
another's dirty pages.

    . build/env.sh && "$TDX_PYTHON" bench/checkpoint/bench_checkpoint.py [--mib 256]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.update(OMP_NUM_THREADS="1")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import tdx  # noqa: E402

WIDTH = 1024


def stack(layers):
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])


def drop_cache(path):
    files = [path] if os.path.isfile(path) else [
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def timed(fn):
    # Nothing else's dirty pages are flushed inside the measurement.
    os.sync()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def dd(nbytes, work):
    path = os.path.join(work, "dd.bin")
    count = max(1, nbytes // (16 << 20))
    write = timed(lambda: subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M",
                                          f"count={count}", "conv=fsync"], check=True,
                                         capture_output=True))
    drop_cache(path)
    read = timed(lambda: subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M"],
                                        check=True, capture_output=True))
    os.remove(path)
    return count * (16 << 20) / write, count * (16 << 20) / read


def torch_gathered(state, work):
    path = os.path.join(work, "state.pt")

    os.sync()

    def save():
        torch.save(state, path)
        fsync_file(path)
    write = timed(save)
    drop_cache(path)
    read = timed(lambda: torch.load(path))
    os.remove(path)
    return write, read


def _save_shard(rank, shards, work, barrier, times):
    barrier.wait()
    t = time.perf_counter()
    path = os.path.join(work, f"shard{rank}.pt")
    torch.save(shards[rank], path)
    fsync_file(path)
    times[rank] = time.perf_counter() - t


def torch_per_rank(state, ranks, work):
    shards = [{k: v.chunk(ranks)[r].clone() for k, v in state.items()} for r in range(ranks)]
    ctx = mp.get_context("fork")
    barrier, times = ctx.Barrier(ranks), ctx.Array("d", ranks)
    procs = [ctx.Process(target=_save_shard, args=(r, shards, work, barrier, times))
             for r in range(ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    for r in range(ranks):
        os.remove(os.path.join(work, f"shard{r}.pt"))
    return max(times)


def binary(layers, ranks, dim):
    prog = tdx.trace(tdx.deferred_init(stack, layers), torch.randn(4, WIDTH))
    mesh = tdx.init_device_mesh("cpu", (ranks,), ("r",))
    for i in range(layers):
        prog.annotate(f"{i}.weight", mesh, [tdx.Shard(dim)])
    prog.partition()
    return tdx.compile(prog)


def launch(exe, args):
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(exe.world_size),
           exe.path, "--verbose"] + args
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def tdx_save(exe, root):
    shutil.rmtree(root, ignore_errors=True)
    os.sync()
    log = launch(exe, ["--save", root])
    return float(re.search(r"saved \S+ in ([\d.]+) ms", log).group(1)) / 1e3


def tdx_load(exe, root):
    drop_cache(root)
    log = launch(exe, ["--params", root])
    # The slowest rank's time to read its state (its init phase).
    init = max(float(m) for m in re.findall(r"init ([\d.]+) ms, local", log)) / 1e3
    reads = re.findall(r"read (\d+) bytes of \S+ for (\d+) bytes", log)
    return init, sum(int(r) for r, _ in reads), sum(int(n) for _, n in reads)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="state size in MiB")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary "
                        "directory on the disk of /tmp)")
    args = parser.parse_args()
    layers = max(1, args.mib * (1 << 20) // (WIDTH * WIDTH * 4))
    nbytes = layers * WIDTH * WIDTH * 4
    work = tempfile.mkdtemp(prefix="tdx-bench-ckpt-", dir=args.dir)
    print(f"state: {layers} tensors of {WIDTH}x{WIDTH} float32, {nbytes / 2**20:.0f} MiB; "
          f"{args.ranks} ranks; files in {work}")
    try:
        t = time.perf_counter()
        save_exe, reshard_exe = binary(layers, args.ranks, 0), binary(layers, 2, 1)
        print(f"compiled the two binaries in {time.perf_counter() - t:.0f} s")
        torch.manual_seed(0)
        state = {k: v.detach() for k, v in stack(layers).state_dict().items()}
        times = {}

        def keep(name, seconds):
            times.setdefault(name, []).append(seconds)

        root = os.path.join(work, "ckpt")
        for _ in range(args.rounds):
            w, r = dd(nbytes, work)
            keep("dd write", nbytes / w)
            keep("dd read", nbytes / r)
            w, r = torch_gathered(state, work)
            keep("torch.save gathered", w)
            keep("torch.load gathered", r)
            keep(f"torch.save per rank x{args.ranks}", torch_per_rank(state, args.ranks, work))
            keep(f"tdx save x{args.ranks}", tdx_save(save_exe, root))
            load, read, needed = tdx_load(save_exe, root)
            keep(f"tdx load x{args.ranks}", load)
            load2, read2, needed2 = tdx_load(reshard_exe, root)
            keep("tdx reshard load x2", load2)
            py = os.path.join(work, "py")
            keep("tdx.checkpoint.save (1 process)",
                 timed(lambda: tdx.checkpoint.save(state, py, keep=1)))
            drop_cache(py)
            keep("tdx.checkpoint.load (1 process)", timed(lambda: tdx.checkpoint.load(py)))
            shutil.rmtree(py)
        best = {k: min(v) for k, v in times.items()}
        median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        disk_w, disk_r = nbytes / best["dd write"], nbytes / best["dd read"]
        print(f"\n{'':36s}{'best s':>8s}{'median s':>10s}{'MiB/s':>8s}{'vs dd':>7s}")
        for name, seconds in best.items():
            rate = nbytes / seconds
            ref = disk_r if "load" in name or "read" in name else disk_w
            print(f"{name:36s}{seconds:8.3f}{median[name]:10.3f}{rate / 2**20:8.0f}"
                  f"{rate / ref:7.2f}")
        print("(MiB/s and 'vs dd' from the best times; this machine's disk is a virtual one "
              "whose times vary run to run)")
        print(f"\ntdx load x{args.ranks}: read {read} bytes for {needed} needed "
              f"({read / needed:.3f}x)")
        print(f"tdx reshard load (Shard(0) x{args.ranks} -> Shard(1) x2): read {read2} bytes "
              f"for {needed2} needed ({read2 / needed2:.3f}x)")
        print("tdx load: the slowest rank's time to read its state; dd and torch are single "
              "sequential streams.")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
