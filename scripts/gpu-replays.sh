#!/usr/bin/env bash
# Every bundled trace replayed on the GPU and then on the simulated device under the
# default, expandable_segments:True and policy:compact; the two must agree on peak
# reserved (policy:compact's host ns/event is compared with cudaMallocAsync's in
# docs/memory.md). Used by scripts/gpu-check.sh and scripts/gpu-run-b.sh.
#   scripts/gpu-replays.sh REPLAY_TOOL OUTDIR     (OUTDIR/replay-TRACE-{cuda,sim}.json)
set -uo pipefail
cd "$(dirname "$0")/.."
tool=${1:?usage: scripts/gpu-replays.sh REPLAY_TOOL OUTDIR}
out=${2:?usage: scripts/gpu-replays.sh REPLAY_TOOL OUTDIR}
mkdir -p "$out"
status=0
for f in traces/*.trace.gz; do
  t=$(basename "$f" .trace.gz)
  for dev in cuda sim; do
    $tool "$f" --device $dev --json --config "" \
      --config expandable_segments:True --config policy:compact >"$out/replay-$t-$dev.json" ||
      status=1
  done
  python3 - "$out/replay-$t-cuda.json" "$out/replay-$t-sim.json" "$t" <<'PY' || status=1
import json, sys
gpu, sim = (json.load(open(p)) for p in sys.argv[1:3])
ok = True
for g, s in zip(gpu, sim):
    same = g["peak_reserved"] == s["peak_reserved"]
    ok &= same
    print("%-26s %-26s gpu %15d sim %15d %s  gpu ns/event %8.1f  device allocs %d" % (
        sys.argv[3], g["config"] or "default", g["peak_reserved"], s["peak_reserved"],
        "equal" if same else "DIFFER", g["ns_per_event"], g["device_allocs"]))
sys.exit(0 if ok else 1)
PY
done
exit $status
