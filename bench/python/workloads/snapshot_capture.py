#!/usr/bin/env python3
"""Capture a workload's allocation trace with PyTorch's own memory history, for when
Reservoir's recorder (python3 -m reservoir.capture) is not available.

    python3 bench/python/workloads/snapshot_capture.py --out run.trace.gz SCRIPT [ARGS...]

Runs SCRIPT as __main__ on PyTorch's native allocator with
torch.cuda.memory._record_memory_history(max_entries=...) on (no stack frames: cheap),
dumps the snapshot and converts it with tools/convert_snapshot.py. Such traces have
only a and f lines: PyTorch's history logs neither record_stream nor host waits. The
exit code is the script's (or the converter's, if the script succeeded).
"""

import argparse
import os
import runpy
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONVERTER = os.path.join(REPO, "tools", "convert_snapshot.py")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="trace to write (.gz = compressed)")
    p.add_argument("--max-entries", type=int, default=8_000_000,
                   help="history entries kept (default 8,000,000; older ones are lost)")
    p.add_argument("script", help="the workload, run as __main__")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = p.parse_args(argv)

    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=args.max_entries)
    sys.argv = [args.script] + args.args
    code = 0
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    snapshot = args.out + ".snapshot.pickle"
    torch.cuda.memory._dump_snapshot(snapshot)
    torch.cuda.memory._record_memory_history(enabled=None)
    converted = subprocess.run([sys.executable, CONVERTER, snapshot, args.out]).returncode
    os.remove(snapshot)
    return code or converted


if __name__ == "__main__":
    sys.exit(main())
