"""NCCL registers Reservoir's memory, on a GPU (skipped without PyTorch, NCCL and a
CUDA device): a one-rank process group with PyTorch's allocator hook
(TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1) under reservoir.torch, with the
default settings and with policy:compact. ProcessGroupNCCL lists the allocator's
segments when the communicator is made (the native part's snapshot) and registers
every segment made later through the trace trackers (the native part's
attachAllocatorTraceTracker): every segment Reservoir holds at the collective must be
registered with NCCL (its NCCL_DEBUG=INFO "register comm" lines), the all-reduce
must give the right sums, and the deregistrations of segments given back later must
all find their registration (no tracker error, no NCCL warning).

    python3 -m unittest -v tests/python/gpu/test_torch_nccl.py
"""

import glob
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

WORKER = os.path.join(HERE, "nccl_worker.py")


def have_nccl():
    if not HAVE_CUDA:
        return False
    import torch.distributed

    return torch.distributed.is_available() and torch.distributed.is_nccl_available()


@unittest.skipUnless(have_nccl(), "needs PyTorch with NCCL and a CUDA device")
class NcclRegistersReservoirsSegments(unittest.TestCase):
    def check(self, config):
        with tempfile.TemporaryDirectory() as logs:
            proc = subprocess.run([sys.executable, WORKER, "--config", config, "--log-dir", logs],
                                  env=train_bench.child_environment(), capture_output=True,
                                  text=True, timeout=600)
            nccl_log = ""
            for path in glob.glob(os.path.join(logs, "nccl.*.log")):
                with open(path, errors="replace") as fh:
                    nccl_log += fh.read()
        self.assertEqual(proc.returncode, 0, proc.stderr[-6000:])
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        print("\n%s: %d segments at the collective, %d NCCL registrations, native %s" % (
            config or "defaults", len(report["segments_at_collective"]),
            len(report["registered"]), report["native"]))
        self.assertTrue(report["native"]["active"], report["native"])
        self.assertTrue(report["sums_right"])
        self.assertGreater(report["segments_before_communicator"], 0)
        self.assertTrue(report["segments_at_collective"])
        registered = report["registered"]

        def covered(address, size):
            return any(a <= address and address + size <= a + n for a, n in registered)

        missing = [s for s in report["segments_at_collective"] if not covered(*s)]
        self.assertEqual(missing, [], "segments held at the collective that NCCL never "
                                      "registered (registered: %s)" % registered)
        self.assertEqual(report["segments_after_empty_cache"], 0)
        # Every segment given back was deregistered without complaint.
        self.assertTrue(any(a in ("segment_free", "segment_unmap")
                            for a, _, _ in report["segment_entries"]))
        self.assertNotIn("trace tracker threw", proc.stderr)
        self.assertNotIn("Could not find handle", nccl_log)
        self.assertNotIn("not registered", proc.stderr)

    def test_default_settings(self):
        self.check("")

    def test_policy_compact(self):
        self.check("policy:compact")


if __name__ == "__main__":
    unittest.main()
