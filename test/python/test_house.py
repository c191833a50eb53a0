"""The house's shape (issue 57): scripts/house.py finds no import circle in
python/tdx or lib/ and no source file over 700 lines; and it finds what it
looks for (a circle it is shown, the build's objects read)."""

import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import house  # noqa: E402


def test_no_import_circle_and_no_file_over_700_lines():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "house.py")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    counts = {m[0]: (int(m[1]), int(m[2]), int(m[3])) for m in re.findall(
        r"^(\S+): (\d+) files, (\d+) dependencies, (\d+) import circles", done.stdout, re.M)}
    # Read, not vacuous: every python module and every lib/ object was seen.
    assert counts["python/tdx"][0] >= 30 and counts["python/tdx"][1] >= 100, done.stdout
    assert counts["lib"][0] >= 50 and counts["lib"][1] >= 100, done.stdout
    assert counts["python/tdx"][2] == 0 and counts["lib"][2] == 0


def test_the_check_finds_a_circle_it_is_shown():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert house.circles(graph) == [["a", "b", "c"]]
    assert house.circles({"a": {"b"}, "b": set()}) == []
