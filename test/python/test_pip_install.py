"""pip install . (issue 57): into a fresh virtual environment that holds only
pip's torch and tdx's other dependencies (linked from the build's
environment, nothing downloaded), then, from another folder, import tdx, the
README's example (examples/gpt_2x2.py: trace, parallelize, compile, run on 4
ranks against eager) and the console commands on the environment's PATH.
The C++ build is the checkout's (build/, against the same torch): pip's
build reuses it."""

import importlib.metadata as md
import os
import re
import subprocess
import sys


ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


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
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TDX_PYTHON")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    where = subprocess.run([python, "-c", "import tdx; print(tdx.__file__)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(site), where.stdout
    example = subprocess.run([python, os.path.join(ROOT, "examples", "gpt_2x2.py")],
                             cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
    assert example.returncode == 0, example.stdout[-2000:] + example.stderr[-3000:]
    assert "materialized: bitwise equal to eager construction: True" in example.stdout
    rel = float(re.search(r"relative error over all \d+ logits: (\S+)", example.stdout).group(1))
    assert rel < 1e-5, example.stdout
    for tool in ("tdx-opt", "tdx-compile", "tdx-translate", "tdx-volume"):
        shown = subprocess.run([tool, "--help"], cwd=elsewhere, env=env, capture_output=True,
                               text=True)
        assert shown.returncode == 0 and "USAGE" in shown.stdout.upper(), (tool, shown.stderr)
