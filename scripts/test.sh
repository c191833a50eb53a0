#!/usr/bin/env bash
# Sets up, builds and runs the whole tdx test suite (lit: FileCheck tests and
# the C++ unit tests), then prints one summary line: "N passed, N failed".
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TDX_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh" || exit 1

rm -f "$build/test/results.json"
ninja -C "$build" check-tdx
status=$?
if [ ! -f "$build/test/results.json" ]; then
  echo "tdx: the test suite did not run (see the errors above)" >&2
  exit 1
fi
/usr/bin/python3 - "$build/test/results.json" <<'PY'
import json, sys
tests = json.load(open(sys.argv[1]))["tests"]
codes = [t["code"] for t in tests]
passed = sum(c in ("PASS", "XFAIL") for c in codes)
skipped = sum(c == "UNSUPPORTED" for c in codes)
failed = len(codes) - passed - skipped
print(f"tdx: {passed} passed, {failed} failed, {skipped} skipped")
PY
exit $status
