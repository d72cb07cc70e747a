"""Sleep and wake of a Hugging Face causal LM under Reservoir (docs/sleep.md), in a
fresh process; prints one JSON line of figures and checks.

    python3 sleep_worker.py [--config policy:compact] [--layers 12] [--cycles 100]

Weights are made under the tag "weights"; the KV cache, activations and a
CUDA-graph-captured decode step (a forward over a fixed window, replayed per token)
under "kv". Then sleep("weights", offload) and sleep("kv", discard): the process's
device memory (cudaMemGetInfo) must come back to within 64 MiB of what it was before
the model was loaded (such a model's work run once first: warm_up), and another
allocation takes it; after wake, greedy generation
eager (with its KV cache) and by replaying the captured graph (not captured again)
gives the tokens it gave before. Sleep and wake are timed against a pinned copy of
the same bytes; --cycles repeats sleep/wake, checking device and host memory do not
grow. Deterministic: fixed seed, random weights (no download).
"""

import argparse
import json
import os
import sys
import time

MiB = 1 << 20


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def driver_alloc(size):
    """cuMemAlloc and cuMemFree of size bytes in the current context: True on success."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_uint64(0)
    if cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) != 0:
        return False
    return cuda.cuMemFree_v2(ptr) == 0


def pinning_seconds(size):
    """Seconds to pin (cuMemHostAlloc) and to unpin (cuMemFreeHost) size bytes: the host
    side of an offload that a reused pinned buffer does not pay."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_void_p(0)
    t0 = time.perf_counter()
    if cuda.cuMemHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(size), 0) != 0:
        return None, None
    t1 = time.perf_counter()
    cuda.cuMemFreeHost(ptr)
    return t1 - t0, time.perf_counter() - t1


def tag_lines():
    """The memory summary's lines on tags."""
    import reservoir.torch

    return [l.strip("| ").rstrip() for l in reservoir.torch.memory_summary().splitlines()
            if "Tag '" in l or "asleep (" in l]


