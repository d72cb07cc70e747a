#!/usr/bin/env python3
"""Reservoir as CuPy's allocator: arrays allocated and freed through Reservoir's
cache, then its statistics.

    PYTHONPATH=python python3 examples/cupy_arrays.py

Unlike PyTorch, CuPy can switch allocators at any time. Exits with 77 (skipped)
without CuPy or a CUDA device.
"""

import sys

SKIP = 77

try:
    import cupy
except ImportError:
    print("skipped: CuPy is not installed (python3 -m pip install cupy-cuda12x)")
    sys.exit(SKIP)
try:
    devices = cupy.cuda.runtime.getDeviceCount()
except cupy.cuda.runtime.CUDARuntimeError:
    devices = 0
if devices == 0:
    print("skipped: CuPy sees no CUDA device")
    sys.exit(SKIP)

import reservoir
import reservoir.cupy

reservoir.cupy.install()
a = cupy.random.rand(2048, 2048, dtype=cupy.float32)  # 16 MiB from Reservoir
b = a @ a.T
print("sum %.3f" % float(b.sum()))
allocated = reservoir.memory_stats()["allocated_bytes.all.current"]
print("allocated now %d MiB" % (allocated >> 20))
del a, b  # back to Reservoir's cache, not to the device
cupy.cuda.get_current_stream().synchronize()
stats = reservoir.memory_stats()
print("after del: allocated %d MiB, reserved %d MiB"
      % (stats["allocated_bytes.all.current"] >> 20, stats["reserved_bytes.all.current"] >> 20))
reservoir.cupy.uninstall()
sys.exit(0 if allocated >= 32 << 20 and stats["reserved_bytes.all.current"] > 0 else 1)
