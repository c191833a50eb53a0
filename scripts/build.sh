#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures and builds tdx into build/.
# Environment: TDX_BUILD_DIR (default build), TDX_JOBS (default 2),
# TDX_SKIP_SETUP=1 to skip the package check.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TDX_BUILD_DIR:-$root/build}"
jobs="${TDX_JOBS:-2}"

if [ "${TDX_SKIP_SETUP:-0}" != 1 ]; then
  "$root/scripts/setup.sh"
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
fi
# ccache (CMakeLists.txt launches the compilers through it) reads paths
# under the checkout as relative: another clone of the same sources, as CI
# makes, hits the cache too.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
ninja -C "$build" -j "$jobs" "$@"
