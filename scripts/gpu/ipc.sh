#!/usr/bin/env bash
# Sharing memory between processes on one GPU (docs/ipc.md).
#
#   scripts/gpu/ipc.sh OUT [PART...]          (log in OUT/ipc.log)
#
# Parts (default: pair memcheck cupy):
#   pair      gpu_ipc_pair (tests/gpu/cuda_ipc_pair.cpp): two processes exchange an
#             ordinary and an expandable-segment block and each sees the other's
#             writes; repeated opens give one mapping; an out-of-memory error while the
#             other process holds 4 GiB lists that process (NVML)
#   memcheck  compute-sanitizer memcheck of gpu_ipc_pair, both processes (the OOM step
#             fails cuMemAlloc on purpose: API errors are not reported)
#   cupy      examples/cupy_ipc.py, ordinary and expandable (skipped without CuPy)
# backend:cudaMallocAsync, which shares nothing, is checked by scripts/gpu/check.sh
# (its conformance instances) and scripts/gpu/truth.sh async (its replays).
# Env: those of scripts/gpu/common.sh (RESERVOIR_GPU_BUILD, CLI11_INCLUDE_DIR,
# GPU_RUN_SECONDS, GPU_TARBALL, GPU_DRY_RUN, FUZZER).
known_parts="pair memcheck cupy"
default_parts="pair memcheck cupy"
source "$(dirname "$0")/common.sh"
pair_bin=$gpu_b/tests/gpu/gpu_ipc_pair

pair() {
  "$pair_bin" >"$out/ipc-pair.txt" 2>&1
  local rc=$?
  cat "$out/ipc-pair.txt"
  grep -q '^SKIP' "$out/ipc-pair.txt" && { echo "FAIL no GPU"; return 1; }
  return $rc
}

memcheck() {
  compute-sanitizer --tool memcheck --leak-check full --target-processes all \
    --report-api-errors no --error-exitcode 3 "$pair_bin" >"$out/memcheck-ipc-pair.txt" 2>&1
  local rc=$? summary
  summary=$(grep -E 'ERROR SUMMARY' "$out/memcheck-ipc-pair.txt" | sort | uniq -c | tr '\n' ' ')
  if ((rc == 0)) && grep -q '^PASS gpu_ipc_pair' "$out/memcheck-ipc-pair.txt"; then
    echo "PASS memcheck gpu_ipc_pair: $summary"
    return 0
  fi
  echo "FAIL memcheck gpu_ipc_pair: rc=$rc $summary (see $out/memcheck-ipc-pair.txt)"
  return 1
}

cupy() {
  local mode rc status=0
  for mode in "" expandable; do
    RESERVOIR_LIBRARY=$gpu_b/src/libreservoir.so PYTHONPATH=python \
      python3 examples/cupy_ipc.py $mode >"$out/cupy_ipc$mode.txt" 2>&1
    rc=$?
    case $rc in
      0) echo "PASS cupy_ipc ${mode:-ordinary}" ;;
      77) echo "SKIP cupy_ipc ${mode:-ordinary}: $(tail -1 "$out/cupy_ipc$mode.txt")" ;;
      *) echo "FAIL cupy_ipc ${mode:-ordinary}: rc=$rc $(tail -3 "$out/cupy_ipc$mode.txt" | tr '\n' ' ')"
        status=1 ;;
    esac
  done
  return $status
}
gpu_fn "$@"

gpu_begin ipc "$@"
targets=(reservoir)
{ wants pair || wants memcheck; } && targets+=(gpu_ipc_pair)
gpu_build "${targets[@]}"
wants pair && step pair pair
wants memcheck && step memcheck memcheck
wants cupy && step cupy cupy
gpu_end
