#!/usr/bin/env python3
"""Image-model inference with a varying batch size and resolution.

torchvision's ResNet-50 (random weights, no download) in eval mode under torch.no_grad
and bf16 autocast answers a seeded stream of requests: batch size in 1..128, square
images of 160..288 pixels, uint8 inputs normalized on the GPU, top-5 classes copied to
the host. The last few answers stay on the device a while (a server's response queue).

    python3 bench/python/workloads/infer_varbatch.py [--steps N] [--seed S] [--model M]

About 20-40 s on an H200 with the defaults. cudnn.benchmark stays off (a pluggable
allocator cannot serve its cache queries). Written to be captured as an allocation
trace (scripts/capture-traces.sh); it touches no allocator API itself.
"""

import argparse
import collections
import random
import sys
import time

BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
RESOLUTIONS = (160, 192, 224, 256, 288)
KEEP = 4  # answers held on the device


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="requests to serve (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="seed of sizes, inputs and weights")
    p.add_argument("--model", default="resnet50", choices=("resnet50", "resnet18", "vit_b_16"),
                   help="torchvision model (default resnet50; vit_b_16 runs at 224 only)")
    p.add_argument("--max-seconds", type=float, default=40.0,
                   help="stop after the request that passes this many seconds (default 40)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torchvision

    if not torch.cuda.is_available():
        print("infer_varbatch: needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = getattr(torchvision.models, args.model)(weights=None).to("cuda").eval()
    model = model.to(memory_format=torch.channels_last)
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    pixels = torch.Generator(device="cuda").manual_seed(args.seed)
    answers = collections.deque()
    start = time.monotonic()
    images = served = 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(args.steps):
            batch = rng.choice(BATCHES)
            side = 224 if args.model == "vit_b_16" else rng.choice(RESOLUTIONS)
            raw = torch.randint(0, 256, (batch, 3, side, side), dtype=torch.uint8, device="cuda",
                                generator=pixels)
            x = ((raw.float() - mean) / std).contiguous(memory_format=torch.channels_last)
            logits = model(x)
            top = logits.float().softmax(dim=-1).topk(5, dim=-1)
            answers.append(top)
            if len(answers) > KEEP:
                old = answers.popleft()
                _ = old.indices.cpu()  # the oldest answer goes to the host
            images += batch
            served += 1
            if i % 100 == 0:
                print(f"request {i}: batch {batch} at {side}x{side}", flush=True)
            del raw, x, logits, top
            if time.monotonic() - start > args.max_seconds:
                print(f"infer_varbatch: stopping after {served} requests (--max-seconds)")
                break
        while answers:
            _ = answers.popleft().indices.cpu()
    torch.cuda.synchronize()
    print(f"infer_varbatch: {served} requests, {images} images through {args.model} "
          f"(bf16 autocast, batch {min(BATCHES)}-{max(BATCHES)}) in "
          f"{time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
