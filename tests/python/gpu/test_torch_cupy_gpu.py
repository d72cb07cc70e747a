"""GPU tests of reservoir.torch and reservoir.cupy (skipped without a CUDA device,
PyTorch, transformers, torchvision or CuPy).

Each training runs in a fresh interpreter (bench/python/train_bench.py --worker):
Reservoir must be installed before CUDA is initialized, and the PyTorch baseline
must not share a process with it. Runs with pytest or unittest:
    python3 -m pytest -v tests/python/gpu
    python3 -m unittest discover -s tests/python/gpu -v
"""

import importlib.util
import math
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(REPO, "bench", "python"))
if importlib.util.find_spec("reservoir") is None:
    sys.path.insert(0, os.path.join(REPO, "python"))

import train_bench  # noqa: E402

SEED = 1234


def _have(module):
    return importlib.util.find_spec(module) is not None


def _cuda_available():
    if not _have("torch"):
        return False
    # In a child, so this process never initializes CUDA.
    proc = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True, text=True, timeout=300,
    )
    return proc.stdout.strip().endswith("True")


HAVE_CUDA = _cuda_available()
needs_torch_cuda = unittest.skipUnless(HAVE_CUDA, "needs PyTorch and a CUDA device")


def run_python(code, timeout=600):
    env = train_bench.child_environment()
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc


class TrainingAgreementMixin:
    """Runs one model on PyTorch's allocator and on Reservoir, deterministically."""

    model = None
    runs = {}

    @classmethod
    def results(cls):
        if cls.model not in cls.runs:
            native = train_bench.run_training(
                cls.model, "pytorch", seed=SEED, deterministic=True, attn="eager")
            ours = train_bench.run_training(
                cls.model, "reservoir", seed=SEED, deterministic=True, attn="eager")
            cls.runs[cls.model] = (native, ours)
        return cls.runs[cls.model]

    def test_losses_are_finite_and_equal(self):
        native, ours = self.results()
        self.assertEqual(len(ours["losses"]), train_bench.DEFAULT_STEPS[self.model])
        for name, result in (("pytorch", native), ("reservoir", ours)):
            bad = [x for x in result["losses"] if not math.isfinite(x)]
            self.assertEqual(bad, [], "%s losses not finite: %s" % (name, result["losses"]))
        if native["losses"] != ours["losses"]:
            first = next(i for i, (a, b) in enumerate(zip(native["losses"], ours["losses"]))
                         if a != b)
            self.fail(
                "losses differ from step %d: pytorch %r, reservoir %r (max abs diff %g)"
                % (first, native["losses"][first:first + 3], ours["losses"][first:first + 3],
                   max(abs(a - b) for a, b in zip(native["losses"], ours["losses"])))
            )

    def test_reservoir_statistics_agree_with_the_run(self):
        native, ours = self.results()
        end = ours["end_stats"]
        check = ours["checkpoint"]
        self.assertGreater(ours["peak_requested"], 0)
        self.assertGreaterEqual(ours["peak_allocated"], ours["peak_requested"])
        self.assertGreaterEqual(ours["peak_reserved"], ours["peak_allocated"])
        self.assertEqual(end["num_ooms"], 0)
        # Model, gradients (none: zero_grad(set_to_none)) and optimizer state are
        # live; cuBLAS workspaces come on top.
        self.assertGreaterEqual(end["requested_bytes.all.current"], check["live_state_bytes"])
        self.assertGreaterEqual(end["allocated_bytes.all.current"], end["requested_bytes.all.current"])
        # Tensors of known sizes move the counters by exactly their storage bytes.
        self.assertEqual(check["requested_delta"], check["probe_bytes"])
        self.assertEqual(check["allocation_delta"], check["probe_count"])
        self.assertGreaterEqual(check["allocated_delta"], check["requested_delta"])
        self.assertEqual(check["requested_after_free_delta"], 0)
        self.assertEqual(check["allocation_after_free_delta"], 0)
        # PyTorch's own allocator counts the same probe the same way.
        self.assertEqual(native["checkpoint"]["requested_delta"], check["probe_bytes"])
        self.assertEqual(native["checkpoint"]["live_state_bytes"], check["live_state_bytes"])
        for setter in ("set_init_fn", "set_reset_fn", "set_memory_fraction_fn",
                       "set_base_alloc_fn", "set_record_stream_fn"):
            self.assertIn(setter, ours["installed_hooks"])


@needs_torch_cuda
@unittest.skipUnless(_have("transformers"), "needs transformers")
class GPT2TrainingTest(TrainingAgreementMixin, unittest.TestCase):
    model = "gpt2"


@needs_torch_cuda
@unittest.skipUnless(_have("torchvision"), "needs torchvision")
class ResNet50TrainingTest(TrainingAgreementMixin, unittest.TestCase):
    model = "resnet50"


