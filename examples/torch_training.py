#!/usr/bin/env python3
"""Reservoir as PyTorch's CUDA allocator: a few training steps of a small model,
then the memory summary.

    PYTHONPATH=python python3 examples/torch_training.py

install() must run before anything initializes CUDA. Exits with 77 (skipped)
without PyTorch or a CUDA device.
"""

import sys

SKIP = 77

try:
    import torch
except ImportError:
    print("skipped: PyTorch is not installed (python3 -m pip install torch)")
    sys.exit(SKIP)
if not torch.cuda.is_available():  # does not initialize CUDA
    print("skipped: PyTorch sees no CUDA device")
    sys.exit(SKIP)

import reservoir
import reservoir.torch

reservoir.torch.install()  # first thing: every CUDA tensor from now on is Reservoir's

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(5):
    x = torch.randn(256, 1024, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print("step %d: loss %.4f" % (step, loss.item()))

# torch.cuda.memory_stats() does not see a pluggable allocator: ask Reservoir.
stats = reservoir.torch.memory_stats()
print("peak allocated %d MiB, reserved now %d MiB"
      % (stats["allocated_bytes.all.peak"] >> 20, stats["reserved_bytes.all.current"] >> 20))
print(reservoir.torch.memory_summary(abbreviated=True))
sys.exit(0 if stats["allocated_bytes.all.peak"] > 0 else 1)
