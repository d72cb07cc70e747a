#!/usr/bin/env bash
# Issue 17 on a machine with two NVIDIA GPUs (not lent so far: ready to run).
# 1. torchrun --nproc_per_node 2 GPT-2 DDP training (bench/python/two_gpu.py ddp) under
#    PyTorch's allocator and Reservoir's default, expandable_segments:True and
#    policy:compact: the losses must equal PyTorch's (same seed; bf16 autocast makes
#    them equal to the printed digits when the kernels are the same), peak reserved
#    per rank printed;
# 2. an NCCL all-reduce over Reservoir memory in each mode (two_gpu.py allreduce);
# 3. peer copies between the two devices from two threads (two_gpu.py peer).
# Needs torch with NCCL and transformers. Prints PASS/FAIL lines and
# "gpu2: ok" at the end. Usage: scripts/gpu2-ddp.sh [OUTDIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/gpu2}
mkdir -p "$out"
exec > >(tee "$out/gpu2.log") 2>&1
cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build build/gpu -j"$(nproc)" --target reservoir >/dev/null || { echo "FAIL build"; exit 1; }
export RESERVOIR_LIBRARY=$PWD/build/gpu/src/libreservoir.so PYTHONPATH=$PWD/python
n=$(python3 -c "import torch; print(torch.cuda.device_count())")
((n >= 2)) || { echo "FAIL this machine has $n GPU(s); two are needed"; exit 1; }
status=0
w=bench/python/two_gpu.py
for mode in pytorch default expandable compact; do
  timeout 600 torchrun --standalone --nproc_per_node 2 $w ddp $mode "$out/ddp-$mode.json" \
    >"$out/ddp-$mode.txt" 2>&1 || { echo "FAIL ddp $mode (see $out/ddp-$mode.txt)"; status=1; }
  [ $mode = pytorch ] && continue
  timeout 300 torchrun --standalone --nproc_per_node 2 $w allreduce $mode "$out/ar-$mode.json" \
    >"$out/ar-$mode.txt" 2>&1 || { echo "FAIL allreduce $mode (see $out/ar-$mode.txt)"; status=1; }
  timeout 300 python3 $w peer $mode "$out/peer-$mode.json" >"$out/peer-$mode.txt" 2>&1 ||
    { echo "FAIL peer $mode (see $out/peer-$mode.txt)"; status=1; }
done
python3 - "$out" <<'PY' || status=1
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception:
        return None
ok = True
ref = load("ddp-pytorch.json")
if ref:
    print("ddp pytorch: peak reserved per rank %s MiB, final loss %.4f"
          % ([p >> 20 for p in ref["peak_reserved"]], ref["losses"][-1]))
for mode in ("default", "expandable", "compact"):
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
    for what in ("ar", "peer"):
        r = load("%s-%s.json" % (what, mode))
        good = bool(r and r.get("ok"))
        ok &= good
        print("%s %s %s: %s" % ("PASS" if good else "FAIL", {"ar": "allreduce"}.get(what, what),
                                mode, json.dumps(r)))
sys.exit(0 if ok else 1)
PY
echo "gpu2: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
