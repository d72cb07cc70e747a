#!/usr/bin/env bash
# The GPU tests and compute-sanitizer, on a machine with an NVIDIA GPU (docs/gpu.md).
#
#   scripts/gpu/check.sh OUT [PART...]        (log in OUT/check.log, one file per test)
#
# Parts (default: tests memcheck examples):
#   tests     gpu_cuda_backend_test, gpu_cuda_allocator_test, gpu_compact_test and
#             gpu_conformance (the conformance suite on CudaBackend: default,
#             expandable, policy:compact, backend:cudaMallocAsync, private pools)
#   memcheck  compute-sanitizer --tool memcheck --leak-check full on the same programs:
#             the backend and allocator tests with caching and with
#             RESERVOIR_NO_CACHING=1, the tests that fail driver calls on purpose
#             (*Oom*, *Errors*, the backend test) without API-error reports, the
#             conformance suite's CUDA instances with caching only (it tests the cache)
#   examples  ctest -L examples: the C++ and C programs, and the PyTorch and CuPy
#             scripts (which skip without torch or cupy); runs without a GPU too (on
#             the simulated device)
# Env: CHECK_TESTS (the test programs of tests and memcheck, default all four, e.g.
# "gpu_compact_test gpu_conformance"), CHECK_FILTER (a --gtest_filter for the tests
# part, e.g. '*ThreadsOnTheirOwnStreams*'), and those of scripts/gpu/common.sh
# (RESERVOIR_GPU_BUILD, CLI11_INCLUDE_DIR, GPU_RUN_SECONDS, GPU_TARBALL, GPU_DRY_RUN,
# FUZZER). Exit status 0 when every step passed.
known_parts="tests memcheck examples"
default_parts="tests memcheck examples"
source "$(dirname "$0")/common.sh"

tests=${CHECK_TESTS:-gpu_cuda_backend_test gpu_cuda_allocator_test gpu_compact_test gpu_conformance}
g=$gpu_b/tests/gpu
cs=(compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3)

# run_test PROGRAM [ARGS...]: the program's output in OUT/PROGRAM.txt, its verdict here.
run_test() {
  local t=$1 rc
  shift
  "$g/$t" "$@" >"$out/$t.txt" 2>&1
  rc=$?
  echo "$t: rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.txt" | tr '\n' ' ')"
  return $rc
}

# memcheck LABEL COMMAND...: the sanitizer's summary here, its output in OUT/memcheck-LABEL.txt.
memcheck() {
  local label=$1 rc
  shift
  "$@" >"$out/memcheck-$label.txt" 2>&1
  rc=$?
  echo "memcheck $label: rc=$rc $(grep -E 'ERROR SUMMARY|PASSED' "$out/memcheck-$label.txt" | tr '\n' ' ')"
  return $rc
}
examples() {
  ctest --test-dir "$gpu_b" -L examples --output-on-failure >"$out/examples.txt" 2>&1
  local rc=$?
  grep -E "Test +#|tests passed" "$out/examples.txt"
  return $rc
}
gpu_fn "$@"

gpu_begin check "$@"
targets=(reservoir)
{ wants tests || wants memcheck; } && targets+=($tests)
wants examples && targets+=(example_allocator example_c_api)
gpu_build "${targets[@]}"

if wants tests; then
  for t in $tests; do
    step "$t" run_test "$t" ${CHECK_FILTER:+--gtest_filter="$CHECK_FILTER"}
  done
fi
if wants memcheck; then
  for t in $tests; do
    case $t in
      gpu_cuda_allocator_test)
        for nc in 0 1; do
          step "memcheck-allocator-nc$nc" env RESERVOIR_NO_CACHING=$nc "$gpu_self" --fn memcheck \
            "allocator-nc$nc" "${cs[@]}" "$g/$t" --gtest_filter='-*Oom*:*Errors*'
          step "memcheck-allocator-oom-nc$nc" env RESERVOIR_NO_CACHING=$nc "$gpu_self" --fn memcheck \
            "allocator-oom-nc$nc" "${cs[@]}" --report-api-errors no "$g/$t" --gtest_filter='*Oom*'
        done
        ;;
      gpu_cuda_backend_test)
        for nc in 0 1; do
          step "memcheck-backend-nc$nc" env RESERVOIR_NO_CACHING=$nc "$gpu_self" --fn memcheck \
            "backend-nc$nc" "${cs[@]}" --report-api-errors no "$g/$t"
        done
        ;;
      gpu_compact_test) step memcheck-compact memcheck compact "${cs[@]}" "$g/$t" ;;
      gpu_conformance)
        step memcheck-conformance memcheck conformance "${cs[@]}" --report-api-errors no "$g/$t" \
          --gtest_filter='*/cuda*'
        ;;
      *) echo "memcheck: no memcheck plan for $t" ;;
    esac
  done
fi
wants examples && step examples examples
gpu_end
