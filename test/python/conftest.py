import os
import sys

# The package is built into build/python (scripts/build.sh); tests run with
# PYTHONPATH pointing there (build/env.sh). Fail early with the fix.
try:
    import tdx  # noqa: F401
except ImportError as e:  # pragma: no cover
    raise ImportError(f"cannot import tdx ({e}); build it with scripts/build.sh and "
                      f"run the tests with scripts/test.sh (or source build/env.sh)")

sys.path.insert(0, os.path.dirname(__file__))
