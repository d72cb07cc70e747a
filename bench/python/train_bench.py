#!/usr/bin/env python3
"""Training on PyTorch's caching allocator versus Reservoir, side by side.

Runs GPT-2 small (transformers GPT2LMHeadModel(GPT2Config()), random init, batch 4,
sequence length drawn per step in [128, 512] from a seeded RNG, AdamW, bf16
autocast) and torchvision's resnet50() (batch 16, 224x224, SGD with momentum),
each once on PyTorch's allocator and once on Reservoir, every run in a fresh
subprocess (Reservoir must be installed before CUDA is initialized), and prints
the median step time after warm-up and the peak reserved memory:

    python3 bench/python/train_bench.py                  # both models
    python3 bench/python/train_bench.py --models gpt2 --json results.json

PyTorch's peak reserved is torch.cuda.max_memory_reserved(); Reservoir's is
reservoir.memory_stats()["reserved_bytes.all.peak"]. Both runs use the same seed
and data, so their losses are comparable.

The same file is the worker the GPU tests (tests/python/gpu) run:
    train_bench.py --worker --model gpt2 --allocator reservoir --out result.json
"""

import argparse
import gc
import importlib.util
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20

DEFAULT_STEPS = {"gpt2": 20, "resnet50": 10, "multistream": 20}
DEFAULT_WARMUP = {"gpt2": 5, "resnet50": 3, "multistream": 5}
ALLOCATORS = ("pytorch", "reservoir")
# Sizes probed at the end of a run: odd sizes, both pools, one oversize-ish block.
PROBE_SIZES = (1, 511, 512, 4097, MiB - 1, MiB + 1, 3 * MiB + 5, 50 * MiB + 3)


# ---------------------------------------------------------------------------
# Worker: one training run in this process.
# ---------------------------------------------------------------------------


def _stats_function(torch, allocator):
    if allocator == "reservoir":
        import reservoir.torch as rt

        return rt.memory_stats
    return torch.cuda.memory_stats


