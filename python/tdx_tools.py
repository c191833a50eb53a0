"""The console commands pip installs (tdx-opt, tdx-compile, tdx-translate,
tdx-volume): each runs the tool of that name the installed tdx package
holds (tdx/bin; with pip install -e, the build's bin), without importing
tdx (no torch at start-up). CMake copies it beside the package in
build/python."""

import importlib.util
import os
import sys


def beside(package, name):
    """Tool `name` of the tdx package at folder `package`: the wheel's
    (tdx/bin), or the build's (build/python/tdx's ../../bin); None if
    neither is there. tdx.tools asks it too."""
    for path in (os.path.join(package, "bin", name), os.path.join(package, "..", "..", "bin", name)):
        if os.path.exists(path):
            return path
    return None


def tool_env(env=None):
    """`env` (default os.environ) with TDX_TORCH_DIR naming this
    environment's torch, found without importing it: tdx-compile installed
    from the wheel compiles model binaries against that torch (a build's
    tdx-compile keeps the torch it was configured with)."""
    env = dict(os.environ if env is None else env)
    if "TDX_TORCH_DIR" not in env:
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.submodule_search_locations:
            env["TDX_TORCH_DIR"] = os.path.realpath(list(spec.submodule_search_locations)[0])
    return env


def _run(name):
    spec = importlib.util.find_spec("tdx")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{name}: the tdx package is not installed in {sys.prefix}")
    package = list(spec.submodule_search_locations)[0]
    path = beside(package, name)
    if path is None:
        sys.exit(f"{name}: not found beside {package}; reinstall tdx (pip install .)")
    os.execve(path, [name] + sys.argv[1:], tool_env())


def tdx_opt():
    _run("tdx-opt")


def tdx_compile():
    _run("tdx-compile")


def tdx_translate():
    _run("tdx-translate")


def tdx_volume():
    _run("tdx-volume")
