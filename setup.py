"""tdx's build for pip (pyproject.toml has the project): scripts/build.sh
configures and builds the C++ into build/ (TDX_BUILD_DIR) against the torch
of the interpreter pip runs (a build for that torch already is reused as it
is), then build/python/tdx (the package, its extension and libraries) and
the tools (under tdx/bin, run by the console commands of tdx_tools.py) go
into the wheel; pip install -e puts build/python on sys.path instead."""

import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build", "setuptools"), exist_ok=True)
TOOLS = ("tdx-opt", "tdx-compile", "tdx-translate", "tdx-volume")


def _torch_dir():
    try:
        import torch
    except ImportError:
        sys.exit("tdx: pip install . builds against the torch of the environment it installs "
                 "into: pip install torch first, then pip install --no-build-isolation .")
    return os.path.realpath(os.path.dirname(torch.__file__))


def _built_for(build):
    """The torch folder the build `build` is configured for, or None."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("TDX_TORCH_DIR:INTERNAL="):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


class BuildWithCMake(build_py):
    def run(self):
        build = os.environ.get("TDX_BUILD_DIR", os.path.join(ROOT, "build"))
        env = dict(os.environ, TDX_PYTHON=sys.executable)
        if _built_for(build) == _torch_dir():
            # The build is for this torch already (another environment over
            # it): built as it is configured, its interpreter kept.
            env = dict(os.environ, TDX_SKIP_SETUP="1")
            env.pop("TDX_PYTHON", None)
        # The build's output on stderr: pip shows it with -v, and on failure.
        subprocess.run([os.path.join(ROOT, "scripts", "build.sh")], env=env, check=True,
                       stdout=sys.stderr)
        super().run()           # tdx_tools.py
        if self.editable_mode:
            return              # pip install -e: the build's folder is on sys.path
        package = os.path.join(self.build_lib, "tdx")
        shutil.copytree(os.path.join(build, "python", "tdx"), package, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.makedirs(os.path.join(package, "bin"), exist_ok=True)
        for tool in TOOLS:
            shutil.copy2(os.path.join(build, "bin", tool), os.path.join(package, "bin", tool))


class BinaryDistribution(Distribution):
    """A wheel for this platform: the package holds compiled code."""

    def has_ext_modules(self):
        return True


# The package is the build's build/python (the sources with the extension
# and libraries beside them, as ninja keeps it); pip install -e puts that
# folder on sys.path.
setup(packages=[], py_modules=["tdx_tools"],
      package_dir={"": os.path.relpath(os.path.join(os.environ.get(
          "TDX_BUILD_DIR", os.path.join(ROOT, "build")), "python"), ROOT)},
      cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution,
      # setuptools' own staging, apart from CMake's tree.
      options={"build": {"build_base": os.path.join("build", "setuptools")},
               "egg_info": {"egg_base": os.path.join("build", "setuptools")}})
