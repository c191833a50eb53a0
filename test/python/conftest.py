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

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long cases, skipped unless TDX_SLOW=1")


def pytest_collection_modifyitems(config, items):
    """Cases marked slow run with TDX_SLOW=1 (the default run keeps CI short)."""
    if os.environ.get("TDX_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with TDX_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """The e2e op suite's count per backend and its expected-failure table."""
    suite = sys.modules.get("test_e2e_ops")
    if not suite or not any(suite.RESULTS.values()):
        return
    from e2e_cases import XFAIL
    write = terminalreporter.write_line
    write("e2e op suite (test/python/e2e_cases.py):")
    for backend, cases in sorted(suite.RESULTS.items()):
        passed = sorted(n for n, r in cases.items() if r == "pass")
        failed = sorted(n for n, r in cases.items() if r != "pass")
        write(f"  {backend:13s} {len(passed)} ops pass, {len(failed)} fail "
              f"({len(XFAIL[backend])} expected)")
        for n in failed:
            write(f"    {n}: {XFAIL[backend].get(n) or cases[n]}")