def start_process():
    """Seeds torch and brings up the context and the libraries (cuBLAS's handle,
    kernels loaded on first use): the process's, not the model's, made before any
    baseline by untagged work; the cache emptied after."""
    import torch

    torch.manual_seed(0)
    torch.cuda.init()
    x = torch.ones(64, 64, device="cuda")
    (torch.nn.functional.layer_norm(x @ x, (64,)).softmax(-1) + x.argmax(-1).float()).sum().item()
    del x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def warm_up(args, heads):
    """Runs the work this kind of model runs (eager generation, a forward on a side
    stream, a captured graph and its replay) once, with a 1-layer model of the same
    width, then frees it all. What the driver then keeps for the process is no
    allocator's to give back (on an H100, 70 MiB appear at the first work on a second
    stream under PyTorch's own allocator too: outside_memory_probe.py): the baseline is
    the process with its libraries up, such work run once, and no model."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=1, n_embd=args.embd, n_head=heads, n_positions=1024,
                     vocab_size=50257)
    model = GPT2LMHeadModel(cfg).cuda().eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.window), device="cuda")
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=2, do_sample=False, use_cache=True,
                       pad_token_id=0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(prompt, use_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(prompt, use_cache=False).logits[:, -1].argmax(-1)
        graph.replay()
    torch.cuda.synchronize()
    del model, prompt, graph
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="policy:compact")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--cycles", type=int, default=100)
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                   help="take the baseline before a 1-layer model loaded the kernels")
    args = p.parse_args()

    import reservoir.torch

    reservoir.torch.install(config=args.config or None)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.backends.cuda.matmul.allow_tf32 = False
    start_process()
    free_strict = torch.cuda.mem_get_info()[0]
    heads = 12 if args.embd % 12 == 0 else 8  # GPT-2's heads must divide the width
    if args.warm_up:
        warm_up(args, heads)
    free_start, total = torch.cuda.mem_get_info()
    reserved_start = reservoir.memory_reserved()
    # Device memory used since the start that the allocator does not hold (the driver's:
    # kernels loaded on first use, graphs instantiated, library handles), per stage.
    outside = {}

    def note_outside(stage):
        torch.cuda.synchronize()
        used = free_start - torch.cuda.mem_get_info()[0]
        outside[stage] = (used - (reservoir.memory_reserved() - reserved_start)) / MiB
    out = {"device": torch.cuda.get_device_name(), "config": args.config,
           "torch": torch.__version__}

    config = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=heads, n_positions=1024,
                        vocab_size=50257)
    with reservoir.tag("weights"):
        model = GPT2LMHeadModel(config).cuda().eval()
    prompt = torch.randint(0, config.vocab_size, (1, args.window), device="cuda")
    note_outside("loaded")

    def eager_tokens():
        with reservoir.tag("kv"), torch.no_grad():
            ids = model.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False,
                                 use_cache=True, pad_token_id=0)
        return ids[0, args.window:].tolist()

    # The decode step, captured: logits of the last position over a window of tokens.
    with reservoir.tag("kv"):
        static_in = prompt.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):
                model(static_in, use_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        note_outside("warmed")
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_next = model(static_in, use_cache=False).logits[:, -1].argmax(-1)

    note_outside("captured")

    def graph_tokens():
        window = prompt.clone()
        tokens = []
        for _ in range(args.new_tokens):
            static_in.copy_(window)
            graph.replay()
            t = static_next.clone()
            tokens.append(int(t.item()))
            window = torch.cat([window[:, 1:], t.view(1, 1)], dim=1)
        return tokens

    eager_before = eager_tokens()
    note_outside("eager")
    graph_before = graph_tokens()
    note_outside("replayed")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    loaded_free = torch.cuda.mem_get_info()[0]
    states = {t: reservoir.tag_state(t) for t in ("weights", "kv")}
    out["tags_awake"] = states
    out["summary_awake"] = tag_lines()

    t0 = time.perf_counter()
    reservoir.sleep("weights", "offload")
    t1 = time.perf_counter()
    reservoir.sleep("kv", "discard")
    t2 = time.perf_counter()
    torch.cuda.empty_cache()  # untagged memory the program freed goes back too
    asleep_free = torch.cuda.mem_get_info()[0]
    out["free_mib"] = {"start": free_start / MiB, "loaded": loaded_free / MiB,
                       "asleep": asleep_free / MiB}
    out["asleep_vs_start_mib"] = (free_start - asleep_free) / MiB
    out["asleep_vs_start_before_warm_up_mib"] = (free_strict - asleep_free) / MiB
    out["warm_up"] = args.warm_up
    # How much of that the allocator holds (the rest: the driver's, e.g. kernels loaded).
    out["reservoir_reserved_mib"] = {"start": reserved_start / MiB,
                                     "asleep": reservoir.memory_reserved() / MiB}
    note_outside("asleep")
    out["outside_allocator_mib"] = outside
    out["within_64_mib"] = free_start - asleep_free <= 64 * MiB
    out["tags_asleep"] = {t: reservoir.tag_state(t) for t in ("weights", "kv")}

    # Another allocation takes the memory the tags gave back.
    taken = int(asleep_free - 256 * MiB)
    o0 = time.perf_counter()
    other = torch.empty(taken, dtype=torch.uint8, device="cuda")
    other.fill_(1)
    torch.cuda.synchronize()
    out["other_allocation_mib"] = taken / MiB
    del other
    torch.cuda.empty_cache()
    # And a co-tenant outside the allocator: the driver's own cuMemAlloc of the same size.
    o1 = time.perf_counter()
    out["driver_allocation_ok"] = driver_alloc(taken)
    out["co_tenant_s"] = {"torch_empty": o1 - o0, "driver": time.perf_counter() - o1}
    out["summary_asleep"] = tag_lines()
    torch.cuda.synchronize()

    t3 = time.perf_counter()
    reservoir.wake("weights")
    t4 = time.perf_counter()
    reservoir.wake("kv")
    t5 = time.perf_counter()
    eager_after, graph_after = eager_tokens(), graph_tokens()
    out["eager_equal"] = eager_after == eager_before
    out["graph_equal"] = graph_after == graph_before
    out["graph_matches_eager"] = graph_before[:4] == eager_before[:4]
    out["tokens"] = {"eager": eager_before[:8], "graph": graph_before[:8]}

    wbytes = states["weights"]["reserved_bytes"]
    kbytes = states["kv"]["reserved_bytes"]
    # A plain pinned copy of the same bytes, both ways, in the same run.
    dev = torch.empty(wbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(wbytes, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize()
    c0 = time.perf_counter()
    host.copy_(dev)
    torch.cuda.synchronize()
    c1 = time.perf_counter()
    dev.copy_(host)
    torch.cuda.synchronize()
    c2 = time.perf_counter()
    del dev, host
    torch.cuda.empty_cache()
    pin_s, unpin_s = pinning_seconds(wbytes)
    gbs = lambda b, s: b / s / 1e9
    out["timing"] = {
        "weights_bytes": wbytes, "kv_bytes": kbytes,
        "sleep_weights_offload_s": t1 - t0, "sleep_kv_discard_s": t2 - t1,
        "wake_weights_s": t4 - t3, "wake_kv_s": t5 - t4,
        "offload_gbs": gbs(wbytes, t1 - t0), "restore_gbs": gbs(wbytes, t4 - t3),
        "pinned_d2h_gbs": gbs(wbytes, c1 - c0), "pinned_h2d_gbs": gbs(wbytes, c2 - c1),
        "pin_host_s": pin_s, "unpin_host_s": unpin_s}

    # A wake whose copies back go on the current stream: the host returns once the
    # pages are mapped; the stream's work sees the contents.
    reservoir.sleep("weights", "offload")
    stream = torch.cuda.current_stream()
    a0 = time.perf_counter()
    reservoir.wake("weights", stream=stream)
    a1 = time.perf_counter()
    stream.synchronize()
    a2 = time.perf_counter()
    out["timing"].update({"wake_weights_on_stream_return_s": a1 - a0,
                          "wake_weights_on_stream_done_s": a2 - a0,
                          "restore_on_stream_gbs": gbs(wbytes, a2 - a0)})
    out["on_stream_equal"] = graph_tokens() == graph_before

    # Cycles: device and host memory must not grow.
    # After the first sleep, offloads reuse the pinned host memory that wakes keep.
    samples = []
    sleep_s, wake_s = [], []
    for i in range(args.cycles):
        c0 = time.perf_counter()
        reservoir.sleep("weights", "offload")
        sleep_s.append(time.perf_counter() - c0)
        reservoir.sleep("kv", "discard")
        if i in (0, args.cycles - 1):
            torch.cuda.synchronize()
            samples.append((torch.cuda.mem_get_info()[0], rss_bytes()))
        c0 = time.perf_counter()
        reservoir.wake("weights")
        wake_s.append(time.perf_counter() - c0)
        reservoir.wake("kv")
        if i % 25 == 0 or i == args.cycles - 1:
            graph_tokens()
    if sleep_s:
        med = lambda xs: sorted(xs)[len(xs) // 2]
        out["timing"].update({"cycle_sleep_weights_median_s": med(sleep_s),
                              "cycle_wake_weights_median_s": med(wake_s),
                              "cycle_offload_gbs": gbs(wbytes, med(sleep_s)),
                              "cycle_restore_gbs": gbs(wbytes, med(wake_s)),
                              "host_kept_mib": reservoir.memory_stats().get("host_kept_bytes", 0)
                              / MiB})
    if samples:
        out["cycles"] = {"n": args.cycles,
                         "device_free_drift_mib": (samples[0][0] - samples[-1][0]) / MiB,
                         "host_rss_growth_mib": (samples[-1][1] - samples[0][1]) / MiB}
    out["after_cycles_equal"] = graph_tokens() == graph_before and eager_tokens() == eager_before
    stats = reservoir.memory_stats()
    out["peak_reserved_bytes"] = stats.get("reserved_bytes.all.peak")
    out["peak_requested_bytes"] = stats.get("requested_bytes.all.peak")
    out["ok"] = bool(out["within_64_mib"] and out["driver_allocation_ok"] and out["eager_equal"]
                     and out["on_stream_equal"] and out["graph_equal"]
                     and out["after_cycles_equal"]
                     and (not samples or (abs(out["cycles"]["device_free_drift_mib"]) <= 16
                                          and out["cycles"]["host_rss_growth_mib"] <= 64)))
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
