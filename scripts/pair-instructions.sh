#!/usr/bin/env bash
# Instructions per alloc+free pair (or log-uniform step) under callgrind: the stable
# figure of the host cost on a noisy machine (docs/benchmarks.md).
#   scripts/pair-instructions.sh BUILD_DIR [512 1048576 67108864 logu 512@2 1024~8 ...]
# Two runs per pattern (10,000 and 20,000 pairs); the difference of their totals
# divided by 10,000, so the warm-up and the set-up cancel out. Build with -O2 -g
# (RelWithDebInfo) for line-level profiles (callgrind_annotate).
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [PATTERN...]}
shift
patterns=("$@")
[ ${#patterns[@]} -gt 0 ] || patterns=(512 1048576 67108864 logu)
bin="${build}/bench/reservoir_pair_instructions"
[ -x "${bin}" ] || { echo "no ${bin}: build the target reservoir_pair_instructions" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "${out}"' EXIT
for pattern in "${patterns[@]}"; do
  totals=()
  for n in 10000 20000; do
    valgrind --tool=callgrind --toggle-collect='*run_pattern*' \
      --callgrind-out-file="${out}/cg.${pattern}.${n}" "${bin}" "${pattern}" "${n}" 2>"${out}/log"
    totals+=("$(awk '/^summary:|^totals:/ {print $2; exit}' "${out}/cg.${pattern}.${n}")")
  done
  echo "${pattern}: $(( (totals[1] - totals[0]) / 10000 )) instructions per pair"
done
