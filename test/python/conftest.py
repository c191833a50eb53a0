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
    # Each test process's mpiruns get a session directory of their own: two
    # mpiruns starting at once (pytest-xdist's workers) race to create Open
    # MPI's shared /tmp/ompi.<host>.<uid> ("mkdir ... File exists").
    import shutil
    import tempfile
    session = tempfile.mkdtemp(prefix="tdx-test-mpi-")
    os.environ["OMPI_MCA_orte_tmpdir_base"] = session
    config.add_cleanup(lambda: shutil.rmtree(session, ignore_errors=True))


def pytest_collection_modifyitems(config, items):
    """Cases marked slow run with TDX_SLOW=1 (the default run keeps CI short).
    Cases that share a module-scoped fixture (a set of checkpoints, a
    bundle) go to one test process (pytest-xdist's --dist loadgroup), which
    makes the fixture once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        for name in info.names_closure if info else ():
            defs = info.name2fixturedefs.get(name) or ()
            if any(d.scope == "module" for d in defs):
                item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}.{name}"))
                break
    if os.environ.get("TDX_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with TDX_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# The e2e op suite's result per backend and case (test_e2e_ops.py records
# each as the property "e2e"), gathered from the reports.
E2E_RESULTS = {}


def pytest_runtest_logreport(report):
    if report.when == "call":
        for key, value in report.user_properties:
            if key == "e2e":
                backend, name, result = value
                E2E_RESULTS.setdefault(backend, {})[name] = result


def pytest_terminal_summary(terminalreporter):
    """The e2e op suite's count per backend and its expected-failure table."""
    if not E2E_RESULTS:
        return
    from e2e_cases import XFAIL
    write = terminalreporter.write_line
    write("e2e op suite (test/python/e2e_cases.py):")
    for backend, cases in sorted(E2E_RESULTS.items()):
        passed = sorted(n for n, r in cases.items() if r == "pass")
        failed = sorted(n for n, r in cases.items() if r != "pass")
        write(f"  {backend:13s} {len(passed)} ops pass, {len(failed)} fail "
              f"({len(XFAIL[backend])} expected)")
        for n in failed:
            write(f"    {n}: {XFAIL[backend].get(n) or cases[n]}")
