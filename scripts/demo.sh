#!/usr/bin/env bash
# The main job, end to end on the built-in example: set up, build, then run
# the GPT-2-style example model (examples/gpt2-tiny.mlir) through tdx-opt:
# parse and verify it, run canonicalize and cse, and print the model summary
# (parameters, init, shardings, forward op counts).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TDX_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh" tdx-opt
model="${1:-$root/examples/gpt2-tiny.mlir}"

echo
echo "== tdx-opt $(basename "$model") --tdx-model-summary --canonicalize --cse"
"$build/bin/tdx-opt" "$model" \
  --pass-pipeline='builtin.module(tdx-model-summary,canonicalize,cse)' \
  -o "$build/$(basename "$model" .mlir).opt.mlir"
echo
echo "== forward after canonicalize + cse (first 12 lines; all in $build/$(basename "$model" .mlir).opt.mlir)"
sed -n '/func.func @forward/,$p' "$build/$(basename "$model" .mlir).opt.mlir" | head -12
