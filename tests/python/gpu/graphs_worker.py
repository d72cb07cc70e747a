"""One CUDA-graph case in a fresh process, on PyTorch's allocator or on Reservoir
(test_torch_graphs.py runs each case both ways and compares what they saved).

    python3 graphs_worker.py --case mlp --allocator reservoir --out result.pt

Allocators: pytorch, pytorch-expandable (expandable_segments:True), reservoir,
reservoir-compact (policy:compact). info["max_memory_reserved"] is the process's peak.

Saves {"outputs": [CPU tensors...], "info": {...}} with torch.save. Deterministic:
fixed seeds, no TF32, a fixed cuBLAS workspace.
"""

import argparse
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def setup(allocator):
    if allocator == "pytorch-expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if allocator in ("reservoir", "reservoir-compact"):
        import reservoir.torch

        reservoir.torch.install(config="policy:compact" if allocator == "reservoir-compact"
                                else None)
    import torch

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return torch


def mlp(torch):
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 64)).cuda()


def capture_and_replay(torch, model, static_input, inputs):
    """Warms up on a side stream, captures model(static_input), replays per input."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static_input)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_output = model(static_input)
    outputs = []
    for x in inputs:
        static_input.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        out = static_output.logits if hasattr(static_output, "logits") else static_output
        outputs.append(out.detach().float().cpu().clone())
    return graph, outputs


def pool_info(torch):
    snapshot = torch.cuda.memory._snapshot()
    pools = sorted({tuple(s["segment_pool_id"]) for s in snapshot["segments"]} - {(0, 0)})
    return {"pools_in_snapshot": [list(p) for p in pools],
            "reserved": torch.cuda.memory_reserved()}


def case_mlp(torch, args):
    model = mlp(torch).eval()
    static_input = torch.randn(32, 256, device="cuda")
    inputs = [torch.randn(32, 256, device="cuda") for _ in range(5)]
    graph, outputs = capture_and_replay(torch, model, static_input, inputs)
    info = pool_info(torch)
    if args.snapshot:
        from torch.cuda import _memory_viz

        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._dump_snapshot(args.snapshot)
        info["segment_plot_chars"] = len(_memory_viz.segment_plot(snapshot))
        info["trace_plot_chars"] = len(_memory_viz.trace_plot(snapshot))
    del graph
    return outputs, info


def case_gpt2(torch, args):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=4096,
                        bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config).cuda().eval()
    g = torch.Generator(device="cuda").manual_seed(1)
    batch, length = 2, 64
    static_ids = torch.randint(0, 4096, (batch, length), device="cuda", generator=g)
    inputs = [torch.randint(0, 4096, (batch, length), device="cuda", generator=g)
              for _ in range(3)]
    # The mask and positions are made before capture: transformers builds its causal mask
    # from a CPU scalar, a host-to-device copy that a capture refuses (on any allocator).
    # A 4-D additive mask is used as given.
    blocked = torch.full((length, length), torch.finfo(torch.float32).min, device="cuda")
    mask = blocked.triu(1)[None, None].expand(batch, 1, length, length).contiguous()
    positions = torch.arange(length, device="cuda")[None].expand(batch, length).contiguous()
    graph, outputs = capture_and_replay(
        torch, lambda ids: model(ids, attention_mask=mask, position_ids=positions,
                                 use_cache=False), static_ids, inputs)
    info = pool_info(torch)
    del graph
    return outputs, info


def case_graphed_callables(torch, args):
    model = mlp(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sample = torch.randn(32, 256, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    outputs = []
    for step in range(8):
        x = torch.randn(32, 256, device="cuda")
        loss = graphed(x).square().mean()
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        outputs.append(loss.detach().float().cpu().reshape(1))
    outputs.extend(p.detach().float().cpu().clone() for p in model.parameters())
    return outputs, pool_info(torch)


def case_compile(torch, args):
    layer = torch.nn.TransformerEncoderLayer(128, 4, dim_feedforward=256, dropout=0.0,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2).cuda()
    head = torch.nn.Linear(128, 16).cuda()
    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.SGD(params, lr=0.01)

    def forward(x):
        return head(model(x))

    compiled = torch.compile(forward, mode="reduce-overhead")
    outputs = []
    calls = {"checkpoint": 0, "restore": 0}
    if args.allocator in ("reservoir", "reservoir-compact"):
        from reservoir import _torch_pools

        for name, key in (("_cuda_getCheckpointState", "checkpoint"),
                          ("_cuda_setCheckpointPoolState", "restore")):
            original = getattr(torch._C, name)

            def counted(*a, _original=original, _key=key, **k):
                calls[_key] += 1
                return _original(*a, **k)

            setattr(torch._C, name, counted)
        assert _torch_pools  # imported for its patches
    g = torch.Generator(device="cuda").manual_seed(2)
    for step in range(20):
        x = torch.randn(8, 32, 128, device="cuda", generator=g)
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(x)
        loss = out.square().mean()
        # Gradients are graph outputs: dropped each step (set_to_none), as cudagraph trees
        # require, since the next replay overwrites them.
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        outputs.append(loss.detach().float().cpu().reshape(1))
    with torch.no_grad():  # an inference graph recorded after training, in the same pool
        for _ in range(3):
            x = torch.randn(8, 32, 128, device="cuda", generator=g)
            torch.compiler.cudagraph_mark_step_begin()
            outputs.append(compiled(x).detach().float().cpu().clone())
    torch.cuda.synchronize()
    outputs.extend(p.detach().float().cpu().clone() for p in params)
    info = pool_info(torch)
    info["pool_calls"] = calls
    return outputs, info


def case_mempool(torch, args):
    """Reservoir only: torch.cuda.MemPool and use_mem_pool route to a private pool."""
    pool = torch.cuda.MemPool()
    assert pool.use_count() == 1, pool.use_count()
    with torch.cuda.use_mem_pool(pool):
        x = torch.randn(1 << 20, device="cuda")
        assert pool.use_count() == 2
    y = torch.randn(1 << 20, device="cuda")
    segments = torch.cuda.memory_snapshot(pool.id)
    assert segments and all(tuple(s["segment_pool_id"]) == tuple(pool.id) for s in segments)
    address = x.data_ptr()
    assert any(s["address"] <= address < s["address"] + s["total_size"] for s in segments)
    assert not any(s["address"] <= y.data_ptr() < s["address"] + s["total_size"]
                   for s in segments)
    graph = torch.cuda.CUDAGraph()
    static = torch.zeros(1024, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, pool=pool.id):
        static.add_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    import reservoir

    stats = reservoir.private_pool_stats()
    info = {"private_pools": stats["private_pools"],
            "private_reserved": stats["private_pool_reserved_bytes"],
            "static_sum": float(static.sum())}
    del x, graph
    pool.release()
    del pool
    torch.cuda.empty_cache()
    info["private_pools_after_release"] = reservoir.private_pool_stats()["private_pools"]
    return [static.cpu()], info


CASES = {"mlp": case_mlp, "gpt2": case_gpt2, "graphed_callables": case_graphed_callables,
         "compile": case_compile, "mempool": case_mempool}


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--allocator", required=True,
                        choices=("pytorch", "pytorch-expandable", "reservoir",
                                 "reservoir-compact"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--snapshot", default=None)
    args = parser.parse_args(argv)
    torch = setup(args.allocator)
    outputs, info = CASES[args.case](torch, args)
    torch.cuda.synchronize()
    info["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    torch.save({"outputs": outputs, "info": info}, args.out)
    print("info:", info)


if __name__ == "__main__":
    main(sys.argv[1:])
