#!/usr/bin/env python3
"""Ground truth from the GPU: every trace under every setting of the matrix through
PyTorch's native allocator (c10), cudaMallocAsync, and Reservoir on the GPU and on the
simulated device, gathered into one JSON file (traces/gpu_truth.json).

    python3 bench/gpu/gpu_truth.py --build build/gpu --out OUT/gpu_truth.json TRACE...
    python3 bench/gpu/gpu_truth.py --build build/release --out x.json --no-gpu TRACE...

Needs, in the build directory, tools/replay/reservoir-replay, bench/gpu/
reservoir_async_replay and bench/gpu/reservoir_c10_replay (configured with -DTORCH_DIR;
scripts/gpu/truth.sh builds all three). Per trace and setting: c10 in a process of its own (PYTORCH_CUDA_ALLOC_CONF is
read once, at c10's start), with the fit search for the settings in FIT_SETTINGS;
cudaMallocAsync once per trace; `reservoir-replay TRACE --device cuda --config S --json`
and the same with --device sim. Fits run last, so a --budget that runs out drops them
first. --no-gpu runs only the simulated-device replays (to try the script without a
GPU). Prints one line per trace and the comparisons that matter; everything measured
is in the JSON.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

SETTINGS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "max_split_size_mb:256,max_non_split_rounding_mb:64",
    "expandable_segments:True,roundup_power2_divisions:2",
]
FIT_SETTINGS = ("", "expandable_segments:True")
SCHEMA = "reservoir gpu truth v1"

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))
import trace_stats  # noqa: E402


def trace_name(path):
    base = os.path.basename(path)
    for tail in (".trace.gz", ".trace", ".gz"):
        if base.endswith(tail):
            return base[: -len(tail)]
    return base


class Runner:
    """Runs commands under a shared time budget and keeps what each step did."""

    def __init__(self, budget, timeout):
        self.deadline = time.monotonic() + budget if budget else None
        self.timeout = timeout
        self.steps = []  # {"what", "seconds", "rc"|"skipped"}

    def left(self):
        return None if self.deadline is None else self.deadline - time.monotonic()

    def json_of(self, what, cmd, env=None, last_line=True):
        """The command's JSON output (its last line, or all of stdout), or None."""
        left = self.left()
        if left is not None and left < 1:
            self.steps.append({"what": what, "skipped": "time budget"})
            return None
        timeout = self.timeout if left is None else max(1.0, min(self.timeout, left))
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            rc, out, err = "timeout", "", f"timed out after {timeout:.0f} s"
        except OSError as e:
            rc, out, err = "error", "", str(e)
        step = {"what": what, "seconds": round(time.monotonic() - t0, 2), "rc": rc}
        result = None
        text = out.strip().splitlines()[-1] if last_line and out.strip() else out
        try:
            result = json.loads(text) if text.strip() else None
        except ValueError:
            result = None
        if result is None:
            err = err.strip()
            step["stderr"] = err if len(err) < 1200 else err[:400] + " ... " + err[-700:]
        self.steps.append(step)
        return result


def c10_env(setting):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if setting:
        env["PYTORCH_CUDA_ALLOC_CONF"] = setting
    return env


C10_KEYS = ("ok", "peak_reserved", "peak_requested", "peak_allocated", "num_device_alloc",
            "num_device_free", "num_alloc_retries", "ns_per_event")
FIT_KEYS = ("fit_bytes", "fit_ratio", "fit_fraction", "fit_probes", "fit_seconds")
RESERVOIR_KEYS = ("peak_reserved", "peak_requested", "peak_allocated", "device_allocs",
                  "device_frees", "ooms", "ns_per_event")


def pick(d, keys):
    return None if d is None else {k: d.get(k) for k in keys}


def reservoir_runs(runner, replay, trace, settings, device):
    """{setting: figures} from one reservoir-replay process with every --config (one
    CUDA start-up), or one process per setting if that fails (one bad setting)."""
    def run(subset, label):
        cmd = [replay, trace, "--device", device, "--json"]
        for s in subset:
            cmd += ["--config", s]
        out = runner.json_of(f"reservoir {device} {trace_name(trace)} [{label}]", cmd,
                             last_line=False)
        if not isinstance(out, list) or len(out) != len(subset):
            return None
        return {s: pick(r, RESERVOIR_KEYS) for s, r in zip(subset, out)}

    together = run(settings, "all settings")
    if together is not None:
        return together
    return {s: (run([s], s) or {}).get(s) for s in settings}


