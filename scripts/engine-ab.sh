#!/usr/bin/env bash
# A/B of engine builds on a noisy host: the engine benchmark (simulated device) run
# with each variant's libreservoir.so in turn, on the same CPU in the same round, so
# every variant meets the same neighbours; the answer is the median of each variant's
# ratio to the first one's time in the same round on the same CPU.
#   scripts/engine-ab.sh build NAME [PATCH...]   here: build/ab/NAME/ holds the library
#       of the working tree with the patches applied (then reverted; the tree must be
#       clean under src/), and build/ab/engine_bench the benchmark (public API only,
#       so one binary serves every variant)
#   scripts/engine-ab.sh run [CPUS] [ROUNDS]     anywhere the variants were carried
#       (device call: carry ["build/ab"]): CPUS a comma list (default 3,7,11), ROUNDS
#       (default 3); FILTER (default 'LogUniform|BM_Pair/512$'), MIN_TIME (0.3). The
#       reference is the variant whose name sorts first (e.g. a-base, b-try).
# The host's VM had no hardware counters: a variant's worth there can only be timed,
# and only side by side (docs/benchmarks.md, "A/B of engine builds").
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: scripts/engine-ab.sh build NAME [PATCH...] | run [CPUS] [ROUNDS]}
shift
case "$mode" in
  build)
    name=${1:?usage: scripts/engine-ab.sh build NAME [PATCH...]}
    shift
    git diff --quiet -- src || { echo "engine-ab: src/ has changes; commit or stash them" >&2; exit 2; }
    trap 'git checkout -q -- src' EXIT
    for p in "$@"; do git apply "$p"; done
    [ -d build/ab-build ] || cmake -S . -B build/ab-build -DCMAKE_BUILD_TYPE=Release \
      -DRESERVOIR_BUILD_TESTS=OFF -DRESERVOIR_BUILD_EXAMPLES=OFF -DRESERVOIR_BUILD_TOOLS=OFF \
      -DRESERVOIR_GPU_TESTS=OFF >/dev/null
    cmake --build build/ab-build --target reservoir reservoir_engine_bench -j"$(nproc)" >/dev/null
    mkdir -p "build/ab/$name"
    cp -L build/ab-build/src/libreservoir.so.0 "build/ab/$name/"
    # The benchmark library travels too: the GPU host's may be another version.
    cp -L "$(ldd build/ab-build/bench/reservoir_engine_bench | awk '/libbenchmark/ {print $3}')" \
      "build/ab/$name/"
    cp build/ab-build/bench/reservoir_engine_bench build/ab/engine_bench
    echo "engine-ab: build/ab/$name"
    ;;
  run)
    cpus=${1:-3,7,11}
    rounds=${2:-3}
    variants=$(cd build/ab && for d in */; do echo "${d%/}"; done)
    [ -n "$variants" ] || { echo "engine-ab: no variants in build/ab" >&2; exit 2; }
    log=$(mktemp)
    for ((r = 1; r <= rounds; ++r)); do
      for c in ${cpus//,/ }; do
        for v in $variants; do
          LD_LIBRARY_PATH="build/ab/$v" taskset -c "$c" build/ab/engine_bench \
            --benchmark_filter="${FILTER:-LogUniform|BM_Pair/512\$}" \
            --benchmark_min_time="${MIN_TIME:-0.3}" --benchmark_format=csv 2>/dev/null |
            awk -F, -v r="$r" -v c="$c" -v v="$v" \
              'NR > 1 && $1 ~ /^"/ {gsub(/"/, "", $1); print r, c, v, $1, $3}' >>"$log"
        done
      done
    done
    python3 - "$log" <<'EOF'
import collections, statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
variants = list(dict.fromkeys(r[2] for r in rows))
base = variants[0]
for bench in dict.fromkeys(r[3] for r in rows):
    times = collections.defaultdict(dict)  # (round, cpu) -> variant -> ns
    for r, c, v, b, ns in rows:
        if b == bench:
            times[(r, c)][v] = float(ns)
    print(f"{bench} (ratio: to {base} in the same round on the same CPU)")
    for v in variants:
        got = [t[v] for t in times.values() if v in t]
        ratios = [t[v] / t[base] for t in times.values() if v in t and base in t]
        print(f"  {v:20s} median {statistics.median(got):8.1f} ns  min {min(got):8.1f}"
              f"  ratio {statistics.median(ratios):.3f}  ({len(got)} runs)")
EOF
    rm -f "$log"
    ;;
  *)
    echo "usage: scripts/engine-ab.sh build NAME [PATCH...] | run [CPUS] [ROUNDS]" >&2
    exit 2
    ;;
esac
