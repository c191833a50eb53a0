"""The torch versions tdx supports, checked in one place.

Read by ``import tdx`` (which refuses an unsupported torch with
:class:`UnsupportedTorchError`, before loading its extension), by
``scripts/setup.sh`` and by
CMake's configure step (run as a script: exit status 1 and the reason on
stderr for a torch tdx cannot build against; otherwise prints nothing).
"""

import sys

# The oldest torch tdx builds and runs with, and the newest it was tested on.
MINIMUM = (2, 11)
TESTED = ("2.15.0",)
FIX = ("install a supported torch (requirements.txt pins the tested one; scripts/setup.sh "
       "makes a virtual environment with it), or point TDX_PYTHON at an interpreter that has one")


class UnsupportedTorchError(ImportError):
    """``import tdx`` with a torch it does not support; the message names
    the version found, the versions supported and the fix."""


def check(version):
    """Raises UnsupportedTorchError for an unsupported torch `version`."""
    why = problem(version)
    if why:
        raise UnsupportedTorchError(why)


def parse(version):
    """(major, minor) of a torch version string such as '2.15.0+cu132'."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def problem(version):
    """Why torch `version` is unsupported, or None."""
    if parse(version) < MINIMUM:
        return (f"tdx needs torch >= {MINIMUM[0]}.{MINIMUM[1]} (tested: {', '.join(TESTED)}), "
                f"but this Python has torch {version}; {FIX}")
    return None


def main():
    try:
        import torch
    except ImportError as e:
        print(f"tdx: {sys.executable} cannot import torch ({e}); {FIX}", file=sys.stderr)
        return 1
    why = problem(torch.__version__)
    if why:
        print(why, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
