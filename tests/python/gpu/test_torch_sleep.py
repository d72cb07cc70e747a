"""Sleep and wake of a Hugging Face causal LM under Reservoir, on a GPU (skipped
without PyTorch, transformers and a CUDA device): sleep_worker.py in a fresh process
under policy:compact and under the default policy; it checks the device memory given
back (within 64 MiB of before the model was loaded), another allocation taking it,
the tokens of eager and CUDA-graph generation after wake, and 100 cycles without
growth (docs/sleep.md).

    python3 -m unittest -v tests/python/gpu/test_torch_sleep.py
"""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_torch_cupy_gpu import HAVE_CUDA  # noqa: E402

try:
    import transformers  # noqa: F401

    HAVE_TRANSFORMERS = True
except ImportError:
    HAVE_TRANSFORMERS = False

WORKER = os.path.join(HERE, "sleep_worker.py")


def run_worker(*args, timeout=900):
    proc = subprocess.run([sys.executable, WORKER, *args], capture_output=True, text=True,
                          timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise AssertionError("the worker printed no figures (exit %d):\n%s" %
                             (proc.returncode, proc.stderr[-6000:]))
    return proc.returncode, json.loads(lines[-1])


@unittest.skipUnless(HAVE_CUDA and HAVE_TRANSFORMERS, "needs PyTorch, transformers and a GPU")
class SleepWakeOnAGpu(unittest.TestCase):
    def check(self, config):
        code, out = run_worker("--config", config)
        print(json.dumps(out, indent=1), file=sys.stderr)
        self.assertTrue(out["within_64_mib"], out["free_mib"])
        self.assertTrue(out["driver_allocation_ok"])
        self.assertTrue(out["eager_equal"])
        self.assertTrue(out["graph_equal"])
        self.assertTrue(out["on_stream_equal"])
        self.assertTrue(out["after_cycles_equal"])
        self.assertLessEqual(abs(out["cycles"]["device_free_drift_mib"]), 16)
        self.assertLessEqual(out["cycles"]["host_rss_growth_mib"], 64)
        self.assertEqual(code, 0)

    def test_a_causal_lm_sleeps_and_wakes_under_policy_compact(self):
        self.check("policy:compact")

    def test_a_causal_lm_sleeps_and_wakes_under_the_default_policy(self):
        self.check("")


if __name__ == "__main__":
    unittest.main()
