#!/usr/bin/env bash
# On a GPU machine: ground truth for Reservoir's replays. Builds reservoir-replay,
# reservoir_async_replay and reservoir_c10_replay (with PyTorch's c10 from python3's
# torch), then replays every
# trace under the settings matrix through c10 (with fit searches for the default and
# expandable segments), cudaMallocAsync and Reservoir on the GPU and on the simulated
# device, and writes OUTDIR/gpu_truth.json (bench/gpu/gpu_truth.py says what is in it).
#
# Usage: scripts/gpu-truth.sh OUTDIR [TRACE...]      (default: traces/*.trace.gz)
# Env:   RESERVOIR_GPU_BUILD (build directory, default build/gpu),
#        GPU_TRUTH_BUDGET (seconds for the replays; what does not fit is skipped, fits
#        first; default 330).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-truth.sh OUTDIR [TRACE...]}
shift
mkdir -p "$out"
b=${RESERVOIR_GPU_BUILD:-build/gpu}
log="$out/gpu-truth-build.log"
t0=$SECONDS
torch_dir=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))" 2>/dev/null || true)
[ -n "$torch_dir" ] || echo "gpu-truth: python3 has no torch: c10 runs will fail"
if ! { cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release ${torch_dir:+-DTORCH_DIR=$torch_dir} &&
  cmake --build "$b" -j"$(nproc)" --target reservoir-replay reservoir_async_replay; } >"$log" 2>&1; then
  tail -n 30 "$log"
  echo "gpu-truth: build FAILED (log: $log)"
  exit 1
fi
# c10 on its own: if it does not build, the other columns are still measured.
cmake --build "$b" -j"$(nproc)" --target reservoir_c10_replay >>"$log" 2>&1 ||
  { grep -m 5 -E 'error|Error' "$log"; echo "gpu-truth: reservoir_c10_replay did not build: no c10 figures"; }
echo "gpu-truth: build $((SECONDS - t0)) s"
traces=("$@")
[ ${#traces[@]} -gt 0 ] || traces=(traces/*.trace.gz)
python3 bench/gpu/gpu_truth.py --build "$b" --out "$out/gpu_truth.json" \
  --budget "${GPU_TRUTH_BUDGET:-330}" "${traces[@]}"
rc=$?
echo "gpu-truth: done in $((SECONDS - t0)) s (rc $rc)"
exit $rc
