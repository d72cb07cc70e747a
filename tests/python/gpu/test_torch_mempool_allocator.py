"""torch.cuda.MemPool(allocator=...) under reservoir.torch, on a GPU (skipped without
PyTorch and a CUDA device): vLLM's sleep mode on PyTorch's own API (a pluggable
allocator over cuMem calls serves the pool's segments; Reservoir splits and caches
blocks inside them; the memory is released through the allocator and mapped again at
the same addresses; values restored), with the default settings and policy:compact.

    python3 -m unittest -v tests/python/gpu/test_torch_mempool_allocator.py
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_torch_cupy_gpu import HAVE_CUDA  # noqa: E402
import train_bench  # noqa: E402  (test_torch_cupy_gpu put bench/python on the path)

WORKER = os.path.join(HERE, "mempool_allocator_worker.py")


@unittest.skipUnless(HAVE_CUDA, "needs PyTorch and a CUDA device")
class MemPoolOverAPluggableAllocator(unittest.TestCase):
    def check(self, config):
        with tempfile.TemporaryDirectory() as folder:
            proc = subprocess.run([sys.executable, WORKER, "--config", config,
                                   "--build-dir", folder], env=train_bench.child_environment(),
                                  capture_output=True, text=True, timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stderr[-6000:])
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        print("\n%s: %s" % (config or "defaults", report))
        self.assertTrue(report["native"]["active"], report["native"])
        self.assertGreaterEqual(report["pool_allocations"], 1)
        self.assertEqual(report["pool_segments"], report["pool_allocations"])
        self.assertTrue(report["weights_in_pool"])
        self.assertGreaterEqual(report["slept_bytes"], (48 << 20) * 4)
        # The device got the memory back while asleep (other processes may move it a little).
        self.assertGreaterEqual(report["freed_by_sleep"], report["slept_bytes"] * 0.9)
        self.assertEqual(report["woken_bytes"], report["slept_bytes"])
        self.assertTrue(report["same_addresses"])
        self.assertTrue(report["values_restored"])
        self.assertTrue(report["sum_right"])
        self.assertTrue(report["default_untouched"])
        self.assertEqual(report["pool_deallocations"], report["pool_allocations"])
        self.assertEqual(report["failed_driver_calls"], 0, proc.stderr[-3000:])

    def test_default_settings(self):
        self.check("")

    def test_policy_compact(self):
        self.check("policy:compact")


if __name__ == "__main__":
    unittest.main()
