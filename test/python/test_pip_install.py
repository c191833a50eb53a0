"""pip install . (issue 57): into a fresh virtual environment that holds only
pip's torch and tdx's other dependencies (linked from the build's
environment, nothing downloaded). pip builds the self-contained wheel
(setup.py: build/wheel, MLIR and LLVM linked statically, the runtime inside);
then ldd of its extension and tools names no libMLIR or libLLVM, and, from
another folder, with /usr/lib/llvm-22 (Debian's LLVM and MLIR) and the
checkout hidden (a mount namespace, where unshare -m is allowed): import
tdx, the README's example (examples/gpt_2x2.py: trace, parallelize, compile,
run on 4 ranks against eager) and the console commands on the
environment's PATH. scripts/wheel-check.sh does the same with torch
installed from pip's wheels."""

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys


ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = ("tdx-opt", "tdx-compile", "tdx-translate", "tdx-volume")


def _closure(names):
    """The installed distributions `names` need, transitively."""
    seen, todo = {}, list(names)
    while todo:
        name = re.split(r"[ ;<>=!~\[]", todo.pop())[0]
        key = name.lower().replace("_", "-")
        if not key or key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue                  # an extra's or another platform's
        seen[key] = dist
        todo += [r for r in (dist.requires or []) if "extra ==" not in r]
    return seen.values()


def _link_packages(site, names):
    """Links the files of each distribution (its top-level folders and
    modules, its .dist-info) into `site`."""
    for dist in _closure(names):
        tops = {str(f).split("/")[0] for f in dist.files or []}
        for top in tops:
            if top.endswith(".pth") or top.startswith("..") or top == "__pycache__":
                continue
            src = os.path.join(str(dist.locate_file("")), top)
            dst = os.path.join(site, top)
            if os.path.exists(src) and not os.path.lexists(dst):
                os.symlink(src, dst)


def test_pip_install_into_a_fresh_environment(tmp_path):
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # pip itself and what tdx needs: torch (and what it needs), numpy, tqdm;
    # setuptools (torch's own dependency) builds the wheel.
    _link_packages(site, ["pip", "torch", "numpy", "tqdm", "setuptools"])
    have = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                          text=True, check=True).stdout
    assert "torch==" in have and "transformers" not in have and "tdx" not in have, have
    done = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                           "--no-index", ROOT], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    package = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                             capture_output=True, text=True, check=True).stdout.strip() + "/tdx"
    binaries = [os.path.join(package, f) for f in os.listdir(package) if f.startswith("_C")]
    binaries += [os.path.join(package, "bin", t) for t in TOOLS]
    assert len(binaries) == 5, binaries
    for binary in binaries:
        libs = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        assert "libstdc++" in libs, libs          # ldd read it
        assert not re.search(r"libMLIR|libLLVM|not found", libs), (binary, libs)
    assert os.path.exists(os.path.join(package, "runtime", "include", "tdx", "Runtime",
                                       "Runtime.h"))

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(os.path.join(ROOT, "examples", "gpt_2x2.py"), elsewhere)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TDX_PYTHON")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    env["TDX_CACHE_DIR"] = str(tmp_path / "compile-cache")   # the checkout's is hidden

    hide = []
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0:
        hide = ["unshare", "-m", "sh", "-c",
                f'mount -t tmpfs none /usr/lib/llvm-22 && mount -t tmpfs none "{ROOT}" && '
                'exec "$@"', "hide"]

    def run(*cmd, **kw):
        return subprocess.run(hide + list(cmd), cwd=elsewhere, env=env, capture_output=True,
                              text=True, **kw)

    if hide:
        for folder in ("/usr/lib/llvm-22", ROOT):
            assert run("ls", "-A", folder).stdout.split() == [], f"{folder} not hidden"
    where = run(python, "-c", "import tdx; print(tdx.__file__)")
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(site), where.stdout
    example = run(python, "gpt_2x2.py", timeout=900)
    assert example.returncode == 0, example.stdout[-2000:] + example.stderr[-3000:]
    assert "materialized: bitwise equal to eager construction: True" in example.stdout
    rel = float(re.search(r"relative error over all \d+ logits: (\S+)", example.stdout).group(1))
    assert rel < 1e-5, example.stdout
    for tool in TOOLS:
        shown = run(tool, "--help")
        assert shown.returncode == 0 and "USAGE" in shown.stdout.upper(), (tool, shown.stderr)
