#!/usr/bin/env bash
# The second batched GPU run (the proofs of issues 11-16 and 18), in two calls of
# under ten minutes each on an H200:
#   scripts/gpu-run-b.sh check OUT   build + scripts/gpu-check.sh (GPU tests, memcheck,
#                                    the side-by-side benchmark, every bundled trace
#                                    replayed on the GPU and the simulated device under
#                                    default / expandable / compact, the memory viewer,
#                                    the examples)                       -> OUT/check/
#                                    + scripts/gpu-truth.sh (every trace x setting through
#                                    c10, cudaMallocAsync and Reservoir) -> OUT/truth/
#   scripts/gpu-run-b.sh torch OUT   the PyTorch and multi-process proofs:
#       - tests/python/gpu/test_torch_memory_api.py (torch.cuda memory API, OOM, traces
#         recorded by every front replayed to the live peaks)
#       - scripts/gpu-torch-graphs.sh (CUDA graphs, MemPool, torch.compile)
#       - bench/python/cudnn_bench.py (ResNet-50, cudnn.benchmark off/on)
#       - bench/python/train_bench.py (gpt2, resnet50, multistream under PyTorch's
#         allocator, expandable segments and policy:compact)
#       - scripts/gpu-ipc-async.sh (IPC between processes, backend:cudaMallocAsync)
#   scripts/gpu-run-b.sh pytorch OUT the PyTorch drop-in only: reservoir._torch_native's
#                                    build, the memory API test, CUDA graphs and
#                                    torch.compile, cudnn_bench, the GPU conformance
#                                    suite and its memcheck (no fuzz campaign)
#   scripts/gpu-run-b.sh final OUT   policy:compact's GPU test and its memcheck, every trace
#                                    replayed on GPU and sim (scripts/gpu-replays.sh), the
#                                    side-by-side benchmark (BENCH_EXPANDABLE=1: again with
#                                    Reservoir and c10 under expandable segments), the
#                                    conformance suite and its memcheck (no fuzz campaign)
#   scripts/gpu-run-b.sh compact OUT policy:compact: its GPU test and memcheck, the
#                                    replays, each trace's device calls timed on the GPU,
#                                    the driver calls' costs (reservoir_driver_call_bench)
#   scripts/gpu-run-b.sh train OUT   bench/python/train_bench.py (PyTorch, expandable,
#                                    policy:compact), then reservoir_gpu_bench
#   scripts/gpu-run-b.sh bench OUT   reservoir_gpu_bench alone, with default settings and
#                                    again under expandable segments (Reservoir's and
#                                    c10's), columns BENCH_COLUMNS (its --columns; default
#                                    all): the side-by-side figures in a short lease
# Both phases run a fuzz campaign on the host's last cores meanwhile: FUZZER (a reservoir_fuzz built with clang elsewhere; the
# GPU host has no clang), FUZZ_WORKERS workers in libFuzzer's fork mode for
# FUZZ_SECONDS, on a copy of tests/corpus                            -> OUT/fuzz/
# Every step's status is printed at the end; a failed step does not stop the others.
# Env: CLI11_INCLUDE_DIR (CLI11 headers for reservoir-replay), FUZZER, FUZZ_WORKERS
# (default 7), FUZZ_SECONDS (default 450); compact: DRIVER_CALLS=0 skips the driver-call
# benchmark; train: TRAIN_MODELS, TRAIN_ROUNDS (train_bench.py --rounds, default 1),
# TRAIN_STEPS (--steps; default per model), TRAIN_LOCKSTEP (default 1: the variants side by
# side, step by step, train_bench.py --lockstep), TRAIN_VARIANTS (--variants), TRAIN_BENCH
# (default: the benchmark after the training; expandable: it under expandable segments,
# Reservoir's and c10's; none).
set -uo pipefail
cd "$(dirname "$0")/.."
phase=${1:?usage: scripts/gpu-run-b.sh check|torch|pytorch|final|compact|train|bench OUT}
out=${2:?usage: scripts/gpu-run-b.sh check|torch OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# The whole log travels in the tarball too (the device tool returns only a tail).
exec > >(tee "$out/run.log") 2>&1
names=()
results=()
# GPU_RUN_SECONDS: the whole phase's budget (the device tool stops a call at 600 s;
# the tarball at the end must be made in time): no step runs past it.
deadline=${GPU_RUN_SECONDS:-560}
step() {  # name, command...
  local name=$1 t=$SECONDS rc left=$((deadline - SECONDS))
  shift
  echo "=== $name ($(date -u +%H:%M:%S), ${SECONDS} s into the run)"
  if ((left < 5)); then
    echo "--- $name: skipped (the run's ${deadline} s are spent)"
    names+=("$name")
    results+=("skipped")
    return
  fi
  timeout "$left" "$@"
  rc=$?
  names+=("$name")
  results+=("$([ $rc = 0 ] && echo ok || echo "FAILED (rc $rc)"), $((SECONDS - t)) s")
  echo "--- $name: ${results[-1]}"
}
lib=build/gpu/src/libreservoir.so
py=(env "RESERVOIR_LIBRARY=$PWD/$lib" "PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}")

fuzz_pid=
start_fuzz() {  # a campaign on the host's last cores while the GPU steps run
  if [ -z "${FUZZER:-}" ] || [ ! -x "$FUZZER" ]; then
    echo "fuzz: FUZZER not set or not executable: no campaign"
    return
  fi
  local dir=$out/fuzz workers=${FUZZ_WORKERS:-7}
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp tests/corpus/* "$dir/corpus/"
  local cores="$(($(nproc) - workers))-$(($(nproc) - 1))"
  echo "fuzz: $workers workers on cores $cores for ${FUZZ_SECONDS:-450} s"
  taskset -c "$cores" "$FUZZER" -fork="$workers" -max_total_time="${FUZZ_SECONDS:-450}" \
    -max_len=1024 -timeout=30 -rss_limit_mb=4096 -detect_leaks=0 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/fuzz.log" 2>&1 &
  fuzz_pid=$!
}
finish_fuzz() {
  [ -n "$fuzz_pid" ] || return 0
  # The campaign ends at FUZZ_SECONDS; past the deadline it is stopped.
  while kill -0 "$fuzz_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 2; done
  kill -INT "$fuzz_pid" 2>/dev/null
  wait "$fuzz_pid"
  local rc=$?
  names+=(fuzz-campaign)
  results+=("$([ $rc = 0 ] && echo ok || echo "rc $rc")")
  grep -E "INITED|DONE|stat::|ERROR|==[0-9]+==" "$out/fuzz/fuzz.log" | tail -n 20
  echo "fuzz: corpus $(ls "$out/fuzz/corpus" | wc -l) files, artifacts $(ls "$out/fuzz/artifacts" | wc -l)"
  rm -rf "$out/fuzz/corpus"  # only findings and the log come back
}
# The GPU steps keep the first cores.
gpu_cores="0-$(($(nproc) - ${FUZZ_WORKERS:-7} - 1))"

# Configures build/gpu (Release; CLI11_INCLUDE_DIR when set; with --torch, PyTorch's
# c10 for the side-by-side benchmark) and builds the targets; the log goes to
# OUT/build.txt. A failed build is reported, and the steps then fail on their own.
build_targets() {  # [--torch] target...
  local torch_dir=
  if [ "$1" = --torch ]; then
    shift
    torch_dir=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))" 2>/dev/null)
  fi
  { cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release ${torch_dir:+-DTORCH_DIR=$torch_dir} \
      ${CLI11_INCLUDE_DIR:+-DCLI11_INCLUDE_DIR=$CLI11_INCLUDE_DIR} &&
    cmake --build build/gpu -j16 --target "$@"; } >"$out/build.txt" 2>&1 ||
    echo "build of $* FAILED (log: build.txt)"
}

case $phase in
  check)
    start_fuzz
    step gpu-check taskset -c "$gpu_cores" scripts/gpu-check.sh "$out/check"
    step gpu-truth taskset -c "$gpu_cores" scripts/gpu-truth.sh "$out/truth"
    finish_fuzz
    ;;
  torch)
    start_fuzz
    build_targets reservoir gpu_cuda_backend_test gpu_cuda_allocator_test gpu_compact_test \
      gpu_conformance
    # The GPU tests that failed in the check phase, after their fixes (fabric handles
    # off unless asked for; the cuMemFree message), with memcheck.
    cs="compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3"
    g=build/gpu/tests/gpu
    step recheck-backend $g/gpu_cuda_backend_test
    step recheck-threads $g/gpu_conformance --gtest_filter='*ThreadsOnTheirOwnStreams*'
    step memcheck-allocator $cs $g/gpu_cuda_allocator_test --gtest_filter='-*Oom*:*Errors*'
    step memcheck-compact $cs $g/gpu_compact_test
    step torch-memory-api "${py[@]}" python3 -m unittest discover -s tests/python/gpu \
      -p 'test_torch_memory_api.py' -v
    step torch-graphs scripts/gpu-torch-graphs.sh "$lib"
    step ipc-async scripts/gpu-ipc-async.sh "$out/ipc-async"
    step train-bench "${py[@]}" python3 bench/python/train_bench.py \
      --models gpt2,resnet50,multistream \
      --variants pytorch,pytorch:expandable_segments:True,reservoir,reservoir:policy:compact \
      --deterministic --json "$out/train_bench.json"
    step cudnn-bench "${py[@]}" python3 bench/python/cudnn_bench.py --rounds 2 \
      --json "$out/cudnn.json"
    finish_fuzz
    ;;
  pytorch)
    # The PyTorch drop-in alone (issues 13 and 14): the native cacheInfo part, the
    # memory API, CUDA graphs and torch.compile, cuDNN's benchmark mode.
    build_targets reservoir reservoir-replay gpu_conformance
    step torch-native "${py[@]}" RESERVOIR_CACHE_DIR="$out/native-cache" python3 -m \
      reservoir._torch_native -v
    export RESERVOIR_CACHE_DIR="$out/native-cache" RESERVOIR_TEST_LOG_DIR="$out/logs"
    step torch-memory-api "${py[@]}" python3 -m unittest discover -s tests/python/gpu \
      -p 'test_torch_memory_api.py' -v
    step torch-graphs scripts/gpu-torch-graphs.sh "$lib"
    step cudnn-bench "${py[@]}" python3 bench/python/cudnn_bench.py --rounds 3 --steps 30 \
      --json "$out/cudnn.json"
    rm -rf "$out/native-cache"
    # The conformance suite on CudaBackend (default, expandable; pools included),
    # then under memcheck.
    g=build/gpu/tests/gpu
    step gpu-conformance $g/gpu_conformance
    step memcheck-conformance compute-sanitizer --tool memcheck --leak-check full \
      --error-exitcode 3 --report-api-errors no $g/gpu_conformance --gtest_filter='*/cuda*'

    ;;
  final)
    # The engine's figures after a change (issues 11 and 12): the conformance suite and
    # its memcheck, the side-by-side benchmark, every trace replayed on GPU and sim.
    # policy:compact's GPU test and its memcheck first (fast), then the benchmarks, then
    # the longer conformance suite (the deadline skips what no longer fits).
    build_targets --torch reservoir reservoir-replay gpu_conformance gpu_compact_test \
      reservoir_gpu_bench
    g=build/gpu/tests/gpu
    step compact-test $g/gpu_compact_test
    step memcheck-compact compute-sanitizer --tool memcheck --leak-check full \
      --error-exitcode 3 $g/gpu_compact_test
    step replays scripts/gpu-replays.sh build/gpu/tools/replay/reservoir-replay "$out/replays"
    step gpu-bench build/gpu/bench/gpu/reservoir_gpu_bench --markdown "$out/gpu-bench.md"
    if [ "${BENCH_EXPANDABLE:-0}" = 1 ]; then
      # Reservoir and c10 both under expandable segments (each reads its own variable).
      step gpu-bench-expandable env RESERVOIR_ALLOC_CONF=expandable_segments:True \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
        build/gpu/bench/gpu/reservoir_gpu_bench --markdown "$out/gpu-bench-expandable.md"
    fi
    step gpu-conformance $g/gpu_conformance
    step memcheck-conformance compute-sanitizer --tool memcheck --leak-check full \
      --error-exitcode 3 --report-api-errors no $g/gpu_conformance --gtest_filter='*/cuda*'
    ;;
  compact)
    # policy:compact's proof (issue 12): its GPU test and memcheck, every trace replayed
    # on GPU and sim (peaks equal, host ns/event), each trace's device calls timed on
    # the GPU (reservoir-replay --calls), the driver calls' costs by size.
    build_targets reservoir reservoir-replay gpu_compact_test reservoir_driver_call_bench
    g=build/gpu/tests/gpu
    step compact-test $g/gpu_compact_test
    step memcheck-compact compute-sanitizer --tool memcheck --leak-check full \
      --error-exitcode 3 $g/gpu_compact_test
    step replays scripts/gpu-replays.sh build/gpu/tools/replay/reservoir-replay "$out/replays"
    step calls bash -c 'for f in traces/*.trace.gz; do
        build/gpu/tools/replay/reservoir-replay "$f" --device cuda --calls \
          --config policy:compact >"$0/calls-$(basename "$f" .trace.gz).txt" || exit 1
      done' "$out"
    if [ "${DRIVER_CALLS:-1}" = 1 ]; then
      step driver-calls build/gpu/bench/gpu/reservoir_driver_call_bench --benchmark_min_time=0.1s \
        --benchmark_out="$out/driver-calls.json"
    fi
    ;;
  train)
    # PyTorch training under policy:compact next to PyTorch's allocator (both
    # settings), then the side-by-side host-cost benchmark.
    build_targets --torch reservoir reservoir_gpu_bench
    lockstep=()
    [ "${TRAIN_LOCKSTEP:-1}" = 1 ] && lockstep=(--lockstep)
    step train-bench "${py[@]}" python3 bench/python/train_bench.py \
      --models "${TRAIN_MODELS:-gpt2,resnet50,multistream}" --rounds "${TRAIN_ROUNDS:-1}" \
      ${TRAIN_STEPS:+--steps "$TRAIN_STEPS"} "${lockstep[@]}" \
      --variants "${TRAIN_VARIANTS:-pytorch,pytorch:expandable_segments:True,reservoir:policy:compact}" \
      --deterministic --json "$out/train_bench.json"
    case "${TRAIN_BENCH:-default}" in
      default) step gpu-bench build/gpu/bench/gpu/reservoir_gpu_bench --markdown "$out/gpu-bench.md" ;;
      expandable)
        step gpu-bench-expandable env RESERVOIR_ALLOC_CONF=expandable_segments:True \
          PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
          build/gpu/bench/gpu/reservoir_gpu_bench --markdown "$out/gpu-bench-expandable.md"
        ;;
    esac
    ;;
  bench)
    build_targets --torch reservoir reservoir_gpu_bench
    columns=()
    [ -n "${BENCH_COLUMNS:-}" ] && columns=(--columns "$BENCH_COLUMNS")
    step gpu-bench build/gpu/bench/gpu/reservoir_gpu_bench "${columns[@]}" \
      --markdown "$out/gpu-bench.md"
    step gpu-bench-expandable env RESERVOIR_ALLOC_CONF=expandable_segments:True \
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      build/gpu/bench/gpu/reservoir_gpu_bench "${columns[@]}" \
      --markdown "$out/gpu-bench-expandable.md"
    ;;
  *)
    echo "gpu-run-b: unknown phase $phase (check|torch|pytorch|final|compact|train|bench)"
    exit 2
    ;;
esac
echo "=== summary"
for i in "${!names[@]}"; do printf '%-18s %s\n' "${names[$i]}" "${results[$i]}"; done
# One file comes back (the device tool returns few files): everything in a tarball.
tar czf "$out.tar.gz" -C "$out" . && rm -rf "${out:?}"/* && mv "$out.tar.gz" "$out/$phase.tar.gz"
