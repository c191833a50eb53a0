#!/usr/bin/env bash
# The CUDA path's check on a real GPU, in two halves (docs/runtime.md):
#
#   scripts/gpu-check.sh bundle OUT [--programs a,b] [--offline] [--no-cpu-expected]
#       here (tdx built): writes OUT, a self-contained folder under 60 MiB with
#       the emitted CUDA programs, their weights, inputs and expected outputs
#       (PyTorch eager and the CPU binaries), the CUDA runtime's sources,
#       Debian's Open MPI and run.sh
#   bash OUT/run.sh [--compile-only]
#       on the GPU machine: builds with nvcc, runs, compares, memchecks, times
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in
  bundle)
    shift
    [[ $# -ge 1 ]] || { echo "usage: scripts/gpu-check.sh bundle OUT [options]"; exit 2; }
    . "$ROOT/build/env.sh"
    exec "$TDX_PYTHON" "$ROOT/scripts/gpu-check/bundle.py" "$@"
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && exit 0
    exit 2
    ;;
esac
