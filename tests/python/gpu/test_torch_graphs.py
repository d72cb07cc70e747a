"""CUDA graphs on Reservoir, on a GPU (skipped without PyTorch and a CUDA device):
torch.cuda.graph capture and replay of an MLP and of a GPT-2 forward pass,
torch.cuda.make_graphed_callables, and torch.compile(mode="reduce-overhead") of a
small transformer (cudagraph trees: checkpoints and restores of the graph pool),
each run in two processes - PyTorch's own allocator and Reservoir - whose outputs
must be equal; a snapshot after capture that shows the graph pool and opens in
torch.cuda._memory_viz; torch.cuda.MemPool and use_mem_pool on Reservoir's pools.

    scripts/gpu/torch.sh OUT graphs        # or:
    python3 -m unittest -v tests/python/gpu/test_torch_graphs.py
"""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_torch_cupy_gpu import HAVE_CUDA  # noqa: E402
import train_bench  # noqa: E402  (test_torch_cupy_gpu put bench/python on the path)

needs_torch_cuda = unittest.skipUnless(HAVE_CUDA, "needs PyTorch and a CUDA device")
WORKER = os.path.join(HERE, "graphs_worker.py")


def first_traceback(stderr, limit=8000):
    """The error that ended the worker: stderr from its first "Traceback", with the
    "Exception ignored in" reports of interpreter shutdown left out."""
    lines, skipping = [], False
    for line in stderr.splitlines():
        if line.startswith("Exception ignored in"):
            skipping = True
            continue
        if skipping and (line.startswith(" ") or line.startswith("Traceback")
                         or line.startswith("AttributeError")):
            continue
        skipping = False
        lines.append(line)
    text = "\n".join(lines)
    start = text.find("Traceback (most recent call last)")
    return text[start:start + limit] if start >= 0 else text[-limit:]


def run_case(case, allocator, snapshot=None, timeout=900):
    """Runs one case in a fresh interpreter; returns (saved dict, stdout)."""
    import torch

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.pt")
        command = [sys.executable, WORKER, "--case", case, "--allocator", allocator, "--out", out]
        if snapshot:
            command += ["--snapshot", snapshot]
        proc = subprocess.run(command, env=train_bench.child_environment(), capture_output=True,
                              text=True, timeout=timeout)
        log_dir = os.environ.get("RESERVOIR_TEST_LOG_DIR")
        if log_dir:  # the whole output, for a run whose console keeps only a tail
            os.makedirs(log_dir, exist_ok=True)
            with open(os.path.join(log_dir, "graphs-%s-%s.log" % (case, allocator)), "w") as f:
                f.write(proc.stdout + "\n--- stderr\n" + proc.stderr)
        if proc.returncode != 0:
            raise AssertionError("%s on %s failed (exit %d):\n%s\n%s" % (
                case, allocator, proc.returncode, proc.stdout[-4000:],
                first_traceback(proc.stderr)))
        return torch.load(out), proc.stdout


@needs_torch_cuda
class GraphsAgreeWithPyTorch(unittest.TestCase):
    def compare(self, case):
        import torch

        native, _ = run_case(case, "pytorch")
        ours, stdout = run_case(case, "reservoir")
        self.assertEqual(len(native["outputs"]), len(ours["outputs"]))
        for i, (a, b) in enumerate(zip(native["outputs"], ours["outputs"])):
            self.assertEqual(a.shape, b.shape, "output %d" % i)
            if not torch.equal(a, b):
                diff = (a - b).abs().max().item()
                self.fail("%s: output %d differs from PyTorch's allocator (max |diff| %g)"
                          % (case, i, diff))
        self.assertTrue(ours["info"]["pools_in_snapshot"],
                        "%s: no private pool in Reservoir's snapshot after capture" % case)
        print("%s: %d outputs equal; Reservoir: %s" % (case, len(ours["outputs"]), ours["info"]))
        return native, ours

    def test_mlp_capture_and_replay(self):
        self.compare("mlp")

    def test_gpt2_forward_capture_and_replay(self):
        self.compare("gpt2")

    def test_make_graphed_callables(self):
        self.compare("graphed_callables")

    def test_compile_reduce_overhead_20_steps(self):
        _, ours = self.compare("compile")
        calls = ours["info"]["pool_calls"]
        self.assertGreater(calls["checkpoint"], 0, "cudagraph trees took no checkpoint")


@needs_torch_cuda
class GraphsUnderPolicyCompact(unittest.TestCase):
    """Under policy:compact: outputs equal to PyTorch's allocator's, and a peak reserved
    below PyTorch's with expandable_segments:True (each in a fresh process)."""

    def compare(self, case):
        import torch

        native, _ = run_case(case, "pytorch")
        expandable, _ = run_case(case, "pytorch-expandable")
        compact, _ = run_case(case, "reservoir-compact")
        self.assertEqual(len(native["outputs"]), len(compact["outputs"]))
        for i, (a, b) in enumerate(zip(native["outputs"], compact["outputs"])):
            self.assertEqual(a.shape, b.shape, "output %d" % i)
            self.assertTrue(torch.equal(a, b), "%s: output %d differs under policy:compact"
                            % (case, i))
        ours = compact["info"]["max_memory_reserved"]
        theirs = expandable["info"]["max_memory_reserved"]
        print("%s: peak reserved, policy:compact %d, PyTorch expandable %d, PyTorch %d"
              % (case, ours, theirs, native["info"]["max_memory_reserved"]))
        self.assertLess(ours, theirs, "%s: policy:compact reserved more than PyTorch's "
                        "expandable segments" % case)
        return compact

    def test_mlp_capture_and_replay(self):
        self.compare("mlp")

    def test_gpt2_forward_capture_and_replay(self):
        self.compare("gpt2")

    def test_make_graphed_callables(self):
        self.compare("graphed_callables")

    def test_compile_reduce_overhead_20_steps(self):
        compact = self.compare("compile")
        self.assertGreater(compact["info"]["pool_calls"]["checkpoint"], 0,
                           "cudagraph trees took no checkpoint")

    def test_mempool_and_use_mem_pool(self):
        compact = run_case("mempool", "reservoir-compact")[0]
        self.assertEqual(compact["info"]["static_sum"], 1024.0)
        self.assertEqual(compact["info"]["private_pools_after_release"], 0)


@needs_torch_cuda
class GraphPoolObservability(unittest.TestCase):
    def test_snapshot_after_capture_shows_the_graph_pool_and_opens_in_memory_viz(self):
        import pickle

        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "graph.pickle")
            ours, _ = run_case("mlp", "reservoir", snapshot=path)
            info = ours["info"]
            self.assertGreater(info["segment_plot_chars"], 1000)
            self.assertGreater(info["trace_plot_chars"], 1000)
            with open(path, "rb") as f:
                snapshot = pickle.load(f)
            pools = {tuple(s["segment_pool_id"]) for s in snapshot["segments"]}
            self.assertTrue(pools - {(0, 0)}, "the dumped snapshot names no graph pool")
            viz = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "segment_plot",
                                  path, "-o", os.path.join(folder, "segments.html")],
                                 capture_output=True, text=True, timeout=300)
            self.assertEqual(viz.returncode, 0, viz.stderr[-4000:])

    def test_mempool_and_use_mem_pool(self):
        ours, _ = run_case("mempool", "reservoir")
        info = ours["info"]
        self.assertEqual(info["static_sum"], 1024.0)
        self.assertGreaterEqual(info["private_pools"], 1)
        self.assertGreater(info["private_reserved"], 0)
        self.assertEqual(info["private_pools_after_release"], 0)


if __name__ == "__main__":
    unittest.main()