def measure(args):
    replay = os.path.join(args.build, "tools", "replay", "reservoir-replay")
    c10 = os.path.join(args.build, "bench", "gpu", "reservoir_c10_replay")
    async_replay = os.path.join(args.build, "bench", "gpu", "reservoir_async_replay")
    runner = Runner(args.budget, args.timeout)
    traces = {}
    for path in args.traces:
        t0 = time.monotonic()
        name = trace_name(path)
        entry = {"file": os.path.basename(path)}
        try:
            entry.update({k: v for k, v in trace_stats.trace_stats(path).items() if k != "trace"})
        except trace_stats.TraceStatsError as e:
            entry["error"] = str(e)
            traces[name] = entry
            print(f"{name}: unreadable: {e}", flush=True)
            continue
        entry["settings"] = {s: {} for s in args.settings}
        if not args.no_gpu:
            for s in args.settings:
                r = runner.json_of(f"c10 {name} [{s}]", [c10, path], env=c10_env(s))
                entry["settings"][s]["c10"] = pick(r, C10_KEYS)
        for device, key in (("cuda", "reservoir_gpu"), ("sim", "reservoir_sim")):
            if device == "cuda" and args.no_gpu:
                continue
            for s, figures in reservoir_runs(runner, replay, path, args.settings, device).items():
                entry["settings"][s][key] = figures
        if not args.no_gpu:
            r = runner.json_of(f"async {name}", [async_replay, path, "--api", "async"])
            entry["async"] = pick(r, ("ok", "peak_reserved", "peak_requested", "ns_per_event"))
        traces[name] = entry
        print(f"{name}: {entry['events']:,} events, {entry['streams']} streams: "
              f"{time.monotonic() - t0:.1f} s", flush=True)
    if not args.no_gpu:  # fits last: the budget drops them first
        for path in args.traces:
            name = trace_name(path)
            if "settings" not in traces.get(name, {}):
                continue
            t0 = time.monotonic()
            for s in FIT_SETTINGS:
                if s not in args.settings:
                    continue
                r = runner.json_of(f"c10 fit {name} [{s}]", [c10, path, "--fit"], env=c10_env(s))
                fit = pick(r, FIT_KEYS)
                if fit is not None:
                    traces[name]["settings"][s]["c10_fit"] = fit
            print(f"{name}: c10 fits {time.monotonic() - t0:.1f} s", flush=True)
    return traces, runner.steps


def environment(no_gpu):
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if no_gpu:
        env["device"] = "none (--no-gpu: simulated device only)"
        return env

    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    smi = out(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
               "--format=csv,noheader"]).splitlines()
    if smi:
        parts = [p.strip() for p in smi[0].split(",")]
        env.update(zip(("device", "driver", "memory_total_nvidia_smi"), parts))
    torch = out([sys.executable, "-c", "import torch;print(torch.__version__);"
                 "print(torch.version.cuda)"]).splitlines()
    if len(torch) == 2:
        env["torch"], env["torch_cuda"] = torch
    return env


def compare(traces):
    """One line per trace: how often c10 and Reservoir (GPU, simulated) reserve the same
    peak, the simulated device's largest difference from c10, c10's fit ratios."""
    lines = []
    for name, t in traces.items():
        cells = t.get("settings", {})
        gpu_same = sim_same = measured = 0
        worst = (0.0, "")
        for s, cell in cells.items():
            c10, gpu, sim = cell.get("c10"), cell.get("reservoir_gpu"), cell.get("reservoir_sim")
            if not c10 or not c10.get("peak_reserved"):
                continue
            measured += 1
            gpu_same += bool(gpu) and gpu["peak_reserved"] == c10["peak_reserved"]
            if sim:
                sim_same += sim["peak_reserved"] == c10["peak_reserved"]
                d = (sim["peak_reserved"] - c10["peak_reserved"]) / c10["peak_reserved"]
                if abs(d) > abs(worst[0]):
                    worst = (d, s or "default")
        fits = []
        for s in FIT_SETTINGS:
            f = cells.get(s, {}).get("c10_fit")
            if f and f.get("fit_ratio") is not None:
                fits.append(f"{s or 'default'} {f['fit_ratio']:.4f}")
        line = f"{name}: peak reserved equal to c10: GPU {gpu_same}/{measured}, sim {sim_same}/{measured}"
        if worst[1]:
            line += f"; sim off by up to {worst[0] * 100:+.2f}% ({worst[1]})"
        if fits:
            line += "; c10 fit ratio " + ", ".join(fits)
        lines.append(line)
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", help="trace files (*.trace.gz)")
    p.add_argument("--build", required=True, help="build directory (configured with TORCH_DIR)")
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--settings", nargs="*", default=SETTINGS,
                   help="settings to measure (default: the whole matrix)")
    p.add_argument("--no-gpu", action="store_true", help="only Reservoir on the simulated device")
    p.add_argument("--budget", type=float, default=0,
                   help="seconds for all runs; what does not fit is skipped (0 = no limit)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    doc = {"schema": SCHEMA, "settings": args.settings, "fit_settings": list(FIT_SETTINGS)}
    doc.update(environment(args.no_gpu))
    doc["traces"], doc["steps"] = measure(args)
    failed = [s for s in doc["steps"] if s.get("rc") not in (0, None) or "skipped" in s]
    doc["failed_steps"] = len(failed)
    doc["seconds"] = round(time.monotonic() - t0, 1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    for line in compare(doc["traces"]):
        print(line)
    for s in failed[:10]:
        print(f"  step {s['what']}: {s.get('skipped') or 'rc ' + str(s.get('rc'))} "
              f"{s.get('stderr', '')[:200]}")
    print(f"gpu_truth: {args.out}: {len(doc['traces'])} traces, {len(doc['steps'])} runs, "
          f"{len(failed)} failed or skipped, {doc['seconds']:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
