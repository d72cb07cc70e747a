#!/usr/bin/env python3
"""Several threads generating text at once, each on its own CUDA stream.

One GPT-2 small model (transformers GPT2LMHeadModel(GPT2Config()), random weights,
bf16, eval, no download) shared by --threads host threads (default 4), as a server
with one worker per request slot: each thread takes seeded requests (batch 1..16,
prompt 16..384 tokens, 16..96 new tokens, greedy generate() with a KV cache) and runs
them on its own stream; its tokens are copied to the host on that stream.

    python3 bench/python/workloads/threads_textgen.py [--threads N] [--steps N] [--seed S]

About 30 s on an H200 with the defaults. Written to be captured as an allocation
trace (scripts/capture-traces.sh); it touches no allocator API itself.
"""

import argparse
import random
import sys
import threading
import time

BATCHES = (1, 2, 4, 6, 8, 12, 16)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=4, help="generating threads (default 4)")
    p.add_argument("--steps", type=int, default=12, help="requests per thread (default 12)")
    p.add_argument("--seed", type=int, default=0, help="seed of sizes, prompts and weights")
    p.add_argument("--max-seconds", type=float, default=30.0,
                   help="each thread stops after the request that passes this (default 30)")
    p.add_argument("--layers", type=int, default=12, help="transformer layers (default 12)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if not torch.cuda.is_available():
        print("threads_textgen: needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    config = GPT2Config(n_layer=args.layers)
    model = GPT2LMHeadModel(config).to("cuda", dtype=torch.bfloat16).eval()
    torch.cuda.synchronize()
    start = time.monotonic()
    served = [0] * args.threads
    errors = []

    def worker(k):
        try:
            rng = random.Random(args.seed * 1000 + k)
            stream = torch.cuda.Stream()
            prompts = torch.Generator(device="cuda").manual_seed(args.seed * 1000 + k)
            with torch.cuda.stream(stream), torch.no_grad():
                for _ in range(args.steps):
                    batch = rng.choice(BATCHES)
                    prompt = rng.randint(16, 384)
                    new = rng.randint(16, 96)
                    ids = torch.randint(0, config.vocab_size, (batch, prompt), device="cuda",
                                        generator=prompts)
                    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                         max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                         use_cache=True, pad_token_id=config.eos_token_id)
                    reply = out[:, prompt:].cpu()  # waits for this stream's work
                    served[k] += 1
                    del ids, out, reply
                    if time.monotonic() - start > args.max_seconds:
                        break
        except Exception as e:  # reported by the main thread
            errors.append(f"thread {k}: {e!r}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    for e in errors:
        print(f"threads_textgen: {e}", file=sys.stderr)
    print(f"threads_textgen: {sum(served)} requests on {args.threads} threads ({served}) in "
          f"{time.monotonic() - start:.1f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
