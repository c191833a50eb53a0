"""The networked tensor store's bandwidth between two hosts, next to the
link's rate and torch.distributed's gloo send/recv of the same bytes
between the same hosts, in one run (root only: scripts/hosts.sh's hosts).

Hosts h1 and h2, each link limited to --rate both ways (or none with
--rate none), a volume (tdx-volume) on each, h1's the store's first.
  - put: a process on h1 puts --mb MB (16 float32 tensors) on its own
    host's volume (this host's network stack, not the link);
  - get across: a process on h2 gets that version whole, every byte from
    h1's volume over the link;
  - get a box: the same process gets a quarter of each tensor (a 2 x 2
    split), only its bytes moving;
  - gloo: rank 0 on h1 sends the same bytes to rank 1 on h2 (16 tensors,
    dist.send / dist.recv), the peer of "get across".
Each figure is the best of --rounds; MB/s are 1e6 bytes per second.

    . build/env.sh && "$TDX_PYTHON" bench/cluster/bench_store.py [--rate 1gbit] [--mb 64]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
HOSTS = os.path.abspath(os.path.join(ROOT, "scripts", "hosts.sh"))
NETWORK = "10.77.0.0/24"
STORE = "ucx://h1:7070,h2:7070"
TENSORS = 16


def state(mb):
    import torch

    n = int(mb * 1e6) // 4 // TENSORS
    rows = max(1, int(n ** 0.5))
    g = torch.Generator().manual_seed(0)
    return {f"t{i}": torch.randn(rows, n // rows, generator=g) for i in range(TENSORS)}


def worker(mode, mb, rounds):
    """Runs on a host: prints the best seconds of `mode` as JSON."""
    import torch
    import tdx
    from tdx.store import Store

    torch.set_num_threads(1)
    store, best = Store(STORE), float("inf")
    if mode == "put":
        sd = state(mb)
        for _ in range(rounds):
            t = time.perf_counter()
            store.put("bench", sd, keep=1)
            best = min(best, time.perf_counter() - t)
        moved = sum(v.numel() * 4 for v in sd.values())
    elif mode == "get":
        for _ in range(rounds):
            t = time.perf_counter()
            got = store.get("bench")
            best = min(best, time.perf_counter() - t)
        moved = sum(v.numel() * 4 for v in got.values())
    else:  # a box: a quarter of every tensor
        names = list(store.tensors("bench"))
        for _ in range(rounds):
            t = time.perf_counter()
            boxes = [store.get("bench", n, mesh=(2, 2), placements=[tdx.Shard(0), tdx.Shard(1)],
                               coords=(1, 1)) for n in names]
            best = min(best, time.perf_counter() - t)
        moved = sum(b.numel() * 4 for b in boxes)
    print(json.dumps({"seconds": best, "bytes": moved}), flush=True)


def gloo(mb, rounds):
    """One rank of the gloo peer, under mpirun across the hosts."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    dist.init_process_group("gloo", init_method="tcp://10.77.0.1:29812", rank=rank,
                            world_size=2)
    sd = state(mb)
    best = float("inf")
    for _ in range(rounds):
        dist.barrier()
        t = time.perf_counter()
        for v in sd.values():
            dist.send(v, 1) if rank == 0 else dist.recv(v, 0)
        dist.barrier()
        best = min(best, time.perf_counter() - t)
    if rank == 1:
        print(json.dumps({"seconds": best, "bytes": sum(v.numel() * 4 for v in sd.values())}),
              flush=True)
    dist.destroy_process_group()


def on(host, *args, timeout=900):
    done = subprocess.run([HOSTS, "rsh", host, sys.executable, os.path.abspath(__file__),
                           *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} on {host} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="1gbit", help="each link's rate (tc), or none")
    parser.add_argument("--mb", type=float, default=64, help="MB moved (default 64)")
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args()
    from tdx.compile import _tool

    subprocess.run([HOSTS, "down"], capture_output=True)
    subprocess.run([HOSTS, "up", "2"] + ([] if a.rate == "none" else ["--rate", a.rate]),
                   check=True, capture_output=True)
    volumes = []
    try:
        for h in ("h1", "h2"):
            p = subprocess.Popen([HOSTS, "rsh", h, _tool("tdx-volume"), "--port", "7070"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            volumes.append(p)
            p.stdout.readline()
        r = {"put (h1 to its own volume)": on("h1", "worker", "put", str(a.mb), str(a.rounds)),
             "get across (h2 from h1's volume)": on("h2", "worker", "get", str(a.mb),
                                                    str(a.rounds)),
             "get a quarter box (h2 from h1)": on("h2", "worker", "box", str(a.mb),
                                                  str(a.rounds))}
        done = subprocess.run(
            ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", "--host",
             "h1:1,h2:1", "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include",
             NETWORK, "--mca", "oob_tcp_if_include", NETWORK, "--mca", "plm_rsh_agent",
             f"{HOSTS} rsh", sys.executable, os.path.abspath(__file__), "gloo", str(a.mb),
             str(a.rounds)], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"gloo failed:\n{done.stderr[-3000:]}")
        peer = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for p in volumes:
            p.kill()
        subprocess.run([HOSTS, "down"], capture_output=True)
    link = None
    m = re.fullmatch(r"([\d.]+)([kmg]?)bit", a.rate)
    if m:
        link = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8 / 1e6
    rate = lambda x: x["bytes"] / x["seconds"] / 1e6
    print(f"store across 2 hosts, link {a.rate}"
          + (f" ({link:.0f} MB/s)" if link else "") + f", {a.mb:g} MB, best of {a.rounds}")
    print("| what | MB | s | MB/s | of the link | store / gloo |")
    print("|---|---|---|---|---|---|")
    for name, x in list(r.items()) + [("gloo send/recv (h1 to h2)", peer)]:
        of_link = f"{rate(x) / link:.2f}" if link else "-"
        vs = f"{rate(x) / rate(peer):.2f}" if "across" in name else "-"
        print(f"| {name} | {x['bytes'] / 1e6:.1f} | {x['seconds']:.3f} | {rate(x):.1f} | "
              f"{of_link} | {vs} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "gloo":
        gloo(float(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
