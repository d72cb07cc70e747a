#!/usr/bin/env bash
# The main job: builds Reservoir and replays a bundled real trace (GPT-2 training
# with a varying sequence length) under three settings, side by side, with the
# smallest memory it fits in. Replays on the GPU when one is present (and reports
# the real device's figures), else on the simulated H200.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" --target reservoir-replay
exec build/release/tools/replay/reservoir-replay traces/gpt2_train_varlen.trace.gz --fit --device auto \
  --config "" --config "expandable_segments:True" --config "max_split_size_mb:256" "$@"
