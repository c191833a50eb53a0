"""Runs a Python script as an SPMD job: N processes under mpirun, each one
rank (``exe.start()`` binds to the MPI world; docs/training.md), on this
machine or across hosts (docs/cluster.md).

    python3 -m tdx.run -n N script.py [args...]
    python3 -m tdx.run --hosts h1:2,h2:2 [--map-by slot|node] [--network CIDR]
                       [--rsh AGENT] script.py [args...]

adds what mpirun needs: ``--oversubscribe`` (more ranks than cores),
``--allow-run-as-root`` where this runs as root, this Python, and this
environment for every rank (``PYTHONPATH``, ``TDX_CACHE_DIR``, ...).
Across hosts, ranks on one host talk through shared memory and ranks on
different hosts through TCP (Open MPI's vader and tcp transports). Its exit
status is the job's."""

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading


def parse_hosts(text):
    """``"h1:2,h2:2"`` as [("h1", 2), ("h2", 2)]; a host without ``:N``
    takes one rank. Raises ValueError naming what is wrong."""
    hosts = []
    for item in text.split(","):
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?::(\d+))?", item.strip())
        if not m:
            raise ValueError(f"--hosts: '{item}' is not HOST or HOST:RANKS (e.g. h1:2,h2:2)")
        ranks = int(m.group(2) or 1)
        if ranks < 1:
            raise ValueError(f"--hosts: {m.group(1)} has {ranks} ranks; give at least 1")
        if m.group(1) in dict(hosts):
            raise ValueError(f"--hosts: {m.group(1)} is named twice")
        hosts.append((m.group(1), ranks))
    return hosts


def command(nprocs, script, args, python=sys.executable, hosts=None, map_by="slot",
            network=None, rsh=None):
    """The mpirun command line of an SPMD run of `script` on `nprocs` ranks:
    on this machine, or on `hosts` ([(name, ranks)]) with ranks placed
    ``map_by`` "slot" (rank 0 ... k-1 on the first host: the mesh's last,
    fastest-varying axis stays inside a host) or "node" (rank r on host r
    mod H: the first axis does), TCP between hosts over the interfaces of
    `network` (a CIDR, e.g. "10.0.0.0/24"; default: Open MPI's choice), and
    daemons started with `rsh` (default: Open MPI's, ssh)."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(nprocs)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if hosts:
        cmd += ["--host", ",".join(f"{h}:{n}" for h, n in hosts), "--map-by", map_by,
                "--mca", "btl", "self,vader,tcp"]
        if network:
            cmd += ["--mca", "btl_tcp_if_include", network, "--mca", "oob_tcp_if_include",
                    network]
        if rsh:
            cmd += ["--mca", "plm_rsh_agent", rsh]
    # Open MPI passes only some variables on; every rank gets this process's.
    for name in sorted(os.environ):
        if name.startswith(("PYTHON", "TDX_", "OMP_", "LD_LIBRARY_PATH", "PATH")):
            cmd += ["-x", name]
    return cmd + [python, script] + list(args)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m tdx.run",
        description="Run a Python script on N processes under mpirun, each one rank of the "
                    "program its exe.start() loads (SPMD), on this machine or across hosts.")
    parser.add_argument("-n", "--nprocs", type=int,
                        help="processes (ranks): the program's world size (with --hosts: "
                             "their ranks' sum, which -n may repeat)")
    parser.add_argument("--hosts", metavar="H:N,...",
                        help="run on these hosts, N ranks on each (h1:2,h2:2): shared memory "
                             "within a host, TCP between hosts")
    parser.add_argument("--map-by", choices=("slot", "node"), default="slot",
                        help="slot (default): consecutive ranks on one host, so the mesh's "
                             "last (fastest-varying) axis stays inside a host; node: rank r on "
                             "host r mod H, so its first axis does")
    parser.add_argument("--network", metavar="CIDR",
                        help="the network between the hosts (e.g. 10.77.0.0/24): MPI's TCP "
                             "traffic and its daemons' use only interfaces on it")
    parser.add_argument("--rsh", metavar="AGENT",
                        default=os.environ.get("TDX_RSH_AGENT"),
                        help="how mpirun starts its daemons on the hosts (default: "
                             "$TDX_RSH_AGENT, else Open MPI's, ssh); the test hosts use "
                             "'scripts/hosts.sh rsh'")
    parser.add_argument("--grace", type=float, default=5, metavar="S",
                        help="after a rank reports an error that ends the job, end mpirun if "
                             "it has not ended within S seconds (default 5): a host whose "
                             "link is cut or that is stopped never confirms")
    parser.add_argument("script", help="the Python script every rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    a = parser.parse_args(argv)
    hosts = None
    if a.hosts:
        try:
            hosts = parse_hosts(a.hosts)
        except ValueError as e:
            parser.error(str(e))
        total = sum(n for _, n in hosts)
        if a.nprocs is not None and a.nprocs != total:
            parser.error(f"-n {a.nprocs} but --hosts {a.hosts} has {total} ranks")
        a.nprocs = total
    elif a.nprocs is None:
        parser.error("give -n N (ranks on this machine) or --hosts H:N,...")
    elif a.map_by != "slot" or a.network or (a.rsh and "--rsh" in (argv or sys.argv)):
        parser.error("--map-by, --network and --rsh place ranks on hosts: give --hosts")
    if a.nprocs < 1:
        parser.error(f"-n must be at least 1, got {a.nprocs}")
    if not os.path.exists(a.script):
        parser.error(f"no such script: {a.script}")
    if shutil.which("mpirun") is None:
        parser.error("mpirun is not on PATH; install Debian's openmpi-bin (scripts/setup.sh "
                     "does)")
    return supervise(command(a.nprocs, a.script, a.args, hosts=hosts, map_by=a.map_by,
                             network=a.network, rsh=a.rsh), a.grace)


# What a rank that ends the job writes on stderr: tdx's own error
# (tdx::rt::endRank), or Open MPI's note that a rank called MPI_Abort.
_FATAL = re.compile(r"^tdx: rank \d+ \(host [^)]*\): |MPI_ABORT was invoked")


def supervise(cmd, grace):
    """Runs mpirun with its stderr passed through, and ends it if it has not
    ended `grace` seconds after a rank reported an error that ends the job:
    mpirun waits for every host's daemon to confirm, and one whose host is
    cut off or stopped never does. Returns the job's exit status."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace")
    failed = threading.Event()

    def forward():
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if _FATAL.search(line):
                failed.set()

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    while proc.poll() is None:
        if failed.wait(0.5):
            try:
                return proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                # mpirun crashes in its own clean-up when terminated with a
                # daemon out of reach; killed, it leaves the rest to the
                # daemons, which end when its connections close.
                proc.kill()
                proc.wait()
                sys.stderr.write(f"tdx.run: a rank ended the job, but mpirun had not ended "
                                 f"{grace:g} s later (a host's daemon does not answer: its link "
                                 f"is cut or it is stopped); mpirun was ended\n")
                return 1
    reader.join(timeout=5)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
