#!/usr/bin/env bash
# CUDA graphs, MemPool and torch.compile(mode="reduce-overhead") on Reservoir, on a
# GPU machine with PyTorch (and transformers for the GPT-2 case): each case runs
# once on PyTorch's allocator and once on Reservoir, and the outputs must be equal
# (tests/python/gpu/test_torch_graphs.py; docs/pools.md).
#
#   scripts/gpu-torch-graphs.sh [LIBRARY]
#
# LIBRARY: libreservoir.so to use (default: the newest build*/**/src/libreservoir.so;
# build one with `cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release && cmake --build
# build-cuda -j`). Success: the last line is "OK" with 6 tests run and none skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
library="${1:-$(ls -t build*/src/libreservoir.so build*/*/src/libreservoir.so 2>/dev/null | head -1 || true)}"
if [[ -z "$library" || ! -f "$library" ]]; then
  echo "gpu-torch-graphs: no libreservoir.so found; build one first (docs/gpu.md)" >&2
  exit 2
fi
echo "gpu-torch-graphs: library $library"
RESERVOIR_LIBRARY="$(realpath "$library")" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
  python3 -m unittest discover -v -s tests/python/gpu -p test_torch_graphs.py
