"""tdx's build for pip (pyproject.toml has the project).

pip install . / pip wheel .: scripts/build.sh configures and builds the
wheel's parts into build/wheel (TDX_BUILD_DIR) with MLIR and LLVM linked
statically (TDX_STATIC_MLIR), against the torch of the interpreter pip runs
(a build for that torch already is reused as it is). The wheel holds the tdx
package with its extension, the tools (tdx/bin, run by tdx_tools.py's
console commands) and the runtime tdx-compile compiles model binaries
against (tdx/runtime: its headers and static libraries); it needs no MLIR
where it is installed, and requires the torch it was built against.

pip install -e .: the development build, build/ (TDX_BUILD_DIR), built in
full as scripts/build.sh builds it, and its build/python put on sys.path."""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build", "setuptools"), exist_ok=True)
TOOLS = ("tdx-opt", "tdx-compile", "tdx-translate", "tdx-volume")


def _torch():
    """(folder, version) of the torch pip builds against."""
    try:
        import torch
    except ImportError:
        sys.exit("tdx: pip install . builds against the torch of the environment it installs "
                 "into: pip install torch first, then pip install --no-build-isolation .")
    return os.path.realpath(os.path.dirname(torch.__file__)), torch.__version__


def _configured(build, entry):
    """The value of `entry` ("TDX_TORCH_DIR:INTERNAL") in the CMake cache of
    the build `build`, or None."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith(entry + "="):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def _build(build, targets, cmake_args=""):
    env = dict(os.environ, TDX_PYTHON=sys.executable, TDX_CMAKE_ARGS=cmake_args)
    if _configured(build, "TDX_TORCH_DIR:INTERNAL") == _torch()[0]:
        # The build is for this torch already (another environment over
        # it): built as it is configured, its interpreter kept while it
        # exists (a configure the build reruns needs one: a throwaway
        # environment's may be gone).
        env = dict(os.environ, TDX_SKIP_SETUP="1")
        if os.path.exists(_configured(build, "TDX_PYTHON:FILEPATH") or ""):
            env.pop("TDX_PYTHON", None)
        else:
            env["TDX_PYTHON"] = sys.executable
    env["TDX_BUILD_DIR"] = build
    # The build's output on stderr: pip shows it with -v, and on failure.
    subprocess.run([os.path.join(ROOT, "scripts", "build.sh"), *targets], env=env, check=True,
                   stdout=sys.stderr)


def _strip(path):
    """Symbols a user never needs dropped (a third of the tools' size)."""
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", path], check=False)


class BuildWithCMake(build_py):
    def run(self):
        if self.editable_mode:
            # pip install -e: the development build's folder is on sys.path.
            _build(os.environ.get("TDX_BUILD_DIR", os.path.join(ROOT, "build")), [])
            super().run()           # tdx_tools.py
            return
        build = os.environ.get("TDX_BUILD_DIR", os.path.join(ROOT, "build", "wheel"))
        # (tdx-compile depends on the runtime archives it links binaries with.)
        _build(build, [*TOOLS, "tdx-python"], "-DTDX_STATIC_MLIR=ON")
        super().run()
        # tdx_tools.py as this build copied it (package_dir names the
        # development build's, which pip install -e puts on sys.path).
        shutil.copy2(os.path.join(build, "python", "tdx_tools.py"), self.build_lib)
        package = os.path.join(self.build_lib, "tdx")
        shutil.copytree(os.path.join(build, "python", "tdx"), package, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        for lib in glob.glob(os.path.join(package, "*.so")):
            _strip(lib)
        os.makedirs(os.path.join(package, "bin"), exist_ok=True)
        for tool in TOOLS:
            shutil.copy2(os.path.join(build, "bin", tool), os.path.join(package, "bin", tool))
            _strip(os.path.join(package, "bin", tool))
        # The runtime model binaries compile against: its headers (all of
        # include/tdx: the runtime's include the state format's and the
        # store's) and the archives CMake lists (tools/tdx-compile), found
        # by tdx-compile beside its bin/.
        runtime = os.path.join(package, "runtime")
        shutil.copytree(os.path.join(ROOT, "include", "tdx"),
                        os.path.join(runtime, "include", "tdx"), dirs_exist_ok=True)
        os.makedirs(os.path.join(runtime, "lib"), exist_ok=True)
        with open(os.path.join(build, "lib", "runtime-archives.txt")) as f:
            for archive in f.read().split():
                shutil.copy2(archive, os.path.join(runtime, "lib"))


class BinaryDistribution(Distribution):
    """A wheel for this platform: the package holds compiled code."""

    def has_ext_modules(self):
        return True


# The extension is built against one torch's C++ API: the wheel requires
# that torch's minor version.
_major_minor = ".".join(_torch()[1].split("+")[0].split(".")[:2])
# The package is the build's build/python (the sources with the extension
# and libraries beside them, as ninja keeps it); pip install -e puts that
# folder on sys.path.
setup(packages=[], py_modules=["tdx_tools"],
      package_dir={"": os.path.relpath(os.path.join(os.environ.get(
          "TDX_BUILD_DIR", os.path.join(ROOT, "build")), "python"), ROOT)},
      install_requires=[f"torch=={_major_minor}.*", "numpy", "tqdm"],
      cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution,
      # setuptools' own staging, apart from CMake's tree.
      options={"build": {"build_base": os.path.join("build", "setuptools")},
               "egg_info": {"egg_base": os.path.join("build", "setuptools")}})
