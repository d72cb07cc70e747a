#!/usr/bin/env bash
# The whole test suite: builds and tests the release flavour and the full-check
# flavour (validator after every operation), then the ASan+UBSan flavour.
# GPU tests are built when a CUDA toolkit is present and skip without a device.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
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
  CC=clang CXX=clang++ flavour asan -DRESERVOIR_SANITIZE="address;undefined" \
    -DRESERVOIR_BUILD_BENCH=OFF -DRESERVOIR_GPU_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
