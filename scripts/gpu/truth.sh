#!/usr/bin/env bash
# Replays against PyTorch on the GPU: what the CUDA driver and PyTorch's allocator do,
# for Reservoir and its simulated device to agree with (docs/gpu-truth.md).
#
#   scripts/gpu/truth.sh OUT [PART...]        (log in OUT/truth.log)
#
# Parts (default: truth replays), run in this order:
#   placement  the driver placement probe (built-in scenarios, the op lists of
#              bench/gpu/placement/ops, live replays of traces/)  -> OUT/placement.tar.gz
#   capture    the workloads of bench/python/workloads captured as traces
#              (scripts/capture-traces.sh)                       -> OUT/captured/NAME.trace.gz
#   truth      every trace under the settings matrix through PyTorch's c10 (with fit
#              searches), cudaMallocAsync, and Reservoir on the GPU and on the simulated
#              device (bench/gpu/gpu_truth.py)                    -> OUT/gpu_truth.json
#              (committed as traces/gpu_truth.json)
#   replays    every bundled trace replayed on the GPU and on the simulated device under
#              the default, expandable_segments:True and policy:compact; peak reserved
#              must be equal                                      -> OUT/replay-TRACE-{cuda,sim}.json
#   graphs     the programs that capture CUDA graphs (bench/python/workloads/graph_decode.py,
#              compile_gpt2_train.py), each run under PyTorch's allocator and recorded
#              under Reservoir (python3 -m reservoir.capture), under the default and
#              expandable_segments:True; each recording replayed on the GPU and the
#              simulated device, and through c10 with --fit, after one warm-up run of
#              each (torch.compile's first run compiles, and allocates otherwise); the
#              live and replayed peaks, graph pools and capture ladders must be equal
#              (traces/gpu_truth.json, key "graph_traces")      -> OUT/graphs/
#   async      every bundled trace replayed with backend:cudaMallocAsync on the GPU,
#              within 1% of what cudaMallocAsync reserved under PyTorch
#              (traces/gpu_truth.json, key "async"); the simulated pool's figure beside
#              it                                                 -> OUT/async-TRACE-{cuda,sim}.json
# Env: TRUTH_TRACES (the traces of the truth part, default traces/*.trace.gz and
# OUT/captured/*.trace.gz), GPU_TRUTH_BUDGET (seconds for the truth part's replays:
# what does not fit is dropped, the fit searches first; default what GPU_RUN_SECONDS
# leaves, else 330), TRUTH_NO_GPU=1 (no GPU needed: truth replays on the simulated
# device only, placement with --device sim; the other parts need a GPU),
# CAPTURE_ARGS_NAME and CAPTURE_TIMEOUT (scripts/capture-traces.sh), and those of
# scripts/gpu/common.sh (RESERVOIR_GPU_BUILD, CLI11_INCLUDE_DIR, GPU_RUN_SECONDS,
# GPU_TARBALL, GPU_DRY_RUN, FUZZER).
known_parts="placement capture truth replays graphs async"
default_parts="truth replays"
source "$(dirname "$0")/common.sh"
no_gpu=${TRUTH_NO_GPU:-0}
replay=$gpu_b/tools/replay/reservoir-replay

placement() {
  local dir=$gpu_b/placement-probe rc device=cuda
  ((no_gpu)) && device=sim
  rm -rf "$dir"
  "$gpu_b/bench/gpu/placement/reservoir_placement_probe" --out "$dir" --device "$device" \
    --ops bench/gpu/placement/ops --traces traces >"$out/placement-probe.log" 2>&1
  rc=$?
  # The header, and the engine's sequences under pressure and live (the rest in the tarball).
  grep -E '^#|^(ops\..*_at_fit|live\..*\.default) ' "$out/placement-probe.log" | head -n 16
  echo "$(grep -vc '^#' "$out/placement-probe.log") scenarios logged"
  [ -d "$dir" ] && tar czf "$out/placement.tar.gz" -C "$(dirname "$dir")" "$(basename "$dir")"
  return $rc
}

capture() {
  RESERVOIR_GPU_BUILD=$gpu_b CAPTURE_LOGS="$out/capture-logs" scripts/capture-traces.sh "$out/captured"
}

truth() {  # BUDGET_SECONDS
  local traces
  read -ra traces <<<"${TRUTH_TRACES:-$(ls traces/*.trace.gz "$out"/captured/*.trace.gz 2>/dev/null | tr '\n' ' ')}"
  python3 bench/gpu/gpu_truth.py --build "$gpu_b" --out "$out/gpu_truth.json" --budget "$1" \
    $( ((no_gpu)) && echo --no-gpu) "${traces[@]}"
}

