#!/usr/bin/env bash
# The whole test suite: builds and tests the release flavour and the full-check
# flavour (validator after every operation), then the ASan+UBSan flavour, a short
# deterministic run of the libFuzzer walk (fuzz smoke), the multi-threaded tests
# under ThreadSanitizer, and clang-tidy over src/.
# GPU tests are built when a CUDA toolkit is present and skip without a device.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
# Without address-space randomization where the kernel lets us: the fuzz smoke's seed
# needs it, and clang 14's ThreadSanitizer stops at start on kernels that randomize
# more address bits than it expects ("unexpected memory mapping").
norandom=()
if setarch "$(uname -m)" -R true 2>/dev/null; then norandom=(setarch "$(uname -m)" -R); fi
flavour() {  # name, cmake options...
  local name=$1
  shift
  echo "=== ${name} ==="
  cmake -S . -B "build/${name}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "build/${name}" -j"${jobs}"
  ctest --test-dir "build/${name}" --output-on-failure -j"${jobs}" ${CTEST_ARGS:-}
}
flavour release
# The checks flavour also builds reservoir-replay without cairo, so the refusal of
# PNG plots is tested as well as PNG output (release).
flavour checks -DRESERVOIR_CHECKS=ON -DRESERVOIR_BUILD_BENCH=OFF -DRESERVOIR_GPU_TESTS=OFF \
  -DRESERVOIR_WITH_CAIRO=OFF
if [ "${RESERVOIR_SKIP_SANITIZERS:-0}" != 1 ]; then
  # The asan flavour also builds the libFuzzer target (its library gains coverage
  # instrumentation), so the fuzz smoke below needs no build of its own.
  fuzz=OFF
  if [ "${RESERVOIR_SKIP_FUZZ:-0}" != 1 ]; then fuzz=ON; fi
  CC=clang CXX=clang++ flavour asan -DRESERVOIR_SANITIZE="address;undefined" \
    -DRESERVOIR_BUILD_BENCH=OFF -DRESERVOIR_GPU_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DRESERVOIR_FUZZ="${fuzz}"
fi

# Fuzz smoke: the random walk of tests/fuzz under libFuzzer (clang, ASan+UBSan) for
# a fixed number of runs from a fixed seed, on a copy of tests/corpus, so that CI
# meets what a short campaign would (the corpus itself is replayed by every flavour
# above). About a minute on two cores (90 executions a second). A finding fails the
# run and is saved in build/asan/fuzz-smoke/artifacts/ (minimize it and commit it to
# tests/corpus/). Campaigns use the fuzz preset (docs/reliability.md).
if [ "${RESERVOIR_SKIP_SANITIZERS:-0}" != 1 ] && [ "${RESERVOIR_SKIP_FUZZ:-0}" != 1 ]; then
  echo "=== fuzz smoke ==="
  smoke=build/asan/fuzz-smoke
  rm -rf "${smoke}"
  mkdir -p "${smoke}/corpus" "${smoke}/artifacts"
  cp tests/corpus/* "${smoke}/corpus/"
  # The same seed gives the same run only without address-space randomization (the
  # walk compares host addresses) and without timed re-reads of the corpus.
  ${norandom[@]+"${norandom[@]}"} build/asan/tests/fuzz/reservoir_fuzz "${smoke}/corpus" \
    -runs="${RESERVOIR_FUZZ_RUNS:-5000}" -seed=1 -reload=0 -max_len=1024 -timeout=30 -detect_leaks=0 \
    -print_final_stats=1 -artifact_prefix="${smoke}/artifacts/"
fi

# ThreadSanitizer (clang): the tsan preset builds the three test programs it needs and
# runs the thread stress, the conformance suite's thread tests and the tests of the
# engine's lock-free parts (CMakePresets.json lists them); a report fails its test.
# About 2 minutes on two cores.
if [ "${RESERVOIR_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "=== tsan ==="
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan -j"${jobs}"
  ${norandom[@]+"${norandom[@]}"} ctest --preset tsan -j"${jobs}"
fi

# clang-tidy over every .cpp under src/ (checks in .clang-tidy; any finding fails),
# from the compile commands of a configure-only clang build with full checks (so the
# checks-only code is analysed too). About 4 minutes on two cores. RESERVOIR_SKIP_TIDY=1
# skips it.
if [ "${RESERVOIR_SKIP_TIDY:-0}" != 1 ]; then
  echo "=== clang-tidy ==="
  CC=clang CXX=clang++ cmake -S . -B build/tidy -DRESERVOIR_CHECKS=ON -DRESERVOIR_BUILD_TESTS=OFF \
    -DRESERVOIR_BUILD_BENCH=OFF -DRESERVOIR_BUILD_TOOLS=OFF -DRESERVOIR_BUILD_EXAMPLES=OFF >/dev/null
  run-clang-tidy -p build/tidy -j"${jobs}" -quiet "$(pwd)/src/.*\.cpp$" >build/tidy/clang-tidy.log 2>&1 ||
    { sed 's/\x1b\[[0-9;]*m//g' build/tidy/clang-tidy.log | grep -A4 "warning:\|error:"; exit 1; }
fi
