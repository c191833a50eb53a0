#!/usr/bin/env bash
# The main job, end to end on the built-in examples: set up, build, then
#  1. run the GPT-2-style example model (examples/gpt2-tiny.mlir) through
#     tdx-opt: verify it, print the model summary (parameters, init, forward
#     op counts), canonicalize and cse;
#  2. shard a GPT-style decoder on a 2x2 (dp, tp) mesh (examples/gpt-2x2.mlir):
#     propagate placements, insert collectives, partition into the per-rank
#     program, and print the communication report;
#  3. the same from Python (examples/gpt_2x2.py): deferred-init a GPT-style
#     model, trace it, parallelize it on a 2x2 mesh, report its
#     communication, and materialize it bitwise equal to eager.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TDX_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh"
model="$root/examples/gpt2-tiny.mlir"
sharded="$root/examples/gpt-2x2.mlir"

# Each step's full output goes to a file under build/; the screen gets one
# line of what it found (at most 10 lines after the build in all).
summary="$build/$(basename "$model" .mlir).summary.txt"
"$build/bin/tdx-opt" "$model" \
  --pass-pipeline='builtin.module(tdx-model-summary,canonicalize,cse)' \
  -o "$build/$(basename "$model" .mlir).opt.mlir" > "$summary"
echo "tdx-opt $(basename "$model") (verify, tdx-model-summary, canonicalize, cse):" \
  "$(sed -n 's/^total parameters: /parameters: /p' "$summary");" \
  "$(sed -n 's/^func @forward: /forward: /p' "$summary") [build/$(basename "$summary")]"

"$build/bin/tdx-opt" "$sharded" --tdx-place --tdx-spmd --tdx-comm-report \
  -o "$build/gpt-2x2.local.mlir" > "$build/gpt-2x2.comm.txt"
echo "tdx-opt $(basename "$sharded") on a 2x2 dp x tp mesh (--tdx-place --tdx-spmd" \
  "--tdx-comm-report): $(sed -n 's/^total: //p' "$build/gpt-2x2.comm.txt") [build/gpt-2x2.comm.txt]"

echo "python examples/gpt_2x2.py:"
(. "$build/env.sh" && "$TDX_PYTHON" "$root/examples/gpt_2x2.py")
