#!/usr/bin/env bash
# Several GPUs of one host: Reservoir under PyTorch's distributed training (docs/ipc.md,
# "Several devices"). Needs two GPUs or more, torch with NCCL, and transformers.
#
#   scripts/gpu/multi-gpu.sh OUT [PART...]    (log in OUT/multi-gpu.log)
#
# Parts (default: ddp allreduce peer), each in every mode: PyTorch's own allocator
# (ddp only, the reference), and Reservoir's default, expandable_segments:True and
# policy:compact (bench/python/two_gpu.py runs the workers):
#   ddp        torchrun --nproc_per_node 2: GPT-2 small DDP training; the losses must
#              equal PyTorch's (same seed; bf16 autocast keeps them equal to the printed
#              digits when the kernels are the same), peak reserved per rank printed
#   allreduce  an NCCL all-reduce over Reservoir memory
#   peer       peer copies between the two devices from two threads
# One PASS/FAIL line per check. Env: those of scripts/gpu/common.sh
# (RESERVOIR_GPU_BUILD, GPU_RUN_SECONDS, GPU_TARBALL, GPU_DRY_RUN, FUZZER).
known_parts="ddp allreduce peer"
default_parts="ddp allreduce peer"
source "$(dirname "$0")/common.sh"
w=bench/python/two_gpu.py

verdict() {
  python3 - "$out" "$@" <<'PY'
import json, os, sys
out, parts = sys.argv[1], sys.argv[2:]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception:
        return None
ok = True
ref = load("ddp-pytorch.json")
if "ddp" in parts and ref:
    print("ddp pytorch: peak reserved per rank %s MiB, final loss %.4f"
          % ([p >> 20 for p in ref["peak_reserved"]], ref["losses"][-1]))
for mode in ("default", "expandable", "compact"):
    if "ddp" in parts:
        d = load("ddp-%s.json" % mode)
        if d and ref:
            diff = max(abs(a - b) for a, b in zip(d["losses"], ref["losses"]))
            good = diff <= 1e-3
            ok &= good
            print("%s ddp %s: peak reserved per rank %s MiB (pytorch %s), max loss difference %.2e"
                  % ("PASS" if good else "FAIL", mode, [p >> 20 for p in d["peak_reserved"]],
                     [p >> 20 for p in ref["peak_reserved"]], diff))
        else:
            ok = False
            print("FAIL ddp %s: no result" % mode)
    for what in ("allreduce", "peer"):
        if what in parts:
            r = load("%s-%s.json" % (what, mode))
            good = bool(r and r.get("ok"))
            ok &= good
            print("%s %s %s: %s" % ("PASS" if good else "FAIL", what, mode, json.dumps(r)))
sys.exit(0 if ok else 1)
PY
}

gpus() {
  local n
  n=$(python3 -c "import torch; print(torch.cuda.device_count())")
  echo "$n GPU(s)"
  ((n >= 2))
}
gpu_fn "$@"

gpu_begin multi-gpu "$@"
gpu_build reservoir
export RESERVOIR_LIBRARY=$PWD/$gpu_b/src/libreservoir.so PYTHONPATH=$PWD/python
step gpus gpus || { gpu_end; }
modes="default expandable compact"
wants ddp && modes="pytorch $modes"
for mode in $modes; do
  wants ddp && step "ddp-$mode" torchrun --standalone --nproc_per_node 2 $w ddp $mode \
    "$out/ddp-$mode.json"
  [ $mode = pytorch ] && continue
  wants allreduce && step "allreduce-$mode" torchrun --standalone --nproc_per_node 2 $w \
    allreduce $mode "$out/allreduce-$mode.json"
  wants peer && step "peer-$mode" python3 $w peer $mode "$out/peer-$mode.json"
done
step verdict verdict "${parts[@]}"
gpu_end