replays() {
  local f t dev status=0
  for f in traces/*.trace.gz; do
    t=$(basename "$f" .trace.gz)
    for dev in cuda sim; do
      "$replay" "$f" --device $dev --json --config "" --config expandable_segments:True \
        --config policy:compact >"$out/replay-$t-$dev.json" || status=1
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
  return $status
}

graphs() {
  local dir=$out/graphs w k conf status=0
  mkdir -p "$dir"
  local c10=$gpu_b/bench/gpu/reservoir_c10_replay
  export RESERVOIR_LIBRARY=$gpu_b/src/libreservoir.so PYTHONPATH=$PWD/python
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$gpu_b/inductor}
  for w in graph_decode compile_gpt2_train; do
    # A first run compiles (torch.compile's caches are cold) and allocates otherwise
    # than every later one: a warm-up run, so that each measured run is a later one.
    python3 "bench/python/workloads/$w.py" >"$dir/$w-warmup.log" 2>&1 || status=1
    for k in default expandable; do
      conf=""
      [ $k = expandable ] && conf=expandable_segments:True
      PYTORCH_CUDA_ALLOC_CONF=$conf python3 "bench/python/workloads/$w.py" \
        --figures "$dir/$w-$k.c10.json" >"$dir/$w-$k.c10.log" 2>&1 || status=1
      python3 -m reservoir.capture --out "$dir/$w-$k.trace.gz" ${conf:+--config $conf} \
        "bench/python/workloads/$w.py" --figures "$dir/$w-$k.live.json" \
        >"$dir/$w-$k.live.log" 2>&1 || status=1
      "$replay" "$dir/$w-$k.trace.gz" --config "$conf" --json >"$dir/$w-$k.sim.json" || status=1
      "$replay" "$dir/$w-$k.trace.gz" --config "$conf" --device cuda --json \
        >"$dir/$w-$k.cuda.json" || status=1
      [ -x "$c10" ] && PYTORCH_CUDA_ALLOC_CONF=$conf "$c10" "$dir/$w-$k.trace.gz" --fit \
        >"$dir/$w-$k.c10replay.json" 2>/dev/null
    done
  done
  python3 - "$dir" <<'PY' || status=1
import json, os, sys
d = sys.argv[1]
ok = True
for w in ("graph_decode", "compile_gpt2_train"):
    for k in ("default", "expandable"):
        load = lambda s: json.load(open(os.path.join(d, "%s-%s.%s.json" % (w, k, s))))
        c10, live, sim, gpu = load("c10"), load("live"), load("sim")[0], load("cuda")[0]
        peaks = {c10["max_memory_reserved"], live["max_memory_reserved"], sim["peak_reserved"],
                 gpu["peak_reserved"]}
        pools = {sum(c10["pools_reserved"].values()), sum(live["pools_reserved"].values()),
                 sum(p["end_reserved"] for p in sim["pools"]),
                 sum(p["end_reserved"] for p in gpu["pools"])}
        same = len(peaks) == 1 and len(pools) == 1
        if "graph_pool_after_capture" in live:
            ladder = [live["graph_pool_after_capture"][str(b)] for b in live["ladder"]]
            same &= ladder == [c["pools_reserved_after"] for c in sim["captures"]]
        ok &= same
        print("%s %-20s %-10s peak reserved %s, graph pools %s" % (
            "PASS" if same else "FAIL", w, k, sorted(peaks), sorted(pools)))
sys.exit(0 if ok else 1)
PY
  return $status
}

async() {
  local f t dev status=0
  for f in traces/*.trace.gz; do
    t=$(basename "$f" .trace.gz)
    for dev in cuda sim; do
      "$replay" "$f" --device $dev --json --config backend:cudaMallocAsync \
        >"$out/async-$t-$dev.json" 2>"$out/async-$t-$dev.err" ||
        { echo "FAIL replay $t on $dev: $(tail -1 "$out/async-$t-$dev.err")"; status=1; }
    done
  done
  python3 - "$out" traces/gpu_truth.json <<'PY' || status=1
import json, os, sys
out, truth = sys.argv[1], json.load(open(sys.argv[2]))
ok = True
for t, cell in truth["traces"].items():
    want = (cell.get("async") or {}).get("peak_reserved")
    for dev in ("cuda", "sim"):
        try:
            got = json.load(open(os.path.join(out, "async-%s-%s.json" % (t, dev))))[0]["peak_reserved"]
        except Exception as e:  # the replay failed: reported above
            print("FAIL replay async %-26s %-4s no result (%s)" % (t, dev, e)); ok = False
            continue
        ratio = got / want
        good = abs(ratio - 1) <= 0.01
        # The GPU replay is the check; the simulated pool's figure is reported beside it
        # (docs/async.md says how close the model comes and why).
        verdict = ("PASS" if good else "FAIL") if dev == "cuda" else "INFO"
        ok &= good or dev != "cuda"
        print("%s replay async %-26s %-4s reserved %14d, cudaMallocAsync under PyTorch %14d: %.4fx"
              % (verdict, t, dev, got, want, ratio))
sys.exit(0 if ok else 1)
PY
  return $status
}
gpu_fn "$@"

gpu_begin truth "$@"
if ((no_gpu)); then
  for p in replays graphs async capture; do wants $p && echo "truth: part $p needs a GPU (TRUTH_NO_GPU=1)" && exit 2; done
fi
targets=()
{ wants truth || wants replays || wants async || wants graphs; } && targets+=(reservoir-replay)
wants graphs && targets+=(reservoir)
wants truth && ! ((no_gpu)) && targets+=(reservoir_async_replay)
wants placement && targets+=(reservoir_placement_probe)
wants capture && targets+=(reservoir)
if { wants truth || wants graphs; } && ! ((no_gpu)); then
  gpu_build --torch "${targets[@]}"
  # c10 on its own: if it does not build, the other columns are still measured.
  gpu_build --torch reservoir_c10_replay || echo "truth: reservoir_c10_replay did not build: no c10 figures"
else
  gpu_build "${targets[@]}"
fi

wants placement && step placement placement
wants capture && step capture capture
if wants truth; then
  budget=${GPU_TRUTH_BUDGET:-330}
  if [ -z "${GPU_TRUTH_BUDGET:-}" ] && ((gpu_deadline > 0)); then
    budget=$((gpu_deadline - SECONDS - 25))
    ((budget > 60)) || budget=60
  fi
  step truth truth "$budget"
fi
wants replays && step replays replays
wants graphs && step graphs graphs
wants async && step async async
gpu_end
