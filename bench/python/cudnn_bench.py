#!/usr/bin/env python3
"""ResNet-50 training step time, Reservoir against PyTorch's allocator, with
torch.backends.cudnn.benchmark off and on, side by side in one run:

    python3 bench/python/cudnn_bench.py                    # 40 steps, 3 rounds
    python3 bench/python/cudnn_bench.py --steps 60 --rounds 5 --json cudnn.json

Each cell is a fresh process (train_bench.py's worker: torchvision resnet50(),
batch 16, 224x224, SGD with momentum). Rounds alternate the four cells so that
clock or thermal drift hits all of them alike; the figure is the median step time
after warm-up, pooled over the rounds. The target is Reservoir within 3% of
PyTorch in both settings.

Why benchmark=True matters: cuDNN's benchmark sizes its workspace by asking the
allocator for its largest cached block (CUDACachingAllocator::cacheInfo), which
PyTorch's pluggable interface does not forward ("CUDAPluggableAllocator does not
yet support cacheInfo"); reservoir.torch's native part (reservoir._torch_native)
answers it, and the note column says whether it was in use. A cell that fails
prints the first line of its error; the Markdown table at the end is the one
docs/benchmarks.md keeps.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_bench  # noqa: E402

ALLOCATORS = ("pytorch", "reservoir")
MODES = (False, True)


def first_line(error):
    for line in str(error).splitlines():
        line = line.strip()
        if "Error" in line or "error" in line:
            return line[:200]
    return str(error).splitlines()[0][:200] if str(error) else "failed"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8,
                        help="steps left out (benchmark=True searches algorithms at first)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    times = {(a, m): [] for a in ALLOCATORS for m in MODES}
    errors = {}
    extra = {}
    for round_number in range(args.rounds):
        for mode in MODES:
            for allocator in ALLOCATORS if round_number % 2 == 0 else reversed(ALLOCATORS):
                cell = (allocator, mode)
                if cell in errors:
                    continue
                print("round %d: resnet50 on %s, cudnn.benchmark=%s ..."
                      % (round_number + 1, allocator, mode), flush=True)
                try:
                    result = train_bench.run_training(
                        "resnet50", allocator, steps=args.steps, batch=args.batch,
                        cudnn_benchmark=mode)
                except RuntimeError as error:
                    errors[cell] = first_line(error)
                    print("  failed: %s" % errors[cell], flush=True)
                    continue
                times[cell].extend(result["step_times"][args.warmup:])
                extra[cell] = {"peak_reserved": result["peak_reserved"],
                               "device": result["device"], "torch": result["torch"],
                               "memory_api": result.get("memory_api"),
                               "native": result.get("native")}

    rows = []
    for mode in MODES:
        base = times[("pytorch", mode)]
        for allocator in ALLOCATORS:
            cell = (allocator, mode)
            if cell in errors:
                rows.append((mode, allocator, "fails", "", errors[cell]))
                continue
            median = statistics.median(times[cell])
            ratio = "%.3fx" % (median / statistics.median(base)) if base else ""
            peak = extra[cell]["peak_reserved"] / (1 << 20)
            note = "peak reserved %.0f MiB" % peak
            native = extra[cell].get("native")
            if native is not None:
                note += "; native cacheInfo %s" % ("on" if native.get("active") else
                                                   "off (%s)" % native.get("reason"))
            rows.append((mode, allocator, "%.2f ms" % (median * 1e3), ratio, note))
    print()
    print("| cudnn.benchmark | allocator | median step | vs PyTorch | note |")
    print("|---|---|---:|---:|---|")
    for mode, allocator, median, ratio, note in rows:
        print("| %s | %s | %s | %s | %s |" % ("on" if mode else "off", allocator, median, ratio,
                                              note))
    any_cell = next(iter(extra.values()), None)
    if any_cell:
        print("\n%s, torch %s; ResNet-50 batch %d, %d steps x %d rounds, median after %d "
              "warm-up steps per run" % (any_cell["device"], any_cell["torch"], args.batch,
                                         args.steps, args.rounds, args.warmup))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"rows": rows, "errors": {"%s/%s" % k: v for k, v in errors.items()},
                       "times": {"%s/%s" % k: v for k, v in times.items()}}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
