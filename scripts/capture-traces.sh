#!/usr/bin/env bash
# On a GPU machine: captures the allocation traces of the workloads in
# bench/python/workloads/ as OUTDIR/<name>.trace.gz, with Reservoir's recorder
#   python3 -m reservoir.capture --out OUTDIR/<name>.trace.gz bench/python/workloads/<name>.py
# (Reservoir as PyTorch's allocator; the trace gets record_stream and host-wait lines),
# or, where reservoir.capture is missing or fails, with PyTorch's memory history
# (bench/python/workloads/snapshot_capture.py: a and f lines only). Prints how each was
# captured and the trace's figures (tools/trace_stats.py).
#
# Usage: scripts/capture-traces.sh OUTDIR [WORKLOAD...]   (default: all five)
# Env:   RESERVOIR_GPU_BUILD (build directory with src/libreservoir.so, default
#        build/gpu; built if missing), CAPTURE_LOGS (where the workloads' output goes,
#        default OUTDIR), CAPTURE_TIMEOUT (seconds per capture, default 150),
#        CAPTURE_ARGS_<name> (extra arguments, e.g. CAPTURE_ARGS_infer_varbatch="--steps 300").
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/capture-traces.sh OUTDIR [WORKLOAD...]}
shift
mkdir -p "$out"
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] ||
  workloads=(textgen_varbatch infer_varbatch pipeline_multistream encoder_varbatch threads_textgen)
b=${RESERVOIR_GPU_BUILD:-build/gpu}
logs=${CAPTURE_LOGS:-$out}
mkdir -p "$logs"
lib="$b/src/libreservoir.so"
[[ $lib == /* ]] || lib="$PWD/$lib"
if [ ! -f "$lib" ]; then
  { cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release && cmake --build "$b" -j"$(nproc)" --target reservoir; } \
    >"$logs/capture-build.log" 2>&1 || echo "capture: building libreservoir.so failed ($logs/capture-build.log)"
fi
# The package from this checkout, with the library just built (docs/python.md).
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" RESERVOIR_LIBRARY="$lib"
have_capture=0
if python3 -c "import reservoir.capture" 2>/dev/null; then
  have_capture=1
else
  echo "capture: reservoir.capture is not importable here: using PyTorch's memory history"
fi
status=0
for w in "${workloads[@]}"; do
  script="bench/python/workloads/$w.py"
  trace="$out/$w.trace.gz"
  log="$logs/$w.log"
  extra_var="CAPTURE_ARGS_$w"
  read -r -a extra <<<"${!extra_var:-}"
  : >"$log"
  t0=$SECONDS
  how=""
  rm -f "$trace"
  if ((have_capture)); then
    if timeout "${CAPTURE_TIMEOUT:-150}" python3 -m reservoir.capture --out "$trace" "$script" \
      "${extra[@]}" >>"$log" 2>&1 && [ -s "$trace" ]; then
      how="reservoir.capture"
    else
      echo "capture $w: reservoir.capture failed after $((SECONDS - t0)) s (see $log); falling back:"
      tail -n 3 "$log" | sed 's/^/    /'
      rm -f "$trace"
    fi
  fi
  if [ -z "$how" ]; then
    echo "--- memory history fallback" >>"$log"
    if timeout "${CAPTURE_TIMEOUT:-150}" python3 bench/python/workloads/snapshot_capture.py \
      --out "$trace" "$script" "${extra[@]}" >>"$log" 2>&1 && [ -s "$trace" ]; then
      how="PyTorch memory history"
    fi
  fi
  if [ -n "$how" ]; then
    echo "capture $w ($how, $((SECONDS - t0)) s, $(du -h "$trace" | cut -f1)):$(python3 tools/trace_stats.py "$trace" | cut -d: -f2-)"
    echo "    $(grep "^$w: " "$log" | tail -n 1)"
  else
    echo "capture $w: FAILED after $((SECONDS - t0)) s; the end of $log:"
    tail -n 8 "$log" | sed 's/^/    /'
    status=1
  fi
done
exit $status
