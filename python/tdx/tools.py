"""Where tdx's command-line tools are (the installed package's ``bin``,
a build's ``bin`` beside ``build/python``, else ``PATH``), and what a model binary's signature says: the
torch dtypes it names, the state a checkpoint of it must hold."""

import os
import shutil

from . import _C
from .errors import TdxError

# torch dtypes by the safetensors name a binary's --signature gives
# (include/tdx/StateFormat/DTypes.def).
_TORCH_DTYPES = {stored: dtype for _, dtype, _, stored in _C.dtypes()}


def _tool(name):
    """The path of tool `name`: the package's own (pip install), the
    build's (build/python/tdx's ../../bin), else PATH's."""
    from tdx_tools import beside
    path = beside(os.path.dirname(os.path.abspath(__file__)), name) or shutil.which(name)
    if not path:
        raise TdxError(f"cannot find {name}; install tdx (pip install .) or build it "
                       f"(scripts/build.sh) and source build/env.sh")
    return path


def tool_env():
    """The environment a tool runs in: this one, with TDX_TORCH_DIR naming
    its torch (what tdx-compile installed from the wheel compiles against)."""
    from tdx_tools import tool_env as env
    return env()


def required_state(signature):
    """The state names a checkpoint of a program (``exe.signature()``) must
    hold: its parameters and persistent buffers (not optimizer state, which
    a fresh optimizer makes, nor non-persistent buffers, nor tied names)."""
    transient = set(signature.get("non_persistent", []))
    return [p["name"] for p in signature["params"]
            if not p["name"].startswith("optimizer.") and p["name"] not in transient]
