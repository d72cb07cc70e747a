#!/usr/bin/env bash
# The host-cost benchmark against the peers on a GPU (docs/benchmarks.md says how it
# measures): reservoir_gpu_bench, built with PyTorch's c10 when python3 has torch.
#
#   scripts/gpu/bench.sh OUT [PART...]        (log in OUT/bench.log)
#
# Parts (default: default expandable):
#   default       reservoir_gpu_bench with default settings      -> OUT/gpu-bench.md
#   expandable    the same with Reservoir and c10 both under expandable_segments:True
#                 (each reads its own variable)                   -> OUT/gpu-bench-expandable.md
#   driver-calls  reservoir_driver_call_bench: the host cost of each VMM and event call
#                 by size                                         -> OUT/driver-calls.json
#   replay-calls  every bundled trace replayed on the GPU with each device call counted
#                 and timed (reservoir-replay --device cuda --calls) under
#                 BENCH_REPLAY_CONFIG (default policy:compact)    -> OUT/calls-TRACE.txt
# Env: BENCH_COLUMNS (reservoir_gpu_bench --columns, e.g. reservoir,c10,cudaMallocAsync;
# default all), BENCH_PASSES (--passes, default the benchmark's 3), BENCH_ARGS (more
# arguments, e.g. --smoke or --no-pin), BENCH_REPLAY_CONFIG, and those of
# scripts/gpu/common.sh (RESERVOIR_GPU_BUILD, CLI11_INCLUDE_DIR, GPU_RUN_SECONDS,
# GPU_TARBALL, GPU_DRY_RUN, FUZZER). The PyTorch training and cuDNN benchmarks are
# parts of scripts/gpu/torch.sh.
known_parts="default expandable driver-calls replay-calls"
default_parts="default expandable"
source "$(dirname "$0")/common.sh"

replay_calls() {
  local f t
  for f in traces/*.trace.gz; do
    t=$(basename "$f" .trace.gz)
    "$gpu_b/tools/replay/reservoir-replay" "$f" --device cuda --calls \
      --config "${BENCH_REPLAY_CONFIG:-policy:compact}" >"$out/calls-$t.txt" || return 1
    grep -E "^calls:" "$out/calls-$t.txt" | sed "s/^/$t /"
  done
}
gpu_fn "$@"

gpu_begin bench "$@"
targets=(reservoir)
{ wants default || wants expandable; } && targets+=(reservoir_gpu_bench)
wants driver-calls && targets+=(reservoir_driver_call_bench)
wants replay-calls && targets+=(reservoir-replay)
gpu_build --torch "${targets[@]}"

bench=("$gpu_b/bench/gpu/reservoir_gpu_bench" ${BENCH_COLUMNS:+--columns "$BENCH_COLUMNS"}
  ${BENCH_PASSES:+--passes "$BENCH_PASSES"} ${BENCH_ARGS:-})
wants default && step gpu-bench "${bench[@]}" --markdown "$out/gpu-bench.md"
wants expandable && step gpu-bench-expandable env RESERVOIR_ALLOC_CONF=expandable_segments:True \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "${bench[@]}" \
  --markdown "$out/gpu-bench-expandable.md"
wants driver-calls && step driver-calls "$gpu_b/bench/gpu/reservoir_driver_call_bench" \
  --benchmark_min_time=0.1s --benchmark_out="$out/driver-calls.json"
wants replay-calls && step replay-calls replay_calls
gpu_end
