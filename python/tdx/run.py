"""Runs a Python script as an SPMD job: N processes under mpirun, each one
rank (``exe.start()`` binds to the MPI world; docs/training.md).

    python3 -m tdx.run -n N script.py [args...]

adds what mpirun needs on one machine: ``--oversubscribe`` (more ranks than
cores), ``--allow-run-as-root`` where this runs as root, this Python, and
this environment for every rank (``PYTHONPATH``, ``TDX_CACHE_DIR``, ...).
Its exit status is the job's."""

import argparse
import os
import shutil
import subprocess
import sys


def command(nprocs, script, args, python=sys.executable):
    """The mpirun command line of an SPMD run of `script` on `nprocs` ranks."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(nprocs)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    # Open MPI passes only some variables on; every rank gets this process's.
    for name in sorted(os.environ):
        if name.startswith(("PYTHON", "TDX_", "OMP_", "LD_LIBRARY_PATH", "PATH")):
            cmd += ["-x", name]
    return cmd + [python, script] + list(args)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m tdx.run",
        description="Run a Python script on N processes under mpirun, each one rank of the "
                    "program its exe.start() loads (SPMD).")
    parser.add_argument("-n", "--nprocs", type=int, required=True,
                        help="processes (ranks): the program's world size")
    parser.add_argument("script", help="the Python script every rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    a = parser.parse_args(argv)
    if a.nprocs < 1:
        parser.error(f"-n must be at least 1, got {a.nprocs}")
    if not os.path.exists(a.script):
        parser.error(f"no such script: {a.script}")
    if shutil.which("mpirun") is None:
        parser.error("mpirun is not on PATH; install Debian's openmpi-bin (scripts/setup.sh "
                     "does)")
    return subprocess.call(command(a.nprocs, a.script, a.args))


if __name__ == "__main__":
    sys.exit(main())