@needs_torch_cuda
class TorchIntegrationTest(unittest.TestCase):
    def test_install_after_cuda_init_is_refused_with_advice(self):
        proc = run_python(
            "import torch\n"
            "x = torch.zeros(1, device='cuda')\n"
            "import reservoir.torch\n"
            "try:\n"
            "    reservoir.torch.install()\n"
            "except RuntimeError as e:\n"
            "    print('REFUSED', e)\n"
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("REFUSED", proc.stdout)
        self.assertIn("reservoir.torch.install()", proc.stdout)
        self.assertIn("program start", proc.stdout)

    def test_hooks_and_statistics(self):
        proc = run_python(
            "import reservoir.torch as rt, reservoir\n"
            "rt.install()\n"
            "import torch\n"
            "print('hooks', sorted(rt.installed_hooks()))\n"
            "x = torch.empty(3 << 20, dtype=torch.uint8, device='cuda')\n"
            "s = rt.memory_stats()\n"
            "assert s['requested_bytes.all.current'] >= 3 << 20, s\n"
            "assert s['allocation.large_pool.current'] >= 1, s\n"
            "# record_stream: the block waits for the side stream's work.\n"
            "side = torch.cuda.Stream()\n"
            "with torch.cuda.stream(side):\n"
            "    y = x.float() * 2\n"
            "x.record_stream(side)\n"
            "del x\n"
            "torch.cuda.synchronize()\n"
            "del y\n"
            "torch.cuda.empty_cache()\n"
            "print('reserved after empty_cache', rt.memory_reserved())\n"
            "torch.cuda.set_per_process_memory_fraction(0.5)\n"
            "assert reservoir.get_memory_fraction(torch.cuda.current_device()) == 0.5\n"
            "torch.cuda.set_per_process_memory_fraction(1.0)\n"
            "try:\n"
            "    torch.empty(1 << 46, dtype=torch.uint8, device='cuda')  # 64 TiB\n"
            "except RuntimeError as e:\n"
            "    print('OOM', str(e).splitlines()[0][:200])\n"
            "try:\n"
            "    g = torch.cuda.CUDAGraph()\n"
            "    z = torch.ones(4, device='cuda')\n"
            "    with torch.cuda.graph(g):\n"
            "        w = z * 2\n"
            "    print('GRAPH captured')\n"
            "except RuntimeError as e:\n"
            "    print('GRAPH refused', str(e)[:300].replace(chr(10), ' '))\n"
            "reservoir.validate()\n"
            "print(rt.memory_summary())\n"
            "print('done')\n"
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        out = proc.stdout
        self.assertIn("done", out)
        self.assertIn("set_record_stream_fn", out)
        self.assertIn("OOM CUDA out of memory", out)
        self.assertIn("GRAPH refused", out)
        self.assertNotIn("reservoir: freeing", proc.stderr)


@unittest.skipUnless(_have("cupy") and _have("numpy"), "needs CuPy and NumPy")
class CupyTest(unittest.TestCase):
    def test_matmul_and_fft_through_reservoir(self):
        proc = run_python(
            "import gc, numpy as np, cupy as cp, reservoir, reservoir.cupy\n"
            "try:\n"
            "    cp.cuda.runtime.getDeviceCount()\n"
            "except Exception:\n"
            "    print('NO DEVICE'); raise SystemExit(0)\n"
            "reservoir.cupy.install()\n"
            "dev = cp.cuda.Device().id\n"
            "base = reservoir.memory_stats(dev)\n"
            "rng = np.random.default_rng(7)\n"
            "a_h = rng.standard_normal((2048, 2048))\n"
            "b_h = rng.standard_normal((2048, 2048))\n"
            "a, b = cp.asarray(a_h), cp.asarray(b_h)\n"
            "c = a @ b\n"
            "x_h = rng.standard_normal((4096, 1024)) + 1j * rng.standard_normal((4096, 1024))\n"
            "x = cp.asarray(x_h)\n"
            "f = cp.fft.fft2(x)\n"
            "live = reservoir.memory_stats(dev)\n"
            "need = a.nbytes + b.nbytes + c.nbytes + x.nbytes + f.nbytes\n"
            "assert live['requested_bytes.all.current'] - base['requested_bytes.all.current'] >= need\n"
            "assert np.allclose(cp.asnumpy(c), a_h @ b_h, rtol=1e-9, atol=1e-9)\n"
            "assert np.allclose(cp.asnumpy(f), np.fft.fft2(x_h), rtol=1e-9, atol=1e-6)\n"
            "# A side stream: blocks are allocated for CuPy's current stream.\n"
            "s = cp.cuda.Stream(non_blocking=True)\n"
            "with s:\n"
            "    d = (a * 2).sum()\n"
            "s.synchronize()\n"
            "assert abs(float(d) - 2 * a_h.sum()) < 1e-6 * abs(a_h).sum()\n"
            "del a, b, c, x, f, d\n"
            "gc.collect()\n"
            "cp.cuda.Device().synchronize()\n"
            "end = reservoir.memory_stats(dev)\n"
            "freed = live['requested_bytes.all.current'] - end['requested_bytes.all.current']\n"
            "assert freed >= need, (freed, need)\n"
            "reservoir.validate()\n"
            "reservoir.cupy.uninstall()\n"
            "print('peak', end['requested_bytes.all.peak'], 'ok')\n"
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        if "NO DEVICE" in proc.stdout:
            self.skipTest("no CUDA device for CuPy")
        self.assertIn("ok", proc.stdout)
        self.assertNotIn("reservoir: freeing", proc.stderr)


if __name__ == "__main__":
    unittest.main()
