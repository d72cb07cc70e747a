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
#   threads-ab    reservoir_thread_cells of this tree and of the tree in BENCH_AB_TREE
#                 (another checkout's source, e.g. an older commit's `git archive`),
#                 both built alike, their runs alternating BENCH_AB_ROUNDS times
#                 (default 4): 1, 2 and 8 threads on the GPU, 2 threads with streams
#                 kept, 2 threads on the simulated device   -> OUT/threads-ab.txt
# Env: BENCH_COLUMNS (reservoir_gpu_bench --columns, e.g. reservoir,c10,cudaMallocAsync;
# default all), BENCH_PASSES (--passes, default the benchmark's 3), BENCH_ARGS (more
# arguments, e.g. --smoke or --no-pin), BENCH_REPLAY_CONFIG, and those of
# scripts/gpu/common.sh (RESERVOIR_GPU_BUILD, CLI11_INCLUDE_DIR, GPU_RUN_SECONDS,
# GPU_TARBALL, GPU_DRY_RUN, FUZZER). The PyTorch training and cuDNN benchmarks are
# parts of scripts/gpu/torch.sh.
known_parts="default expandable driver-calls replay-calls threads-ab"
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
# The other tree's library, built as this one's, and the cells' source (public API
# only) compiled against it; then the two alternating, cell by cell.
threads_ab() {
  local ab=${BENCH_AB_TREE:?threads-ab: set BENCH_AB_TREE to the source of the other tree}
  local b="$out/ab-build" cells k cell tree
  if ! { cmake -S "$ab" -B "$b" -DCMAKE_BUILD_TYPE=Release -DRESERVOIR_BUILD_TESTS=OFF \
    -DRESERVOIR_BUILD_BENCH=OFF -DRESERVOIR_BUILD_TOOLS=OFF -DRESERVOIR_BUILD_EXAMPLES=OFF &&
    cmake --build "$b" -j"$(nproc)" --target reservoir; } >>"$out/build.log" 2>&1; then
    echo "threads-ab: the build of $ab failed (log: $out/build.log)"
    return 1
  fi
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  c++ -O2 -std=c++20 -I"$ab/include" -I"$cuda/include" bench/gpu/thread_cells.cpp \
    -L"$b/src" -lreservoir -Wl,-rpath,"$b/src" -L"$cuda/lib64" -lcudart -pthread \
    -o "$out/ab-thread-cells" || return 1
  cells=("--threads 1" "--threads 2" "--threads 8" "--threads 2 --streams same"
    "--device sim --threads 2")
  for ((k = 1; k <= ${BENCH_AB_ROUNDS:-4}; k++)); do
    for cell in "${cells[@]}"; do
      for tree in this other; do
        echo -n "$tree: "
        # shellcheck disable=SC2086  # the cell's words are separate arguments
        if [ $tree = this ]; then "$gpu_b/bench/gpu/reservoir_thread_cells" $cell || return 1
        else "$out/ab-thread-cells" $cell || return 1; fi
      done
    done
  done
}
gpu_fn "$@"

gpu_begin bench "$@"
targets=(reservoir)
{ wants default || wants expandable; } && targets+=(reservoir_gpu_bench)
wants driver-calls && targets+=(reservoir_driver_call_bench)
wants replay-calls && targets+=(reservoir-replay)
wants threads-ab && targets+=(reservoir_thread_cells)
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
wants threads-ab && step threads-ab bash -c "'$gpu_self' --fn threads_ab | tee '$out/threads-ab.txt'"
gpu_end
