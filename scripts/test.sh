#!/usr/bin/env bash
# Sets up, builds and runs the tdx test suite, then prints the time of each
# tier and one summary line for all of them: "tdx: N passed, N failed, N
# skipped".
#
#   scripts/test.sh          everything (the README's command, and CI's)
#   scripts/test.sh quick    lit and the Python tests that compile little:
#                            the tier to run while iterating (a few minutes)
#   scripts/test.sh portable the numerical tests again as other CPUs of this
#                            machine kind run them: ATen's kernels for AVX2
#                            and for no vector unit (ATEN_CPU_CAPABILITY=avx2,
#                            =default), oneDNN's for AVX2
#                            (ONEDNN_MAX_CPU_ISA=AVX2), and the tests that
#                            pin eager's threads with the other count
#                            (TDX_TEST_THREADS=2); each variant's time. Run
#                            it after a change to numerics or to tests
#                            (33 minutes here with its binaries compiled for each
#                            capability, about 50 the first time; not in CI).
#
# Tiers: lit (FileCheck tests and the C++ unit tests), pytest-quick,
# pytest-keyfree (the capture tests on the key-free way), pytest-models (real models, training steps, the e2e op suite, the docs'
# examples, the GPU check's bundle), and pytest-cluster (jobs across test
# hosts, alone). Model binaries are compiled once per
# content into the compile cache, $TDX_CACHE_DIR (default
# build/test/compile-cache; remove it for a cold run). Both pytest tiers
# run in $TDX_TEST_JOBS processes (default 2, pytest-xdist; most of
# pytest-models' time is g++ compiling one model at a time). Long cases
# marked slow run with TDX_SLOW=1.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TDX_BUILD_DIR:-$root/build}"
tier="${1:-all}"
case "$tier" in
  all|quick|portable) ;;
  *) echo "usage: scripts/test.sh [quick|portable]  (no argument: every tier)" >&2; exit 2 ;;
esac
"$root/scripts/build.sh" || exit 1

export TDX_CACHE_DIR="${TDX_CACHE_DIR-$build/test/compile-cache}"
# Test binaries run little: tdx.compile builds them at -O0 (a third to half
# of -O2's compile time, same numbers: -ffp-contract=off), unless a test
# asks for a level.
export TDX_OPT_LEVEL="${TDX_OPT_LEVEL-0}"
# The files of the quick tier; every other test file is pytest-models.
quick=(test_capture.py test_deferred_init.py test_sharding.py test_checkpoint.py
       test_split_inputs.py test_partition_numerics.py test_emission_golden.py test_explain.py)
# The models tier's files, the longest first (measured on this machine's
# kind): its processes take whole files, so that the tests of one file share
# what they compile, and the longest first share the work out evenly.
models=(test_hf_models.py test_training.py test_real_models.py test_runtime.py test_pipeline.py
        test_opinfo.py test_spmd.py test_docs.py test_runner.py test_batch_norm.py test_examples.py
        test_gpu_check.py)
# The cluster tier's files run alone, after the others: they make network
# namespaces, links and a bridge (and the networked store's volumes), which torch's gloo jobs in other tests
# were seen to abort beside (this machine's network stack is gVisor's); pip install . builds
# the wheel (build/wheel's static links take both cores).
cluster=(test_cluster.py test_store_network.py test_pip_install.py)
for f in "$root"/test/python/test_*.py; do
  name="$(basename "$f")"
  [[ " ${quick[*]} ${models[*]} ${cluster[*]} " == *" $name "* ]] || models+=("$name")
done

rm -f "$build"/test/results.json "$build"/test/pytest-*.xml
times=()
status=0
timed() {  # timed NAME COMMAND...: runs it, notes its time and status
  local name="$1" start=$SECONDS
  shift
  "$@" || status=1
  times+=("$name $((SECONDS - start)) s")
}
# pytest: the Python package, with the interpreter tdx was built for (build/env.sh).
jobs="${TDX_TEST_JOBS:-2}"
pytest_tier() {  # pytest_tier NAME [pytest options] FILES...
  local name="$1"
  shift
  (. "$build/env.sh" && cd "$root/test/python" &&
    timeout 3600 "$TDX_PYTHON" -m pytest -q -p no:cacheprovider \
      --junitxml="$build/test/pytest-$name.xml" "$@")
}
# The quick tier's tests go to the processes one by one, those sharing a
# module-scoped fixture together (--dist loadgroup, conftest.py; two
# processes that need one program compile it once, through the compile
# cache's lock); the models tier's go a file at a time (--dist loadfile).
quick_jobs=() models_jobs=()
if [ "$jobs" -gt 1 ]; then
  quick_jobs=(-n "$jobs" --dist loadgroup)
  models_jobs=(-n "$jobs" --dist loadfile)
