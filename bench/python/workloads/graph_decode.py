#!/usr/bin/env python3
"""A decode loop of a small LLM in CUDA graphs, one graph per batch size, as inference
engines capture theirs.

A GPT-style decoder (token and position embeddings, --layers blocks of attention over
a preallocated KV cache and an MLP, bf16, random weights) is warmed up, then one decode
step is captured per batch size of the ladder (largest first, every graph in one shared
pool: torch.cuda.graph_pool_handle(), as vLLM does). The loop then serves seeded
requests: each picks a batch size, prefills nothing (the cache holds random context)
and replays its graph for --tokens steps, copying the tokens to the host.

    python3 bench/python/workloads/graph_decode.py [--ladder 1,2,4,8,16,32] [--figures PATH]

--figures writes what the live run measured: the reserved bytes before the captures
and after each one (torch.cuda.graph empties the cache first), what the graph pool
reserves after each (the graphs' memory as the ladder grows), the peak reserved, and
the pool's reserved bytes at the end. Written to be captured as an allocation
trace (python3 -m reservoir.capture); it touches no allocator API itself.
"""

import argparse
import random
import sys

import _graph_figures


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ladder", default="1,2,4,8,16,32", help="batch sizes to capture")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--context", type=int, default=1024, help="KV cache positions")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=24, help="requests to serve (default 24)")
    p.add_argument("--tokens", type=int, default=16, help="decode steps per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--figures", default=None, help="write the live run's figures here (JSON)")
    return p.parse_args(argv)


def build(torch, args, max_batch):
    nn = torch.nn
    d, h, ctx = args.width, args.heads, args.context
    hd = d // h

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            # The KV cache: preallocated for the largest batch, as engines size theirs.
            self.register_buffer("k", torch.randn(max_batch, h, ctx, hd) * 0.1)
            self.register_buffer("v", torch.randn(max_batch, h, ctx, hd) * 0.1)

        def forward(self, x, pos, mask):
            b = x.shape[0]
            q, k, v = self.qkv(self.ln1(x)).view(b, 1, 3, h, hd).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # b, h, 1, hd
            self.k[:b].index_copy_(2, pos, k)
            self.v[:b].index_copy_(2, pos, v)
            a = torch.nn.functional.scaled_dot_product_attention(
                q, self.k[:b], self.v[:b], attn_mask=mask)
            x = x + self.out(a.transpose(1, 2).reshape(b, 1, d))
            return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(args.vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, args.vocab, bias=False)

        def forward(self, ids, pos):
            # Positions written so far, broadcast over batch, heads and the query.
            mask = (torch.arange(ctx, device=ids.device) <= pos).view(1, 1, 1, ctx)
            x = self.tok(ids) + self.pos(pos)
            for blk in self.blocks:
                x = blk(x, pos, mask)
            return self.head(self.ln(x)).argmax(-1)

    return Decoder().to("cuda", dtype=torch.bfloat16).eval()


def main(argv=None):
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("graph_decode: needs a CUDA device", file=sys.stderr)
        return 2
    ladder = sorted({int(b) for b in args.ladder.split(",")}, reverse=True)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = build(torch, args, ladder[0])
    pool = torch.cuda.graph_pool_handle()
    ids = {b: torch.zeros(b, 1, dtype=torch.long, device="cuda") for b in ladder}
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    graphs, outs = {}, {}
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for b in ladder:
                for _ in range(2):
                    model(ids[b], pos)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        after, pooled = {}, {}
        for b in ladder:
            graphs[b] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[b], pool=pool):
                outs[b] = model(ids[b], pos)
            torch.cuda.synchronize()
            after[str(b)] = torch.cuda.memory_reserved() - before
            pooled[str(b)] = _graph_figures.pools_reserved(torch)
        served = 0
        for _ in range(args.steps):
            b = rng.choice(ladder)
            start = rng.randint(0, args.context - args.tokens - 1)
            ids[b].copy_(torch.randint(0, args.vocab, (b, 1), device="cuda"))
            tokens = []
            for t in range(args.tokens):
                pos.fill_(start + t)
                graphs[b].replay()
                ids[b].copy_(outs[b])
                tokens.append(outs[b].clone())
            served += torch.cat(tokens, 1).cpu().numel()  # the host waits for the request
    torch.cuda.synchronize()
    figures = {"workload": "graph_decode", "ladder": ladder, "reserved_before_graphs": before,
               "graph_memory_after_capture": after, "graph_pool_after_capture": pooled,
               "tokens": served}
    _graph_figures.report(torch, figures, args.figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
