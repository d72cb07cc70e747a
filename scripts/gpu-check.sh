#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds Reservoir against the CUDA toolkit (and
# PyTorch's c10, when python3 has torch, for the benchmark's peer column), then runs
#   1. the GPU tests (the conformance suite on CudaBackend, default and expandable,
#      and the GPU-only tests),
#   2. compute-sanitizer memcheck on them, with caching and with RESERVOIR_NO_CACHING=1,
#   3. the side-by-side GPU benchmark (writes OUTDIR/gpu-bench.md),
#   4. the bundled traces replayed on the GPU,
#   5. a snapshot of a replayed trace through PyTorch's memory viewer,
#   6. the examples (C++, C, PyTorch, CuPy; the Python ones skip without torch/cupy).
# Usage: scripts/gpu-check.sh [OUTDIR]   (logs in OUTDIR/gpu-check.log)
# reservoir-replay needs CLI11's headers: installed (libcli11-dev), or a copy of the
# directory holding CLI/CLI.hpp named by CLI11_INCLUDE_DIR (docs/replay.md).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/gpu-check}
mkdir -p "$out"
log="$out/gpu-check.log"
exec > >(tee "$log") 2>&1
b=build/gpu
torch_dir=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))" 2>/dev/null || true)
cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release ${torch_dir:+-DTORCH_DIR=$torch_dir} \
  ${CLI11_INCLUDE_DIR:+-DCLI11_INCLUDE_DIR=$CLI11_INCLUDE_DIR} >/dev/null || exit 1
cmake --build $b -j"$(nproc)" --target reservoir gpu_conformance gpu_cuda_allocator_test \
  gpu_cuda_backend_test gpu_compact_test reservoir_gpu_bench reservoir-replay reservoir_snapshot_demo \
  example_allocator example_c_api >/dev/null ||
  exit 1
status=0
step() { echo "--- $*"; }
g=$b/tests/gpu
step "GPU tests"
for t in gpu_cuda_backend_test gpu_cuda_allocator_test gpu_compact_test gpu_conformance; do
  timeout 600 $g/$t >"$out/$t.txt" 2>&1
  rc=$?
  echo "$t: rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.txt" | tr '\n' ' ')"
  ((rc)) && status=1
done
step "compute-sanitizer memcheck"
cs="compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3"
memcheck() {  # label, then the command
  local label=$1
  shift
  timeout 600 "$@" >"$out/cs.txt" 2>&1
  local rc=$?
  echo "memcheck $label: rc=$rc $(grep -E 'ERROR SUMMARY|PASSED' "$out/cs.txt" | tr '\n' ' ')"
  ((rc)) && status=1
}
for nc in 0 1; do
  # Tests that make driver calls fail on purpose run without API-error reports.
  export RESERVOIR_NO_CACHING=$nc
  memcheck "gpu_cuda_allocator_test NO_CACHING=$nc" $cs $g/gpu_cuda_allocator_test \
    --gtest_filter='-*Oom*:*Errors*'
  memcheck "gpu_cuda_allocator_test (OOM) NO_CACHING=$nc" $cs --report-api-errors no \
    $g/gpu_cuda_allocator_test --gtest_filter='*Oom*'
  memcheck "gpu_cuda_backend_test NO_CACHING=$nc" $cs --report-api-errors no \
    $g/gpu_cuda_backend_test
done
unset RESERVOIR_NO_CACHING
memcheck "gpu_compact_test" $cs $g/gpu_compact_test
# The conformance suite tests caching behaviour, so it runs with caching only.
memcheck "gpu_conformance (cuda)" $cs --report-api-errors no $g/gpu_conformance \
  --gtest_filter='*/cuda*'
step "benchmark"
timeout 900 $b/bench/gpu/reservoir_gpu_bench --markdown "$out/gpu-bench.md" || status=1
step "replay on the GPU"
scripts/gpu-replays.sh "$b/tools/replay/reservoir-replay" "$out" || status=1
step "snapshot in PyTorch's memory viewer"
$b/tests/observability/reservoir_snapshot_demo traces/resnet50_train.trace.gz "$out/snap.pickle" &&
  python3 -m torch.cuda._memory_viz trace_plot "$out/snap.pickle" -o "$out/trace.html" &&
  python3 -m torch.cuda._memory_viz segment_plot "$out/snap.pickle" -o "$out/segments.html" &&
  ls -la "$out/trace.html" "$out/segments.html" || status=1
step "examples"
ctest --test-dir $b -L examples --output-on-failure >"$out/examples.txt" 2>&1 || status=1
grep -E "Test +#|tests passed" "$out/examples.txt"
rm -f "$out/cs.txt"
echo "gpu-check: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
