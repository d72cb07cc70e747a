#!/usr/bin/env python3
"""Two GPUs under PyTorch's distributed training: the workers that
scripts/gpu/multi-gpu.sh runs. Each takes the allocator mode: pytorch (PyTorch's own
allocator), or a Reservoir setting: default, expandable (expandable_segments:True),
compact (policy:compact).

  torchrun --nproc_per_node 2 two_gpu.py ddp MODE OUT.json
      GPT-2 small DDP training (transformers, random init, seed 1234, batch 4,
      sequence length 256, AdamW, bf16 autocast, 20 steps); rank 0 writes the losses
      and every rank's peak reserved memory.
  torchrun --nproc_per_node 2 two_gpu.py allreduce MODE OUT.json
      NCCL all-reduce over tensors Reservoir allocated (1 KiB to 256 MiB, each rank
      filled with rank + 1): every element must be 3 afterwards.
  python3 two_gpu.py peer MODE OUT.json
      one process, both devices: copies between cuda:0 and cuda:1 (ordinary and
      expandable memory as the mode gives), from two threads, frees from a thread whose
      current device is the other one.
"""

import json
import os
import sys
import threading

SETTINGS = {"default": "", "expandable": "expandable_segments:True", "compact": "policy:compact"}
MiB = 1 << 20


def setup(mode):
    import torch

    if mode != "pytorch":
        import reservoir.torch

        reservoir.torch.install(SETTINGS[mode] or None)
    return torch


def peak_reserved(torch, mode, device):
    if mode == "pytorch":
        return torch.cuda.max_memory_reserved(device)
    import reservoir

    return reservoir.memory_stats(device)["reserved_bytes.all.peak"]


def ddp(mode, out):
    torch = setup(mode)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import GPT2Config, GPT2LMHeadModel

    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    torch.manual_seed(1234)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    model = DDP(model, device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1234 + rank)
    losses = []
    for _ in range(20):
        ids = torch.randint(0, 50257, (4, 256), generator=gen).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    peak = torch.tensor([peak_reserved(torch, mode, rank)], device="cuda")
    peaks = [torch.zeros_like(peak) for _ in range(dist.get_world_size())]
    dist.all_gather(peaks, peak)
    if rank == 0:
        json.dump({"mode": mode, "losses": losses, "peak_reserved": [int(p) for p in peaks]},
                  open(out, "w"))
    dist.destroy_process_group()


def allreduce(mode, out):
    torch = setup(mode)
    import torch.distributed as dist

    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    bad = []
    for size in (1024, MiB + 5, 64 * MiB, 256 * MiB):
        t = torch.full((size // 4,), float(rank + 1), device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        if not bool((t == 3.0).all()):
            bad.append(size)
        del t
    flags = torch.tensor([len(bad)], device="cuda")
    dist.all_reduce(flags)
    if rank == 0:
        json.dump({"mode": mode, "ok": int(flags) == 0, "bad_sizes_rank0": bad}, open(out, "w"))
    dist.destroy_process_group()


def peer(mode, out):
    torch = setup(mode)
    if torch.cuda.device_count() < 2:
        json.dump({"mode": mode, "ok": False, "why": "fewer than 2 devices"}, open(out, "w"))
        return
    results = {}

    def copy(src, dst):
        torch.cuda.set_device(src)
        for size in (4096, 3 * MiB + 5, 96 * MiB):
            a = torch.arange(size // 4, device="cuda:%d" % src, dtype=torch.float32)
            b = a.to("cuda:%d" % dst)  # a peer copy
            c = b.to("cuda:%d" % src)
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            results[(src, dst, size)] = bool(torch.equal(a, c))
            # b belongs to dst; freed here, where the current device is src.
            del a, b, c

    threads = [threading.Thread(target=copy, args=(0, 1)), threading.Thread(target=copy, args=(1, 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peaks = [peak_reserved(torch, mode, d) for d in (0, 1)]
    json.dump({"mode": mode, "ok": all(results.values()) and len(results) == 6,
               "copies": {"%d->%d %d" % k: v for k, v in results.items()}, "peak_reserved": peaks},
              open(out, "w"))


if __name__ == "__main__":
    what, mode, out = sys.argv[1:4]
    {"ddp": ddp, "allreduce": allreduce, "peer": peer}[what](mode, out)
