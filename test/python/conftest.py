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


# The OpInfo test's result per stage and op, and each stage's seconds
# (test_opinfo.py records them as the property "opinfo").
OPINFO_RESULTS, OPINFO_TIMES = {}, {}


def pytest_runtest_logreport(report):
    if report.when == "call":
        for key, value in report.user_properties:
            if key == "e2e":
                backend, name, result = value
                E2E_RESULTS.setdefault(backend, {})[name] = result
            elif key == "opinfo":
                stage, name, result, seconds = value
                OPINFO_RESULTS.setdefault(stage, {})[name] = result
                if seconds is not None:
                    OPINFO_TIMES[stage] = seconds


def opinfo_summary(write):
    """Each stage's count of ops that match eager, its time, and the ops
    that fail grouped by their expected-failure reason."""
    from opinfo_cases import STAGES, XFAIL
    write("OpInfo (test/python/test_opinfo.py, torch's op_db, first float32 sample):")
    for stage in [s for s in STAGES if s in OPINFO_RESULTS]:
        ops = OPINFO_RESULTS[stage]
        passed = sum(r == "pass" for r in ops.values())
        steps = {}
        for r in ops.values():
            if r != "pass":
                step = r.split(":")[0]
                steps[step] = steps.get(step, 0) + 1
        from test_opinfo import invalid_ir
        wrong = sum(r.startswith("compare:") for r in ops.values())
        invalid = sum(r != "pass" and invalid_ir(r) for r in ops.values())
        write(f"  {stage:13s} {passed} of {len(ops)} ops match eager ({100 * passed / len(ops):.1f}%);"
              f" fail at " + ", ".join(f"{k} {v}" for k, v in sorted(steps.items())) +
              f"; wrong numbers {wrong}, invalid IR from a pass {invalid};"
              f" {OPINFO_TIMES.get(stage, 0):.0f} s")
    reasons = {}
    for stage, ops in OPINFO_RESULTS.items():
        for name, r in ops.items():
            if r != "pass":
                reasons.setdefault(XFAIL[stage].get(name) or f"UNEXPECTED: {r}", {}) \
                    .setdefault(name, []).append(stage)
    for why, names in sorted(reasons.items()):
        write(f"    {why}:")
        write("      " + ", ".join(f"{n} ({', '.join(s)})" if len(s) < 4 else n
                                   for n, s in sorted(names.items())))


def pytest_terminal_summary(terminalreporter):
    """The e2e op suite's count per backend and its expected-failure table,
    and the OpInfo test's."""
    if OPINFO_RESULTS:
        opinfo_summary(terminalreporter.write_line)
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
