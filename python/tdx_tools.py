"""The console commands pip installs (tdx-opt, tdx-compile, tdx-translate,
tdx-volume): each runs the tool of that name the installed tdx package
holds (tdx/bin; with pip install -e, the build's bin), without importing
tdx (no torch at start-up). CMake copies it beside the package in
build/python."""

import importlib.util
import os
import sys


def _run(name):
    spec = importlib.util.find_spec("tdx")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{name}: the tdx package is not installed in {sys.prefix}")
    package = list(spec.submodule_search_locations)[0]
    # The wheel's tools, or the build's (pip install -e: build/python/tdx).
    for path in (os.path.join(package, "bin", name), os.path.join(package, "..", "..", "bin", name)):
        if os.path.exists(path):
            os.execv(path, [name] + sys.argv[1:])
    sys.exit(f"{name}: not found beside {package}; reinstall tdx (pip install .)")


def tdx_opt():
    _run("tdx-opt")


def tdx_compile():
    _run("tdx-compile")


def tdx_translate():
    _run("tdx-translate")


def tdx_volume():
    _run("tdx-volume")
