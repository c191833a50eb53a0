#!/usr/bin/env bash
# The GPU check, run half, on a machine with a GPU, nvcc, CUDA, NCCL and a
# recent PyTorch (no Debian packages, no network needed):
#
#   bash run.sh                  build with nvcc, run every program on one GPU,
#                                compare with the expected outputs (training
#                                programs: losses per step and final state;
#                                loop programs: a user's loop on the runner's
#                                library, with eager's loop on this GPU too),
#                                memcheck a forward and a training step,
#                                time the binaries next to PyTorch eager
#   bash run.sh --compile-only   build only (the test suite runs this)
#
# Environment: NVCC (default: nvcc on PATH), TDX_CUDA_ARCH (default: the
# GPU's, else sm_90), NCCL_HOME (default: the CUDA toolkit's, the system's or
# PyTorch's nvidia-nccl wheel), TDX_GPU_CHECK_STEPS (timed steps, default 20),
# TDX_JOBS (compiles at once, default: the cores).
# Ends with "gpu-check: N passed, N failed" and the timing table.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/env.sh"
COMPILE_ONLY=0
[[ "${1:-}" == "--compile-only" ]] && COMPILE_ONLY=1
STEPS="${TDX_GPU_CHECK_STEPS:-20}"
PY="${PYTHON:-python3}"

NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
[[ -x "$NVCC" ]] || { echo "gpu-check: no nvcc (set NVCC=/path/to/nvcc)"; exit 2; }
CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$NVCC")")")}"
if [[ -z "${TDX_CUDA_ARCH:-}" ]]; then
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')"
  TDX_CUDA_ARCH="sm_${cap:-90}"
fi

nccl_dirs() {  # prints "INCLUDE_DIR LIBRARY_FILE"
  local c
  for c in "${NCCL_HOME:-}" "$CUDA_HOME" /usr /usr/local \
           "$("$PY" -c 'import nvidia.nccl as n; print(n.__path__[0])' 2>/dev/null)"; do
    [[ -n "$c" && -f "$c/include/nccl.h" ]] || continue
    for lib in "$c/lib/libnccl.so" "$c/lib64/libnccl.so" "$c/lib/x86_64-linux-gnu/libnccl.so" \
               "$c/lib/libnccl.so.2" "/usr/lib/x86_64-linux-gnu/libnccl.so"; do
      [[ -f "$lib" ]] && { echo "$c/include $lib"; return 0; }
    done
  done
  return 1
}
read -r NCCL_INCLUDE NCCL_LIB < <(nccl_dirs) || { echo "gpu-check: no NCCL (set NCCL_HOME)"; exit 2; }

BUILD="$HERE/build"
mkdir -p "$BUILD/obj"
FLAGS=(-std=c++17 -O2 --fmad=false "-arch=$TDX_CUDA_ARCH" -DOMPI_SKIP_MPICXX=1
       "-I$HERE/runtime/include" "-I$MPI_INCLUDE" "-I$MPI_PREFIX/include" "-I$NCCL_INCLUDE"
       "-I$CUDA_HOME/include"
       -Xcompiler -ffp-contract=off -Xcompiler -fPIC)
LIBS=("-L$CUDA_HOME/lib64" -lcublas -lcudart "$NCCL_LIB" "-L$MPI_LIB/openmpi/lib" -lmpi
      "-L$MPI_LIB" -lucp -lucs
      "-Xlinker=-rpath,$CUDA_HOME/lib64:$(dirname "$NCCL_LIB"):$MPI_LIB/openmpi/lib:$MPI_LIB")
