#!/usr/bin/env bash
# Reservoir as PyTorch's allocator on a GPU: the drop-in's checks, CUDA graphs, and
# training beside PyTorch's own allocator (docs/python.md, docs/pools.md).
#
#   scripts/gpu/torch.sh OUT [PART...]        (log in OUT/torch.log)
#
# Parts (default: native memory-api graphs viewer):
#   native      builds reservoir.torch's native part (python3 -m reservoir._torch_native -v;
#               its cache in OUT/native-cache, dropped at the end)
#   memory-api  tests/python/gpu/test_torch_memory_api.py: torch.cuda's memory API, OOM as
#               torch.cuda.OutOfMemoryError, traces recorded by every front replayed to
#               the live peaks
#   graphs      tests/python/gpu/test_torch_graphs.py: torch.cuda.graph, make_graphed_callables,
#               torch.compile(mode="reduce-overhead") and torch.cuda.MemPool, each on
#               PyTorch's allocator and on Reservoir, outputs equal (needs transformers
#               for the GPT-2 case; success: 6 tests, OK, none skipped)
#   viewer      a replayed trace's snapshot through PyTorch's memory viewer
#               (torch.cuda._memory_viz trace_plot, segment_plot) -> OUT/trace.html, OUT/segments.html
#   cudnn       bench/python/cudnn_bench.py: ResNet-50 with cudnn.benchmark off and on, both
#               allocators                                 -> OUT/cudnn.json
#   train       bench/python/train_bench.py: GPT-2, ResNet-50 and a three-stream model
#               under PyTorch's allocator (default and expandable segments) and Reservoir
#               (default and policy:compact): losses, peak reserved, step times -> OUT/train_bench.json
#   sources     PyTorch's allocator-facing Python files and headers, for reading
#               -> OUT/torch-src.tar.gz
# Env: RESERVOIR_LIBRARY (the libreservoir.so the Python parts use; default the one this
# script builds), CUDNN_ROUNDS (default 3), CUDNN_STEPS (default 30), TRAIN_MODELS
# (default gpt2,resnet50,multistream), TRAIN_VARIANTS (train_bench.py --variants, default
# pytorch,pytorch:expandable_segments:True,reservoir,reservoir:policy:compact),
# TRAIN_ROUNDS (--rounds, default 1), TRAIN_STEPS (--steps, default per model),
# TRAIN_LOCKSTEP (default 1: the variants side by side, step by step, --lockstep), and
# those of scripts/gpu/common.sh (RESERVOIR_GPU_BUILD, CLI11_INCLUDE_DIR,
# GPU_RUN_SECONDS, GPU_TARBALL, GPU_DRY_RUN, FUZZER).
known_parts="native memory-api graphs viewer cudnn train sources"
default_parts="native memory-api graphs viewer"
source "$(dirname "$0")/common.sh"

viewer() {
  "$gpu_b/tests/observability/reservoir_snapshot_demo" traces/resnet50_train.trace.gz \
    "$out/snap.pickle" &&
    python3 -m torch.cuda._memory_viz trace_plot "$out/snap.pickle" -o "$out/trace.html" &&
    python3 -m torch.cuda._memory_viz segment_plot "$out/snap.pickle" -o "$out/segments.html" &&
    ls -la "$out/trace.html" "$out/segments.html"
}

sources() {
  python3 - "$out/torch-src.tar.gz" <<'PY'
import glob, os, sys, tarfile
import torch
site = os.path.dirname(os.path.dirname(torch.__file__))
wanted = ["torch/cuda/memory.py", "torch/cuda/graphs.py", "torch/cuda/__init__.py",
          "torch/_inductor/cudagraph_trees.py", "torch/cuda/_memory_viz.py", "torch/version.py",
          "torch/include/torch/csrc/cuda/CUDAPluggableAllocator.h",
          "torch/include/c10/cuda/CUDACachingAllocator.h",
          "torch/include/c10/core/CachingDeviceAllocator.h"]
wanted += sorted(os.path.relpath(p, site) for p in glob.glob(os.path.join(site, "torch/accelerator/*.py")))
found = [w for w in wanted if os.path.isfile(os.path.join(site, w))]
with tarfile.open(sys.argv[1], "w:gz") as tar:
    for w in found:
        tar.add(os.path.join(site, w), arcname=w)
print(f"torch {torch.__version__}: {len(found)} files; missing: {sorted(set(wanted) - set(found)) or 'none'}")
PY
}
gpu_fn "$@"

gpu_begin torch "$@"
lib=${RESERVOIR_LIBRARY:-$gpu_b/src/libreservoir.so}
[[ $lib == /* ]] || lib=$PWD/$lib
py=(env "RESERVOIR_LIBRARY=$lib" "PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  "RESERVOIR_CACHE_DIR=$out/native-cache")
targets=(reservoir)
wants viewer && targets+=(reservoir_snapshot_demo)
gpu_build "${targets[@]}"
export RESERVOIR_TEST_LOG_DIR="$out/logs"

wants native && step native "${py[@]}" python3 -m reservoir._torch_native -v
wants memory-api && step memory-api "${py[@]}" python3 -m unittest discover -s tests/python/gpu \
  -p test_torch_memory_api.py -v
wants graphs && step graphs "${py[@]}" python3 -m unittest discover -s tests/python/gpu \
  -p test_torch_graphs.py -v
wants viewer && step viewer viewer
wants cudnn && step cudnn "${py[@]}" python3 bench/python/cudnn_bench.py \
  --rounds "${CUDNN_ROUNDS:-3}" --steps "${CUDNN_STEPS:-30}" --json "$out/cudnn.json"
if wants train; then
  lockstep=()
  [ "${TRAIN_LOCKSTEP:-1}" = 1 ] && lockstep=(--lockstep)
  step train "${py[@]}" python3 bench/python/train_bench.py \
    --models "${TRAIN_MODELS:-gpt2,resnet50,multistream}" --rounds "${TRAIN_ROUNDS:-1}" \
    ${TRAIN_STEPS:+--steps "$TRAIN_STEPS"} "${lockstep[@]}" \
    --variants "${TRAIN_VARIANTS:-pytorch,pytorch:expandable_segments:True,reservoir,reservoir:policy:compact}" \
    --deterministic --json "$out/train_bench.json"
fi
wants sources && step sources sources
rm -rf "$out/native-cache"
gpu_end
