#!/usr/bin/env bash
# Sets up, builds and runs the whole tdx test suite (lit: FileCheck tests and
# the C++ unit tests; pytest: the Python package), then prints one summary
# line for both: "tdx: N passed, N failed, N skipped".
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TDX_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh" || exit 1

rm -f "$build/test/results.json" "$build/test/pytest.xml"
# lit: FileCheck tests and the C++ unit tests.
ninja -C "$build" check-tdx
lit_status=$?
# pytest: the Python package, with Debian's Python (the one that has torch).
(. "$build/env.sh" && cd "$root/test/python" &&
  timeout 3600 /usr/bin/python3 -m pytest -q -p no:cacheprovider \
    --junitxml="$build/test/pytest.xml")
py_status=$?
if [ ! -f "$build/test/results.json" ] || [ ! -f "$build/test/pytest.xml" ]; then
  echo "tdx: a test runner did not run (see the errors above)" >&2
  exit 1
fi
/usr/bin/python3 - "$build/test/results.json" "$build/test/pytest.xml" <<'PY'
import json, sys
import xml.etree.ElementTree as ET
codes = [t["code"] for t in json.load(open(sys.argv[1]))["tests"]]
passed = sum(c in ("PASS", "XFAIL") for c in codes)
skipped = sum(c == "UNSUPPORTED" for c in codes)
failed = len(codes) - passed - skipped
root = ET.parse(sys.argv[2]).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
n = int(suite.get("tests")); f = int(suite.get("failures")) + int(suite.get("errors"))
s = int(suite.get("skipped"))
passed += n - f - s; failed += f; skipped += s
print(f"tdx: {passed} passed, {failed} failed, {skipped} skipped")
PY
[ $lit_status -eq 0 ] && [ $py_status -eq 0 ]