echo "gpu-check: nvcc $("$NVCC" --version | tail -1), $TDX_CUDA_ARCH, NCCL $NCCL_LIB"
# Every compile runs as its own job, TDX_JOBS (default: the cores) at once:
# the runtime's files, then the programs, each into its own log.
JOBS="${TDX_JOBS:-$(nproc)}"
rm -f "$BUILD"/*.failed
compile() {  # compile NAME LOG COMMAND...: in the background, NAME.failed if it fails
  local name=$1 log=$2; shift 2
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n; done
  { "$@" > "$log" 2>&1 || { echo "gpu-check: FAILED to build $name:"; tail -20 "$log"
                             touch "$BUILD/$name.failed"; }; } &
}
for src in "$HERE"/runtime/lib/*.cpp "$HERE"/runtime/lib/cuda/*.cu; do
  obj="$BUILD/obj/$(basename "$src").o"
  compile "$(basename "$src")" "$obj.log" "$NVCC" "${FLAGS[@]}" -c "$src" -o "$obj"
done
wait
rm -f "$BUILD/libtdxcuda.a"
ar rcs "$BUILD/libtdxcuda.a" "$BUILD"/obj/*.o || touch "$BUILD/libtdxcuda.failed"
PROGRAMS=$("$PY" -c 'import json,sys; [print(p["name"], p["model"], p["ranks"], p["tolerance"], p["kind"], p["steps"]) for p in json.load(open(sys.argv[1]))["programs"]]' "$HERE/manifest.json")
# A loop program is a shared object (the runner's library, check.py loop
# loads it into each rank); the others are binaries.
artifact() { [[ $2 == loop ]] && echo "$BUILD/$1.so" || echo "$BUILD/$1"; }
while read -r name model ranks tol kind steps; do
  out="$(artifact "$name" "$kind")"; rm -f "$out"
  SHARED=(); [[ $kind == loop ]] && SHARED=(-shared -Xlinker -u,tdx_open)
  compile "$name" "$BUILD/$name.build.log" "$NVCC" "${FLAGS[@]}" "${SHARED[@]}" -o "$out" \
    "$HERE/programs/$name/program.cu" "$BUILD/libtdxcuda.a" "${LIBS[@]}"
done <<< "$PROGRAMS"
wait
built=0
while read -r name model ranks tol kind steps; do
  [[ -f "$(artifact "$name" "$kind")" ]] && built=$((built + 1))
done <<< "$PROGRAMS"
failed_build=$(find "$BUILD" -maxdepth 1 -name '*.failed' | wc -l)
if [[ $COMPILE_ONLY == 1 ]]; then
  echo "gpu-check: compile: $built programs built, $failed_build failures"
  exit $failed_build
fi

passed=0; failed=$failed_build
TABLE="$(printf '%-12s %5s %12s %12s %7s\n' program ranks tdx_ms eager_ms ratio)"
while read -r name model ranks tol kind steps; do
  dir="$HERE/programs/$name"; out="$BUILD/$name.out.safetensors"; log="$BUILD/$name.log"
  [[ -f "$(artifact "$name" "$kind")" ]] || continue
  if [[ $kind == loop ]]; then
    # The user's loop on every rank, the library loaded into each.
    echo "gpu-check: $name:"
    if ! timeout 600 mpirun -np "$ranks" --oversubscribe --bind-to none "$PY" "$HERE/check.py" \
         loop "$dir" "$BUILD/$name.so" "$out" "$BUILD/$name.state.safetensors" \
         < /dev/null > "$log" 2>&1; then
      echo "gpu-check: $name: FAILED to run:"; grep -m 3 "tdx: \|loop: " "$log" || tail -5 "$log"
      failed=$((failed + 1)); continue
    fi
    if "$PY" "$HERE/check.py" compare "$dir" "$out" --tolerance "$tol" \
         --state "$BUILD/$name.state.safetensors" --gpu-eager "$model" < /dev/null; then
      passed=$((passed + 1))
    else
      echo "gpu-check: $name: FAILED (outputs differ)"; failed=$((failed + 1))
    fi
    continue
  fi
  # A forward runs $STEPS times on its input; a training program runs its
  # steps on its batches and saves the final state.
  if [[ $kind == train ]]; then
    RUN=(--batches "$dir/batches.safetensors" --steps "$steps" --save-state "$BUILD/$name.state.safetensors")
    COMPARE=(--state "$BUILD/$name.state.safetensors" --gpu-eager "$model"); EAGER=(--train)
  else
    RUN=(--inputs "$dir/in.safetensors" --steps "$STEPS"); COMPARE=(); EAGER=()
  fi
  if ! mpirun -np "$ranks" --oversubscribe --bind-to none "$BUILD/$name" \
       --params "$dir/params.safetensors" "${RUN[@]}" --outputs "$out" \
       --verbose < /dev/null > "$log" 2>&1; then
    if [[ $ranks -gt 1 ]] && grep -qi "duplicate GPU\|same device\|invalid usage" "$log"; then
      echo "gpu-check: $name: skipped (NCCL refuses $ranks ranks on one GPU)"; continue
    fi
    echo "gpu-check: $name: FAILED to run:"
    grep -m 3 "tdx: " "$log" || tail -5 "$log"
    failed=$((failed + 1)); continue
  fi
  echo "gpu-check: $name:"
  if "$PY" "$HERE/check.py" compare "$dir" "$out" --tolerance "$tol" "${COMPARE[@]}" < /dev/null; then
    passed=$((passed + 1))
  else
    echo "gpu-check: $name: FAILED (outputs differ)"; failed=$((failed + 1))
  fi
  tdx_ms=$(sed -n 's/.*ranks: init [0-9.]* ms, step \([0-9.]*\) ms.*/\1/p' "$log" | head -1)
  eager_ms=$("$PY" "$HERE/check.py" eager "$dir" "$model" --steps "$STEPS" "${EAGER[@]}" 2>/dev/null < /dev/null |
             sed -n 's/^eager_ms //p')
  ratio=$("$PY" -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" \
          "${tdx_ms:-nan}" "${eager_ms:-nan}" 2>/dev/null)
  TABLE+=$'\n'"$(printf '%-12s %5s %12s %12s %7s' "$name" "$ranks" "${tdx_ms:-?}" "${eager_ms:-?}" "${ratio:-?}")"
done <<< "$PROGRAMS"

# More ranks than GPUs with NCCL forced (no host-memory path): every rank
# ends with an error that says so, within the timeout.
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
two=$(awk '$3 == 2 && $5 == "forward" { print $1; exit }' <<< "$PROGRAMS")
if [[ -n "$two" && -x "$BUILD/$two" && $gpus -lt 2 ]]; then
  dir="$HERE/programs/$two"
  TDX_CUDA_COLLECTIVES=nccl timeout 120 mpirun -np 2 --oversubscribe "$BUILD/$two" \
    --params "$dir/params.safetensors" --inputs "$dir/in.safetensors" < /dev/null \
    > "$BUILD/more-ranks-than-gpus.log" 2>&1
  rc=$?
  if [[ $rc != 0 && $rc != 124 ]] && grep -q "leaves no host-memory path" "$BUILD/more-ranks-than-gpus.log"; then
    echo "gpu-check: 2 ranks on $gpus GPU with NCCL forced: refused by name"; passed=$((passed + 1))
  else
    echo "gpu-check: 2 ranks on $gpus GPU with NCCL forced: FAILED (exit $rc)"
    tail -5 "$BUILD/more-ranks-than-gpus.log"; failed=$((failed + 1))
  fi
fi

# The first one-rank forward and training programs under compute-sanitizer's
# memcheck (one training step).
SANITIZER="$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")"
for want in forward train; do
  first=$(awk -v k="$want" '$3 == 1 && $5 == k { print $1; exit }' <<< "$PROGRAMS")
  [[ -n "$first" && -x "$BUILD/$first" ]] || continue
  if [[ ! -x "$SANITIZER" ]]; then
    echo "gpu-check: memcheck: no compute-sanitizer"; failed=$((failed + 1)); break
  fi
  dir="$HERE/programs/$first"
  if [[ $want == train ]]; then
    RUN=(--batches "$dir/batches.safetensors" --steps 1)
  else
    RUN=(--inputs "$dir/in.safetensors")
  fi
  if mpirun -np 1 "$SANITIZER" --tool memcheck --error-exitcode 9 "$BUILD/$first" \
       --params "$dir/params.safetensors" "${RUN[@]}" \
       --outputs "$BUILD/memcheck.safetensors" < /dev/null > "$BUILD/memcheck.$first.log" 2>&1; then
    echo "gpu-check: memcheck $first: clean"; passed=$((passed + 1))
  else
    echo "gpu-check: memcheck $first: FAILED"; tail -20 "$BUILD/memcheck.$first.log"
    failed=$((failed + 1))
  fi
done

echo "gpu-check: $passed passed, $failed failed"
echo "$TABLE"
[[ $failed == 0 ]]
