#!/usr/bin/env bash
# The first batched GPU run, in one command (about 7 minutes on an H200):
#   1. build (Release, with PyTorch's c10 from python3's torch)       -> build/gpu
#   2. driver placement probe (built-in scenarios, bench/gpu/placement/ops, live
#      replays of traces/)                                              -> OUT/placement.tar.gz
#   3. capture the workloads of bench/python/workloads                  -> OUT/<name>.trace.gz
#   4. GPU truth over traces/*.trace.gz and the captured traces         -> OUT/gpu_truth.json
#   5. PyTorch's allocator-facing sources, for reading                  -> OUT/torch-src.tar.gz
# and every step's log -> OUT/logs.tar.gz. A failed step does not stop later ones; the
# status of each is printed at the end. Everything else stays in build/gpu-run-a/.
#
# Usage: scripts/gpu-run-a.sh OUT      (OUT should be empty: every file in it comes back)
# Env:   GPU_RUN_SECONDS (the whole run's budget, default 450: gpu-truth gets what the
#        steps before it left), CAPTURE_ARGS_<workload> (see scripts/capture-traces.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-run-a.sh OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
scratch=$PWD/build/gpu-run-a
rm -rf "$scratch"
mkdir -p "$scratch/logs"
exec > >(tee "$scratch/logs/run.log") 2>&1
export RESERVOIR_GPU_BUILD=build/gpu
b=$RESERVOIR_GPU_BUILD
budget=${GPU_RUN_SECONDS:-450}
names=()
results=()

step() {  # name, function
  local name=$1 t=$SECONDS rc
  echo "=== $name ($(date -u +%H:%M:%S), ${SECONDS} s into the run)"
  "$2"
  rc=$?
  names+=("$name")
  results+=("$([ $rc = 0 ] && echo ok || echo "FAILED (rc $rc)"), $((SECONDS - t)) s")
  echo "--- $name: ${results[-1]}"
}

do_build() {
  local torch_dir
  torch_dir=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))" 2>/dev/null)
  [ -n "$torch_dir" ] || echo "build: python3 has no torch: reservoir_c10_replay lacks c10"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 2
  local log="$scratch/logs/build.log"
  { cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release ${torch_dir:+-DTORCH_DIR=$torch_dir} &&
    cmake --build "$b" -j"$(nproc)" --target reservoir reservoir-replay reservoir_async_replay \
      reservoir_placement_probe; } >"$log" 2>&1 || { tail -n 25 "$log"; return 1; }
  # c10 apart: the torch headers are the likeliest thing to break, and only c10 needs them.
  cmake --build "$b" -j"$(nproc)" --target reservoir_c10_replay >>"$log" 2>&1 ||
    { grep -m 8 -E 'error' "$log"; echo "build: reservoir_c10_replay FAILED"; return 1; }
}

do_probe() {
  local rc log="$scratch/logs/placement-probe.log"
  timeout 120 "$b/bench/gpu/placement/reservoir_placement_probe" --out "$scratch/placement" \
    --ops bench/gpu/placement/ops --traces traces >"$log" 2>&1
  rc=$?
  # The header, and the engine sequences under pressure and live (the rest is in the tarball).
  grep -E '^#|^(ops\..*_at_fit|live\..*\.default) ' "$log" | head -n 16
  echo "$(grep -vc '^#' "$log") scenarios logged"
  [ $rc = 0 ] || tail -n 5 "$log"
  [ -d "$scratch/placement" ] && tar czf "$out/placement.tar.gz" -C "$scratch" placement
  return $rc
}

do_capture() {
  CAPTURE_LOGS="$scratch/logs" scripts/capture-traces.sh "$out"
}

do_truth() {
  local rc left=$((budget - SECONDS - 25))
  ((left > 60)) || left=60
  GPU_TRUTH_BUDGET=$left scripts/gpu-truth.sh "$scratch/truth" traces/*.trace.gz \
    $(ls "$out"/*.trace.gz 2>/dev/null)
  rc=$?
  cp "$scratch/truth/gpu-truth-build.log" "$scratch/logs/" 2>/dev/null
  [ -f "$scratch/truth/gpu_truth.json" ] && cp "$scratch/truth/gpu_truth.json" "$out/"
  return $rc
}

do_torch_src() {
  python3 - "$out/torch-src.tar.gz" <<'PY'
import glob, os, sys, tarfile
import torch
site = os.path.dirname(os.path.dirname(torch.__file__))
wanted = ["torch/cuda/memory.py", "torch/cuda/graphs.py", "torch/cuda/__init__.py",
          "torch/_inductor/cudagraph_trees.py", "torch/cuda/_memory_viz.py", "torch/version.py",
          "torch/include/torch/csrc/cuda/CUDAPluggableAllocator.h",
          "torch/include/c10/cuda/CUDACachingAllocator.h",
          "torch/include/c10/core/CachingDeviceAllocator.h"]
wanted += sorted(os.path.relpath(p, site) for p in glob.glob(os.path.join(site, "torch/accelerator/*.py")))
found = [w for w in wanted if os.path.isfile(os.path.join(site, w))]
with tarfile.open(sys.argv[1], "w:gz") as tar:
    for w in found:
        tar.add(os.path.join(site, w), arcname=w)
print(f"torch {torch.__version__}: {len(found)} files; missing: {sorted(set(wanted) - set(found)) or 'none'}")
PY
}

step build do_build
step placement-probe do_probe
step capture do_capture
step gpu-truth do_truth
step torch-src do_torch_src

echo "=== summary (${SECONDS} s)"
status=0
for i in "${!names[@]}"; do
  printf '  %-16s %s\n' "${names[$i]}" "${results[$i]}"
  [[ ${results[$i]} == ok* ]] || status=1
done
ls -la "$out" | tail -n +2
tar czf "$out/logs.tar.gz" -C "$scratch" logs
echo "gpu-run-a: $([ $status = 0 ] && echo ok || echo 'some steps FAILED') -> $out"
exit $status