def _gpt2(torch, args, device):
    from transformers import GPT2Config, GPT2LMHeadModel

    kwargs = {} if args.attn == "default" else {"attn_implementation": args.attn}
    config = GPT2Config(**kwargs)
    model = GPT2LMHeadModel(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = random.Random(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    def step():
        length = lengths.randint(128, 512)
        ids = torch.randint(0, config.vocab_size, (args.batch or 4, length), generator=generator)
        ids = ids.to(device, non_blocking=False)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    info = {"attn_implementation": getattr(model.config, "_attn_implementation", None)}
    return model, optimizer, step, info


def _global_mean_pool(torch):
    """AdaptiveAvgPool2d((1, 1)) as a mean over H and W: the same result, but its
    CUDA backward is deterministic (adaptive_avg_pool2d's is not, and raises under
    torch.use_deterministic_algorithms(True))."""

    class GlobalMeanPool(torch.nn.Module):
        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True)

    return GlobalMeanPool()


def _resnet50(torch, args, device):
    import torchvision

    model = torchvision.models.resnet50()
    if args.deterministic:
        model.avgpool = _global_mean_pool(torch)
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(args.seed)
    batch = args.batch or 16

    def step():
        images = torch.randn(batch, 3, 224, 224, generator=generator).to(device)
        labels = torch.randint(0, 1000, (batch,), generator=generator).to(device)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return model, optimizer, step, {"avgpool": type(model.avgpool).__name__}


def _multistream(torch, args, device):
    """ResNet-18 with DDP-style overlap on three streams: the next batch copied on a copy
    stream (pinned memory, record_stream), gradients bucketed and "reduced" (scaled and
    written back) on a communication stream; the batch size varies per step."""
    import torchvision

    model = torchvision.models.resnet18()
    if args.deterministic:
        model.avgpool = _global_mean_pool(torch)
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(args.seed)
    sizes = random.Random(args.seed)
    copy, comm = torch.cuda.Stream(), torch.cuda.Stream()

    def load():
        batch = sizes.choice((16, 24, 32, 48)) if not args.batch else args.batch
        images = torch.randn(batch, 3, 160, 160, generator=generator).pin_memory()
        labels = torch.randint(0, 1000, (batch,), generator=generator).pin_memory()
        with torch.cuda.stream(copy):
            return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)

    prefetched = [load()]

    def step():
        main = torch.cuda.current_stream()
        images, labels = prefetched.pop()
        main.wait_stream(copy)
        images.record_stream(main)
        labels.record_stream(main)
        prefetched.append(load())
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        comm.wait_stream(main)
        with torch.cuda.stream(comm):
            grads = [p.grad for p in model.parameters()]
            for bucket in range(0, len(grads), 16):
                part = grads[bucket:bucket + 16]
                flat = torch.cat([g.reshape(-1) for g in part]) * 0.5
                offset = 0
                for g in part:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    g.record_stream(comm)
                    offset += g.numel()
        main.wait_stream(comm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return model, optimizer, step, {"streams": 3}


def _live_state_bytes(torch, model, optimizer):
    """Bytes of the distinct CUDA storages of parameters, gradients and optimizer state."""
    storages = {}

    def add(tensor):
        if torch.is_tensor(tensor) and tensor.is_cuda:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()

    for parameter in model.parameters():
        add(parameter)
        add(parameter.grad)
    for state in optimizer.state.values():
        for value in state.values():
            add(value)
    return sum(storages.values())


def setup_worker(args):
    """Builds the model of args in this process (Reservoir installed first when asked);
    returns what the steps and the final report need."""
    if args.deterministic:
        # Read when cuBLAS creates its handle, so before any CUDA work.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.allocator == "reservoir":
        import reservoir.torch as rt

        rt.install(args.config)
    import torch

    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    # cuDNN's benchmark asks the allocator for cacheInfo, which PyTorch's pluggable
    # interface does not forward; reservoir.torch's native part answers it
    # (docs/python.md); bench/python/cudnn_bench.py measures both settings.
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    torch.manual_seed(args.seed)
    device = torch.device("cuda")
    build = {"gpt2": _gpt2, "resnet50": _resnet50, "multistream": _multistream}[args.model]
    model, optimizer, step, info = build(torch, args, device)
    model.train()
    torch.cuda.synchronize()
    return {"torch": torch, "device": device, "model": model, "optimizer": optimizer,
            "step": step, "info": info, "stats": _stats_function(torch, args.allocator),
            "losses": [], "times": [], "gpu_times": []}


def timed_step(ctx):
    """One training step, timed by the host (until the GPU is done) and by the GPU."""
    torch = ctx["torch"]
    # The GPU's own time for the step (current stream), beside the host's: host
    # noise does not reach it, and an allocator's device-side waits do.
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.perf_counter()
    began.record()
    loss = ctx["step"]()
    ended.record()
    value = loss.item()  # waits for the step
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    gpu = began.elapsed_time(ended) / 1e3
    del loss
    ctx["losses"].append(value)
    ctx["times"].append(elapsed)
    ctx["gpu_times"].append(gpu)
    return value, elapsed, gpu


LOCKSTEP = "LOCKSTEP "  # the prefix of the protocol's lines on a lockstep worker's stdout


def run_worker(args):
    ctx = setup_worker(args)
    if args.lockstep:
        # Steps on command (run_lockstep): "step" runs one and answers with its
        # figures, "end" finishes; meanwhile this process waits on its standard input,
        # idle, while the other allocators' workers take their steps.
        print(LOCKSTEP + "ready", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "end":
                break
            if command != "step":
                raise SystemExit("lockstep worker: unknown command %r" % command)
            loss, elapsed, gpu = timed_step(ctx)
            print(LOCKSTEP + json.dumps({"loss": loss, "time": elapsed, "gpu_time": gpu}),
                  flush=True)
    else:
        for _ in range(args.steps):
            timed_step(ctx)
    finish_worker(args, ctx)


def finish_worker(args, ctx):
    """The end of a run: statistics, the probe, the result file."""
    torch, model, optimizer, stats = ctx["torch"], ctx["model"], ctx["optimizer"], ctx["stats"]
    device, info = ctx["device"], ctx["info"]
    losses, times, gpu_times = ctx["losses"], ctx["times"], ctx["gpu_times"]
    torch.cuda.synchronize()
    gc.collect()

    end_stats = stats()
    live_bytes = _live_state_bytes(torch, model, optimizer)

    # Probe: tensors of known sizes must move the counters by exactly their bytes.
    before = stats()
    probe = [torch.empty(n, dtype=torch.uint8, device=device) for n in PROBE_SIZES]
    probe += [p.detach().clone() for p in model.parameters()]
    torch.cuda.synchronize()
    probe_bytes = sum(t.untyped_storage().nbytes() for t in probe)
    during = stats()
    probe_count = len(probe)
    del probe
    torch.cuda.synchronize()
    after = stats()

    def delta(key, a=before, b=during):
        return b[key] - a[key]

    if args.allocator == "reservoir":
        peak_reserved = end_stats["reserved_bytes.all.peak"]
    else:
        peak_reserved = torch.cuda.max_memory_reserved()
    result = {
        "model": args.model,
        "allocator": args.allocator,
        "steps": len(losses),
        "seed": args.seed,
        "deterministic": args.deterministic,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "info": info,
        "losses": losses,
        "step_times": times,
        "gpu_step_times": gpu_times,
        "peak_reserved": peak_reserved,
        "peak_allocated": end_stats["allocated_bytes.all.peak"],
        "peak_requested": end_stats["requested_bytes.all.peak"],
        "end_stats": {
            key: end_stats[key]
            for key in (
                "allocated_bytes.all.current",
                "requested_bytes.all.current",
                "reserved_bytes.all.current",
                "allocation.all.current",
                "segment.all.peak",
                "num_alloc_retries",
                "num_ooms",
                "num_device_alloc",
                "num_device_free",
            )
        },
        # Reservoir's device calls and cross-stream waits (not in PyTorch's stats).
        "device_calls": {
            key: end_stats[key]
            for key in ("num_device_map", "num_device_unmap", "num_stream_waits")
            if key in end_stats
        },
        "checkpoint": {
            "live_state_bytes": live_bytes,
            "probe_bytes": probe_bytes,
            "probe_count": probe_count,
            "requested_delta": delta("requested_bytes.all.current"),
            "allocated_delta": delta("allocated_bytes.all.current"),
            "allocation_delta": delta("allocation.all.current"),
            "requested_after_free_delta": delta("requested_bytes.all.current", before, after),
            "allocation_after_free_delta": delta("allocation.all.current", before, after),
        },
    }
    if args.allocator == "reservoir":
        import reservoir.torch as rt

        result["installed_hooks"] = rt.installed_hooks()
        result["memory_api"] = rt.memory_api_patched()
        result["native"] = rt.native_status()
        import reservoir

        result["summary"] = reservoir.memory_summary(torch.cuda.current_device())
    with open(args.out, "w") as handle:
        json.dump(result, handle)


# ---------------------------------------------------------------------------
# Driver: run the workers and compare.
# ---------------------------------------------------------------------------


def child_environment():
    """The environment for a worker: the reservoir package importable."""
    env = dict(os.environ)
    spec = importlib.util.find_spec("reservoir")
    if spec is not None and spec.origin:
        package_parent = os.path.dirname(os.path.dirname(spec.origin))
    else:
        package_parent = os.path.join(REPO, "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    # The simulated device cannot back CUDA tensors.
    conf = env.get("RESERVOIR_ALLOC_CONF", "")
    if "device:sim" in conf:
        kept = [part for part in conf.split(",") if part.strip() != "device:sim"]
        env["RESERVOIR_ALLOC_CONF"] = ",".join(kept)
    return env


def _worker_command(model, allocator, out, steps, seed, deterministic, attn, config, batch,
                    cudnn_benchmark, lockstep=False):
    command = [
        sys.executable, os.path.abspath(__file__), "--worker",
        "--model", model, "--allocator", allocator,
        "--steps", str(steps or DEFAULT_STEPS[model]),
        "--seed", str(seed), "--attn", attn, "--out", out,
    ]
    if deterministic:
        command.append("--deterministic")
    if cudnn_benchmark:
        command.append("--cudnn-benchmark")
    if config:
        command += ["--config", config]
    if batch:
        command += ["--batch", str(batch)]
    if lockstep:
        command.append("--lockstep")
    return command


def _worker_environment(deterministic, extra_env):
    env = child_environment()
    if deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env.update(extra_env or {})
    return env


def run_training(model, allocator, steps=None, seed=1234, deterministic=False, attn="default",
                 config=None, batch=None, timeout=1200, extra_env=None, cudnn_benchmark=False):
    """Runs one training in a fresh interpreter; returns the worker's result dict.
    Raises RuntimeError with the worker's output when it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        command = _worker_command(model, allocator, out, steps, seed, deterministic, attn, config,
                                  batch, cudnn_benchmark)
        env = _worker_environment(deterministic, extra_env)
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(
                "%s on %s failed (exit %d):\n%s\n%s"
                % (model, allocator, proc.returncode, proc.stdout[-4000:], proc.stderr[-8000:])
            )
        with open(out) as handle:
            return json.load(handle)


class LockstepWorker:
    """One worker process of a lockstep comparison, driven over its standard input."""

    def __init__(self, name, command, env, log_path):
        self.name = name
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.log):
            try:
                if stream:
                    stream.close()
            except BrokenPipeError:
                pass

    def _fail(self, what):
        self.close()
        with open(self.log_path) as handle:
            tail = handle.read()[-8000:]
        raise RuntimeError("lockstep worker %s: %s (exit %s):\n%s"
                           % (self.name, what, self.proc.returncode, tail))

    def reply(self):
        """The next protocol line's text (other output of the worker is skipped)."""
        for line in self.proc.stdout:
            if line.startswith(LOCKSTEP):
                return line[len(LOCKSTEP):].strip()
        self._fail("ended before answering")

    def command(self, text):
        try:
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._fail("gone")

    def finish(self, timeout):
        self.command("end")
        self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._fail("did not finish")
        if code != 0:
            self._fail("failed")
        self.close()


def lockstep_order(names, step):
    """The order in which the workers take step `step`: rotated by one each step, so
    that every allocator comes first, second, ... equally often."""
    k = step % len(names)
    return names[k:] + names[:k]


def run_lockstep(specs, steps, timeout=1200):
    """Runs one training per spec in lockstep: every worker process is started and
    builds its model, then step i is taken by each worker in turn (lockstep_order)
    while the others wait, idle, on their standard input. A slow spell of the host
    or the GPU thus falls on every allocator's same step alike, and the ratio of two
    workers' step i compares the same inputs moments apart.

    specs: [(name, command, env)] where command runs a worker with --lockstep and
    --out PATH. Returns {name: result dict} (the worker's result file, whose step
    times are those it reported)."""
    with tempfile.TemporaryDirectory() as tmp:
        workers = {}
        try:
            for name, command, env in specs:
                workers[name] = LockstepWorker(
                    name, command, env, os.path.join(tmp, "%d.log" % len(workers)))
            for worker in workers.values():  # the models are built concurrently
                if worker.reply() != "ready":
                    worker._fail("no ready line")
            names = [name for name, _, _ in specs]
            for i in range(steps):
                for name in lockstep_order(names, i):
                    workers[name].command("step")
                    json.loads(workers[name].reply())
            results = {}
            for name, command, _ in specs:
                workers[name].finish(timeout)
                with open(command[command.index("--out") + 1]) as handle:
                    results[name] = json.load(handle)
            return results
        finally:
            for worker in workers.values():
                worker.close()


def _mib(value):
    return "%.1f MiB" % (value / MiB)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,resnet50")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default per model)")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the median")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--attn", default="default",
                        help="GPT-2 attention: default (transformers' choice), eager, sdpa")
    parser.add_argument("--config", default=None, help="Reservoir settings (key:value,...)")
    parser.add_argument("--variants", default="pytorch,reservoir",
                        help="allocators to compare, the first the baseline: pytorch, reservoir, "
                             "and ALLOCATOR:SETTINGS (PYTORCH_CUDA_ALLOC_CONF for pytorch, "
                             "Reservoir's config for reservoir), e.g. "
                             "pytorch,pytorch:expandable_segments:True,reservoir:policy:compact")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each variant, interleaved (A B C A B C ...): the median "
                             "is over the steps of all rounds, so that a slow spell of the host "
                             "or the GPU falls on every variant alike")
    parser.add_argument("--lockstep", action="store_true",
                        help="run the variants' workers side by side, taking each step in "
                             "turn (the others idle meanwhile), so that the step-by-step ratio "
                             "compares the same step moments apart; in worker mode: take steps "
                             "on command")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--json", default=None, help="write all results to this file")
    # Worker mode.
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--allocator", choices=ALLOCATORS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cudnn-benchmark", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        if args.steps is None:
            args.steps = DEFAULT_STEPS[args.model]
        run_worker(args)
        return 0

    results = []
    rows = []
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        steps = args.steps or DEFAULT_STEPS[model]
        warmup = args.warmup if args.warmup is not None else DEFAULT_WARMUP[model]
        warmup = min(warmup, steps - 1)
        per_allocator = {}
        def settings(variant):  # allocator, its Reservoir config, its environment
            allocator, _, setting = variant.partition(":")
            extra_env = ({"PYTORCH_CUDA_ALLOC_CONF": setting}
                         if allocator == "pytorch" and setting else None)
            config = (setting or args.config) if allocator == "reservoir" else None
            return allocator, config, extra_env

        def keep(result, variant, round_index):
            result["median_step_s"] = statistics.median(result["step_times"][warmup:])
            result["variant"] = variant
            result["round"] = round_index
            result["lockstep"] = args.lockstep
            results.append(result)
            per_allocator.setdefault(variant, []).append(result)

        for round_index in range(max(1, args.rounds)):
            if args.lockstep:
                print("running %s on %s in lockstep (%d steps, round %d of %d)..."
                      % (model, ", ".join(variants), steps, round_index + 1, args.rounds),
                      flush=True)
                with tempfile.TemporaryDirectory() as tmp:
                    specs = []
                    for k, variant in enumerate(variants):
                        allocator, config, extra_env = settings(variant)
                        out = os.path.join(tmp, "result-%d.json" % k)
                        specs.append((variant, _worker_command(
                            model, allocator, out, steps, args.seed, args.deterministic,
                            args.attn, config, None, False, lockstep=True),
                            _worker_environment(args.deterministic, extra_env)))
                    by_variant = run_lockstep(specs, steps)
                for variant in variants:
                    keep(by_variant[variant], variant, round_index)
                continue
            for variant in variants:
                allocator, config, extra_env = settings(variant)
                print("running %s on %s (%d steps, round %d of %d)..."
                      % (model, variant, steps, round_index + 1, args.rounds), flush=True)
                result = run_training(model, allocator, steps=steps, seed=args.seed,
                                      deterministic=args.deterministic, attn=args.attn,
                                      config=config, extra_env=extra_env)
                keep(result, variant, round_index)
        # Per variant: the first round's result, its median over every round's steps.
        merged = {}
        runs_of = per_allocator
        for variant, runs in per_allocator.items():
            r = dict(runs[0])
            r["median_step_s"] = statistics.median(
                [t for run in runs for t in run["step_times"][warmup:]])
            r["round_medians_s"] = [run["median_step_s"] for run in runs]
            r["peak_reserved"] = max(run["peak_reserved"] for run in runs)
            r["losses_agree"] = all(run["losses"] == runs[0]["losses"] for run in runs)
            merged[variant] = r
        # Step by step against the baseline's same step of the same round: every
        # variant sees the same inputs at step i (sequence length, batch size), so the
        # median of these ratios is free of the spread between steps.
        base_runs = runs_of[variants[0]]

        def paired(runs, key):  # median of step i over the baseline's step i, every round
            ratios = [a / b for run, base_run in zip(runs, base_runs)
                      for a, b in zip(run.get(key, [])[warmup:], base_run.get(key, [])[warmup:])
                      if b > 0]
            return statistics.median(ratios) if ratios else float("nan")

        for variant in variants:
            merged[variant]["paired_ratio"] = paired(runs_of[variant], "step_times")
            merged[variant]["gpu_paired_ratio"] = paired(runs_of[variant], "gpu_step_times")
        per_allocator = merged
        base = per_allocator[variants[0]]
        for variant in variants:
            r = per_allocator[variant]
            rows.append((
                model, variant,
                "%.2f ms" % (r["median_step_s"] * 1e3),
                "%.3fx" % (r["median_step_s"] / base["median_step_s"]),
                "%.3fx" % r["paired_ratio"],
                "n/a" if math.isnan(r["gpu_paired_ratio"]) else "%.3fx" % r["gpu_paired_ratio"],
                _mib(r["peak_reserved"]),
                "%.3fx" % (r["peak_reserved"] / base["peak_reserved"]),
                _mib(r["peak_allocated"]),
                str(r["end_stats"]["num_device_alloc"]),
                "%.4f" % r["losses"][-1] if math.isfinite(r["losses"][-1]) else "nan",
                " / ".join("%.1f" % (m * 1e3) for m in r["round_medians_s"]),
            ))
        same = all(per_allocator[v]["losses"] == base["losses"] and per_allocator[v]["losses_agree"]
                   for v in variants)
        rows.append((model, "losses equal", "yes" if same else "no", "", "", "", "", "", "", "", "", ""))

    header = ("model", "allocator", "median step", "vs torch", "step by step", "GPU step by step",
              "peak reserved",
              "vs torch",
              "peak allocated", "device allocs", "final loss", "round medians (ms)")
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    if results:
        print("\n%s, torch %s; median over steps after warm-up (of %d round(s), interleaved%s); "
              "step by step: median of each step's time over the baseline's same step (same "
              "inputs) in the same round (GPU: the same with the GPU's time of the step, CUDA "
              "events on the current stream); peak reserved: torch.cuda.max_memory_reserved() vs "
              "reservoir reserved_bytes.all.peak"
              % (results[0]["device"], results[0]["torch"], args.rounds,
                 "; lockstep: the variants' processes side by side, each step taken by "
                 "each in turn, the order rotated every step" if args.lockstep else ""))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
