#!/usr/bin/env bash
# Builds tdx without torch's reserved DispatchKey::Fake
# (-DTDX_CAPTURE_KEYS=OFF) into build-keyfree/ and runs, on that build, the
# capture's C++ unit tests and the Python capture tests: what tdx is the day
# torch deletes the key (docs/capture.md, "Two ways in"). The default suite
# runs the same Python tests on the key-free way of the default build
# (scripts/test.sh, tier pytest-keyfree); this script shows the key's use is
# compiled out too. A second build of the whole tree (mostly ccache hits
# after the default build).
#
# Environment: TDX_KEYFREE_BUILD_DIR (default build-keyfree), TDX_JOBS.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TDX_KEYFREE_BUILD_DIR:-$root/build-keyfree}"
python="$("$root/scripts/setup.sh" | sed -n 's/^setup: python //p' | tail -1)"
[ -n "$python" ] || { echo "test-keyfree-build: scripts/setup.sh failed" >&2; exit 1; }
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTDX_PYTHON="$python" \
    -DTDX_CAPTURE_KEYS=OFF
fi
grep -qx "TDX_CAPTURE_KEYS:BOOL=OFF" "$build/CMakeCache.txt" ||
  { echo "test-keyfree-build: $build is not configured with TDX_CAPTURE_KEYS=OFF" >&2; exit 1; }
TDX_BUILD_DIR="$build" TDX_SKIP_SETUP=1 TDX_PYTHON="$python" \
  "$root/scripts/build.sh"
"$build/test/unit/tdx-capture-unittests"
. "$build/env.sh"
cd "$root/test/python"
"$TDX_PYTHON" -c 'import tdx; w = tdx.capture_way(); assert w == "dispatch-mode", w; print("capture way:", w)'
# The keyed way is not in this build: asking for it names the fix.
TDX_CAPTURE=fake-key "$TDX_PYTHON" -c '
import tdx
try:
    tdx.capture_way()
except tdx.CaptureError as e:
    assert "built without the dispatch keys" in str(e), e
    print("fake-key refused:", e)
else:
    raise SystemExit("TDX_CAPTURE=fake-key ran in a build without the key")'
TDX_CACHE_DIR="${TDX_CACHE_DIR-$root/build/test/compile-cache}" TDX_OPT_LEVEL="${TDX_OPT_LEVEL-0}" \
  "$TDX_PYTHON" -m pytest -q -p no:cacheprovider -n "${TDX_TEST_JOBS:-2}" \
  test_capture.py test_deferred_init.py test_torch_support.py test_sharding.py test_modern_decoder.py
