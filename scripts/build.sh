#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures and builds tdx into build/.
# Environment: TDX_BUILD_DIR (default build), TDX_JOBS (default 2),
# TDX_SKIP_SETUP=1 to skip the set-up (then TDX_PYTHON, or the build's
# configured interpreter, is used), TDX_PYTHON to build against the torch of
# another interpreter (see scripts/setup.sh), TDX_CMAKE_ARGS for a new
# build's configure (setup.py's wheel: -DTDX_STATIC_MLIR=ON). Arguments are
# ninja's (targets).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TDX_BUILD_DIR:-$root/build}"
jobs="${TDX_JOBS:-2}"

python="${TDX_PYTHON:-}"
if [ "${TDX_SKIP_SETUP:-0}" != 1 ]; then
  # setup.sh's last line names the interpreter: "setup: python PATH".
  python="$("$root/scripts/setup.sh" | tee /dev/stderr | sed -n 's/^setup: python //p' | tail -1)"
  [ -n "$python" ] || { echo "build: scripts/setup.sh failed" >&2; exit 1; }
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${python:+-DTDX_PYTHON="$python"} \
    ${TDX_CMAKE_ARGS:-}
elif [ -n "$python" ] && ! grep -qx "TDX_PYTHON:FILEPATH=$python" "$build/CMakeCache.txt"; then
  # Another interpreter (a changed requirements.txt makes a new environment).
  cmake "$build" -DTDX_PYTHON="$python"
fi
# ccache (CMakeLists.txt launches the compilers through it) reads paths
# under the checkout as relative: another clone of the same sources, as CI
# makes, hits the cache too.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
ninja -C "$build" -j "$jobs" "$@"
