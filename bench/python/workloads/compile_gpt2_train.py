#!/usr/bin/env python3
"""GPT-2 training under torch.compile(mode="reduce-overhead"), then inference calls.

A small GPT-2 (transformers GPT2LMHeadModel, random weights, fp32, no download) trains
for --steps steps on seeded random tokens with AdamW; cudagraph trees record and replay
its forward and backward graphs in one private pool (their checkpoints and restores
included). Then --infer inference calls under no_grad record a second path in the same
tree. Each step's loss is copied to the host.

    python3 bench/python/workloads/compile_gpt2_train.py [--steps N] [--figures PATH]

--figures writes what the live run measured: the peak reserved bytes, and each private
pool's reserved bytes at the end (from the memory snapshot), to compare with a replay of
its trace. Written to be captured as an allocation trace (python3 -m reservoir.capture);
it touches no allocator API itself.
"""

import argparse
import sys

import _graph_figures


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=24, help="training steps (default 24)")
    p.add_argument("--infer", type=int, default=4, help="inference calls after (default 4)")
    p.add_argument("--layers", type=int, default=4, help="transformer layers (default 4)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--figures", default=None, help="write the live run's figures here (JSON)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if not torch.cuda.is_available():
        print("compile_gpt2_train: needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    config = GPT2Config(n_layer=args.layers, n_positions=args.seq, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step_loss(ids):
        return model(input_ids=ids, labels=ids).loss

    compiled = torch.compile(step_loss, mode="reduce-overhead")
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    losses = []
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda",
                            generator=g)
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled(ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        for _ in range(args.infer):
            ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda",
                                generator=g)
            torch.compiler.cudagraph_mark_step_begin()
            losses.append(compiled(ids).item())
    torch.cuda.synchronize()
    figures = {"workload": "compile_gpt2_train", "steps": args.steps, "infer": args.infer,
               "losses": losses}
    _graph_figures.report(torch, figures, args.figures, quiet=("losses",))
    return 0


if __name__ == "__main__":
    sys.exit(main())
