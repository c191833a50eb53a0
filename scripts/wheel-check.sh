#!/usr/bin/env bash
# The self-contained wheel, checked where no MLIR is installed (issue 57):
#  1. pip wheel . (setup.py: build/wheel, MLIR and LLVM linked statically);
#  2. the wheel's size, and ldd of its extension and tools: no libMLIR or
#     libLLVM among what they load;
#  3. a fresh virtual environment holding only pip's torch (from the wheels
#     scripts/setup.sh downloaded: nothing new is fetched) and the wheel;
#  4. in a mount namespace (unshare -m, as root) where /usr/lib/llvm-22 (every
#     file of Debian's LLVM, Clang and MLIR 22 packages), the checkout and
#     ~/.cache/tdx (the development environment and its torch) are empty
#     folders: the README's example, examples/gpt_2x2.py, from another folder.
# Takes a few minutes after a build (the static links, torch's install).
# TDX_WHEEL_CHECK_DIR: where to work (default a new folder under /tmp).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${TDX_WHEEL_CHECK_DIR:-$(mktemp -d /tmp/tdx-wheel-check.XXXXXX)}"
cache="${HOME:-/root}/.cache/tdx"
python="$("$root/scripts/setup.sh" | sed -n 's/^setup: python //p' | tail -1)"
[ -n "$python" ] || { echo "wheel-check: scripts/setup.sh failed" >&2; exit 1; }
mkdir -p "$work/dist" "$work/elsewhere"
rm -f "$work"/dist/tdx-*.whl

echo "== pip wheel ."
(cd "$root" && "$python" -m pip wheel -q --no-build-isolation --no-deps --no-index \
  -w "$work/dist" .) 2> "$work/wheel-build.log" ||
  { tail -30 "$work/wheel-build.log"; exit 1; }
wheel="$(ls "$work"/dist/tdx-*.whl)"
echo "$(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"

echo "== a fresh environment: pip's torch, then the wheel"
rm -rf "$work/env"
/usr/bin/python3 -m venv "$work/env"
"$work/env/bin/python" -m pip install -q --no-index --find-links "$cache/wheels" "$wheel"
"$work/env/bin/python" -m pip list --format=freeze | grep -E '^(torch|tdx)==' | tr '\n' ' '
echo
package="$("$work/env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/tdx"

echo "== ldd: what the extension and tools load"
bad=0
for f in "$package"/_C*.so "$package"/bin/tdx-*; do
  libs="$(ldd "$f" | grep -E 'libMLIR|libLLVM|not found' || true)"
  if [ -n "$libs" ]; then echo "$(basename "$f"): $libs"; bad=1; else
    echo "$(basename "$f"): no libMLIR or libLLVM"; fi
done
[ "$bad" = 0 ] || { echo "wheel-check: FAILED (ldd)"; exit 1; }

echo "== without MLIR: /usr/lib/llvm-22, $root and $cache hidden"
cp "$root/examples/gpt_2x2.py" "$work/elsewhere/"
unshare -m bash -euo pipefail -c '
  for d in /usr/lib/llvm-22 "$1" "$2"; do mount -t tmpfs none "$d"; done
  echo "/usr/lib/llvm-22 holds $(ls -A /usr/lib/llvm-22 | wc -l) files; libMLIR found by ldconfig: $(ldconfig -p | grep -c libMLIR || true)"
  for f in "$3"/_C*.so "$3"/bin/tdx-*; do
    ! ldd "$f" | grep "not found" || { echo "unresolved in $f"; exit 1; }
  done
  cd "$4/elsewhere"
  export PATH="$4/env/bin:/usr/bin:/bin" TDX_CACHE_DIR="$4/compile-cache"
  unset PYTHONPATH TDX_PYTHON
  tdx-opt --version | head -2
  python gpt_2x2.py
' wheel-check "$root" "$cache" "$package" "$work" | tee "$work/example.log"
grep -q "materialized: bitwise equal to eager construction: True" "$work/example.log"
echo "wheel-check: passed ($work)"
