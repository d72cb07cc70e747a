"""vLLM's sleep mode on PyTorch's own API, under reservoir.torch, in a fresh process:
torch.cuda.MemPool(allocator=X) with X a torch.cuda.memory.CUDAPluggableAllocator over
cuMem calls (cumem_pluggable.c), weights allocated in the pool, their memory released
through X (sleep) and mapped again at the same addresses (wake), values restored from
a host copy. Prints one JSON line with what it measured.

    python3 mempool_allocator_worker.py --config policy:compact --build-dir DIR
"""

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def build(folder):
    """libcumem_pluggable.so, built with the system's C compiler against libcuda."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    library = os.path.join(folder, "libcumem_pluggable.so")
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-I" + os.path.join(cuda, "include"),
                    os.path.join(HERE, "cumem_pluggable.c"), "-o", library, "-lcuda"], check=True)
    return library


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="", help="Reservoir's settings (\"\": defaults)")
    parser.add_argument("--build-dir", required=True)
    args = parser.parse_args()
    library = build(args.build_dir)
    import reservoir
    import reservoir.torch

    reservoir.torch.install(config=args.config or None)
    import torch

    lib = ctypes.CDLL(library)
    lib.sleep_all.restype = lib.wake_all.restype = ctypes.c_size_t
    allocator = torch.cuda.memory.CUDAPluggableAllocator(library, "my_malloc", "my_free")
    pool = torch.cuda.MemPool(allocator._allocator)  # as vLLM passes it
    report = {"config": args.config, "native": reservoir.torch.native_status()}
    torch.manual_seed(0)
    with torch.cuda.use_mem_pool(pool):
        weights = [torch.randn(n, device="cuda") for n in (48 << 20, 5 << 20, 300_000)]
    default = torch.randn(1 << 20, device="cuda")  # outside the pool: not put to sleep
    report["pool_allocations"] = lib.allocations()
    in_pool = [s for s in reservoir.segments() if s["pool"] == tuple(pool.id)]
    report["pool_segments"] = len(in_pool)
    report["weights_in_pool"] = all(
        any(s["address"] <= w.data_ptr() < s["address"] + s["size"] for s in in_pool)
        for w in weights)
    saved = [w.cpu() for w in weights]
    expected = sum(float(w.double().sum()) for w in saved)
    torch.cuda.synchronize()
    free_awake = torch.cuda.mem_get_info()[0]
    report["slept_bytes"] = lib.sleep_all()
    report["freed_by_sleep"] = torch.cuda.mem_get_info()[0] - free_awake
    report["woken_bytes"] = lib.wake_all()
    pointers = [w.data_ptr() for w in weights]
    for w, s in zip(weights, saved):
        w.copy_(s)
    report["same_addresses"] = pointers == [w.data_ptr() for w in weights]
    report["values_restored"] = all(torch.equal(w.cpu(), s) for w, s in zip(weights, saved))
    report["sum_right"] = abs(sum(float(w.double().sum()) for w in weights) - expected) < 1e-6
    report["default_untouched"] = bool(torch.isfinite(default).all())
    del weights, w
    torch.cuda.synchronize()
    del pool
    torch.cuda.empty_cache()
    report["pool_deallocations"] = lib.deallocations()
    report["failed_driver_calls"] = lib.failed_calls()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
