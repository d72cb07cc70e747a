#!/usr/bin/env python3
"""Pipelined inference over several streams, with tensors crossing streams.

A copy stream moves each batch (uint8 images from a pinned host buffer) to the device;
worker streams (3 by default, round robin) wait for it, mark the input as used there
(tensor.record_stream), normalize it and run torchvision's ResNet-18 (random weights,
bf16 autocast, no_grad); the copy stream then waits for the worker and brings the top-5
answer back to pinned host memory, the answer tensors marked as used on the copy
stream. The host waits the ways a server does: event.synchronize() on the oldest
answer when too many are in flight, a worker's stream.synchronize() now and then, and
torch.cuda.synchronize() every 100 batches. Batch sizes vary (1..128, seeded).

    python3 bench/python/workloads/pipeline_multistream.py [--steps N] [--workers K]

About 20-40 s on an H200 with the defaults. Written to be captured as an allocation
trace (scripts/capture-traces.sh): uses and host waits become its u and s lines.
"""

import argparse
import collections
import random
import sys
import time

BATCHES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)
SIDE = 224
IN_FLIGHT = 6       # answers on their way before the host waits for the oldest
STREAM_SYNC_EVERY = 25
DEVICE_SYNC_EVERY = 100


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4000, help="batches (default 4000)")
    p.add_argument("--workers", type=int, default=3, help="worker streams (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of sizes, inputs and weights")
    p.add_argument("--max-seconds", type=float, default=40.0,
                   help="stop after the batch that passes this many seconds (default 40)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torchvision

    if not torch.cuda.is_available():
        print("pipeline_multistream: needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = torchvision.models.resnet18(weights=None).to("cuda").eval()
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    biggest = max(BATCHES)
    # Pinned host memory, made once: the images to send and a ring of answer slots.
    images = torch.randint(0, 256, (biggest, 3, SIDE, SIDE), dtype=torch.uint8).pin_memory()
    ring = [torch.empty((biggest, 5), dtype=torch.int64).pin_memory()
            for _ in range(IN_FLIGHT + 2)]
    copy = torch.cuda.Stream()
    workers = [torch.cuda.Stream() for _ in range(args.workers)]
    torch.cuda.synchronize()

    in_flight = collections.deque()  # events of answers not yet on the host
    waits = collections.Counter()
    start = time.monotonic()
    served = sent = 0
    with torch.no_grad():
        for i in range(args.steps):
            batch = rng.choice(BATCHES)
            worker = workers[i % len(workers)]
            with torch.cuda.stream(copy):
                raw = images[:batch].to("cuda", non_blocking=True)  # allocated on the copy stream
                arrived = torch.cuda.Event()
                arrived.record(copy)
            with torch.cuda.stream(worker):
                worker.wait_event(arrived)
                raw.record_stream(worker)
                x = (raw.float() - mean) / std
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(x)
                top = logits.float().softmax(dim=-1).topk(5, dim=-1).indices
                answered = torch.cuda.Event()
                answered.record(worker)
            with torch.cuda.stream(copy):
                copy.wait_event(answered)
                top.record_stream(copy)
                ring[i % len(ring)][:batch].copy_(top, non_blocking=True)
                home = torch.cuda.Event()
                home.record(copy)
            in_flight.append(home)
            del raw, x, logits, top  # freed by the worker; reused once the streams are done
            sent += batch
            served += 1
            if len(in_flight) > IN_FLIGHT:
                in_flight.popleft().synchronize()
                waits["event"] += 1
            if i % STREAM_SYNC_EVERY == STREAM_SYNC_EVERY - 1:
                workers[(i // STREAM_SYNC_EVERY) % len(workers)].synchronize()
                waits["stream"] += 1
            if i % DEVICE_SYNC_EVERY == DEVICE_SYNC_EVERY - 1:
                torch.cuda.synchronize()
                in_flight.clear()
                waits["device"] += 1
            if i % 500 == 0:
                print(f"batch {i}: {batch} images on worker {i % len(workers)}", flush=True)
            if time.monotonic() - start > args.max_seconds:
                print(f"pipeline_multistream: stopping after {served} batches (--max-seconds)")
                break
    torch.cuda.synchronize()
    print(f"pipeline_multistream: {served} batches, {sent} images, 1 copy stream + "
          f"{len(workers)} worker streams (ResNet-18, bf16); host waits: {waits['event']} "
          f"event, {waits['stream']} stream, {waits['device']} device; "
          f"{time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
