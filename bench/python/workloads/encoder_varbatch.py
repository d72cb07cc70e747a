#!/usr/bin/env python3
"""Encoder inference with batch size and sequence length varying per request.

BERT-base (transformers BertModel(BertConfig()), random weights, bf16, eval, no_grad,
no download) serves a seeded stream of requests: batch size in 1..64, sequence length
in 16..512 tokens, right padding with an attention mask; each request's pooled output
(the [CLS] vector) and its mean token embedding are copied to the host, as an
embedding or classification server would return them.

    python3 bench/python/workloads/encoder_varbatch.py [--steps N] [--seed S]

About 20-30 s on an H200 with the defaults. Written to be captured as an allocation
trace (scripts/capture-traces.sh); it touches no allocator API itself.
"""

import argparse
import random
import sys
import time

BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600, help="requests to serve (default 600)")
    p.add_argument("--seed", type=int, default=0, help="seed of sizes, tokens and weights")
    p.add_argument("--max-seconds", type=float, default=30.0,
                   help="stop after the request that passes this many seconds (default 30)")
    p.add_argument("--layers", type=int, default=12, help="encoder layers (default 12: BERT-base)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch
    from transformers import BertConfig, BertModel

    if not torch.cuda.is_available():
        print("encoder_varbatch: needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    config = BertConfig(num_hidden_layers=args.layers)
    model = BertModel(config).to("cuda", dtype=torch.bfloat16).eval()
    tokens = torch.Generator(device="cuda").manual_seed(args.seed)
    start = time.monotonic()
    served = 0
    for i in range(args.steps):
        batch = rng.choice(BATCHES)
        length = rng.randint(16, 512)
        ids = torch.randint(0, config.vocab_size, (batch, length), device="cuda", generator=tokens)
        # Each sequence of the batch has its own length: the rest is padding.
        lengths = torch.tensor([rng.randint(max(1, length // 2), length) for _ in range(batch)],
                               device="cuda")
        mask = (torch.arange(length, device="cuda")[None, :] < lengths[:, None]).long()
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask)
            mean = (out.last_hidden_state * mask[..., None]).sum(1) / lengths[:, None]
        reply = (out.pooler_output.float().cpu(), mean.float().cpu())  # the host waits
        served += 1
        del ids, lengths, mask, out, mean, reply
        if time.monotonic() - start > args.max_seconds:
            print(f"encoder_varbatch: stopping after {served} requests (--max-seconds)")
            break
    torch.cuda.synchronize()
    print(f"encoder_varbatch: {served} requests served by a {args.layers}-layer BERT in "
          f"{time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