fi
if [ "$tier" = portable ]; then
  # The tests that judge numbers (against eager, float64 eager or a peer),
  # under each variant: the models tier but for the GPU bundle's build and
  # the networked store's bytes, and the quick tier's numerical files.
  numerical=()
  for f in "${models[@]}"; do
    [[ " test_gpu_check.py test_store_volumes.py " == *" $f "* ]] || numerical+=("$f")
  done
  numerical+=(test_partition_numerics.py test_split_inputs.py)
  # The tests that set eager's thread count (test_hf_models' eager runs,
  # DDP's ranks in test_batch_norm) read TDX_TEST_THREADS (default 1).
  # Under ATEN_CPU_CAPABILITY tdx-compile builds the emitted kernels for
  # that capability too (as on such a CPU), against the runtime's header
  # precompiled for it: the variant's binaries compile anew, once (the
  # compile cache keeps them beside this machine's).
  variant() {  # variant NAME VAR=VALUE FILES...: the files under VAR=VALUE
    local name="$1" setting="$2"
    shift 2
    (export "$setting" &&
      { [[ "$setting" != ATEN_CPU_CAPABILITY=* ]] ||
        "$build/bin/tdx-compile" --build-pch "$build/lib/pch"; } &&
      pytest_tier "$name" "${models_jobs[@]}" "$@")
  }
  timed portable-aten-avx2 variant aten-avx2 ATEN_CPU_CAPABILITY=avx2 "${numerical[@]}"
  timed portable-aten-default variant aten-default ATEN_CPU_CAPABILITY=default "${numerical[@]}"
  timed portable-onednn-avx2 variant onednn-avx2 ONEDNN_MAX_CPU_ISA=AVX2 "${numerical[@]}"
  timed portable-threads-2 variant threads-2 TDX_TEST_THREADS=2 test_hf_models.py test_batch_norm.py
else
  # lit: FileCheck tests and the C++ unit tests.
  timed lit ninja -C "$build" check-tdx
  timed pytest-quick pytest_tier quick "${quick_jobs[@]}" "${quick[@]}"
  # The capture tests again on the key-free way (TDX_CAPTURE=dispatch-mode:
  # torch's Python dispatch instead of the reserved Fake key; docs/capture.md,
  # "Two ways in"). Their programs are the same under both ways, so the
  # compile cache already holds them.
  keyfree=(test_capture.py test_deferred_init.py test_torch_support.py test_sharding.py
           test_modern_decoder.py)
  keyfree_tier() { TDX_CAPTURE=dispatch-mode pytest_tier keyfree "$@"; }
  timed pytest-keyfree keyfree_tier "${quick_jobs[@]}" "${keyfree[@]}"
  if [ "$tier" = all ]; then
    timed pytest-models pytest_tier models "${models_jobs[@]}" "${models[@]}"
    timed pytest-cluster pytest_tier cluster "${cluster[@]}"
  fi
fi

for t in "${times[@]}"; do echo "tdx: tier $t"; done
lit_results="$build/test/results.json"
[ "$tier" = portable ] && lit_results=""  # no lit in the variants
if { [ -n "$lit_results" ] && [ ! -f "$lit_results" ]; } ||
    ! ls "$build"/test/pytest-*.xml >/dev/null 2>&1; then
  echo "tdx: a test runner did not run (see the errors above)" >&2
  exit 1
fi
(. "$build/env.sh" && "$TDX_PYTHON" - "$lit_results" "$build"/test/pytest-*.xml) <<'PY'
import json, sys
import xml.etree.ElementTree as ET
codes = [t["code"] for t in json.load(open(sys.argv[1]))["tests"]] if sys.argv[1] else []
passed = sum(c in ("PASS", "XFAIL") for c in codes)
skipped = sum(c == "UNSUPPORTED" for c in codes)
failed = len(codes) - passed - skipped
for path in sys.argv[2:]:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = int(suite.get("tests")); f = int(suite.get("failures")) + int(suite.get("errors"))
    s = int(suite.get("skipped"))
    passed += n - f - s; failed += f; skipped += s
print(f"tdx: {passed} passed, {failed} failed, {skipped} skipped")
PY
[ $status -eq 0 ]
