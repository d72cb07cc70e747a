"""torch.cuda's memory API, out-of-memory errors and trace capture under Reservoir,
on a GPU (skipped without PyTorch and a CUDA device). Each case is a fresh
interpreter: Reservoir is installed before CUDA is initialized.

    python3 -m pytest -v tests/python/gpu/test_torch_memory_api.py
    python3 -m unittest discover -s tests/python/gpu -p 'test_torch_memory_api.py' -v
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from test_torch_cupy_gpu import HAVE_CUDA, run_python  # noqa: E402

needs_torch_cuda = unittest.skipUnless(HAVE_CUDA, "needs PyTorch and a CUDA device")


def run(code, timeout=600):
    proc = run_python(textwrap.dedent(code), timeout=timeout)
    return proc


def replay_tool():
    explicit = os.environ.get("RESERVOIR_REPLAY")
    if explicit:
        return explicit
    found = glob.glob(os.path.join(REPO, "build*", "**", "reservoir-replay"), recursive=True)
    found = [p for p in found if os.access(p, os.X_OK) and os.path.isfile(p)]
    found.sort(key=os.path.getmtime, reverse=True)
    return found[0] if found else None


@needs_torch_cuda
class MemoryApiTest(unittest.TestCase):
    def test_every_function_answers_with_reservoirs_figures(self):
        proc = run(
            """
            import warnings
            import reservoir, reservoir.torch as rt
            rt.install()
            import torch
            from torch.cuda import memory_allocated as imported_before  # bound after install
            dev = torch.cuda.current_device()
            x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
            y = torch.empty(1000, dtype=torch.float32, device="cuda")
            torch.cuda.synchronize()
            ours = reservoir.memory_stats(dev)
            flat = torch.cuda.memory_stats()
            assert dict(flat) == ours, set(flat.items()) ^ set(ours.items())
            assert torch.cuda.memory.memory_stats(dev) == flat
            nested = torch.cuda.memory_stats_as_nested_dict()
            assert nested["allocated_bytes"]["all"]["current"] == ours["allocated_bytes.all.current"]
            for device in (None, dev, "cuda:%d" % dev, torch.device("cuda", dev), torch.device("cuda")):
                assert torch.cuda.memory_allocated(device) == ours["allocated_bytes.all.current"]
                assert torch.cuda.max_memory_allocated(device) == ours["allocated_bytes.all.peak"]
                assert torch.cuda.memory_reserved(device) == ours["reserved_bytes.all.current"]
                assert torch.cuda.max_memory_reserved(device) == ours["reserved_bytes.all.peak"]
            assert imported_before() == ours["allocated_bytes.all.current"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                assert torch.cuda.memory_cached() == ours["reserved_bytes.all.current"]
            # PyTorch formats the summary from memory_stats(), which answers Reservoir's.
            summary = torch.cuda.memory_summary()
            assert "Allocated memory" in summary, summary
            del y
            torch.cuda.reset_peak_memory_stats()
            after = reservoir.memory_stats(dev)
            assert after["allocated_bytes.all.peak"] == after["allocated_bytes.all.current"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                torch.cuda.reset_max_memory_allocated()
                torch.cuda.reset_max_memory_cached()
            torch.cuda.reset_accumulated_memory_stats()
            assert reservoir.memory_stats(dev)["allocation.all.allocated"] == 0
            # torch.accelerator (PyTorch >= 2.6)
            acc = getattr(torch, "accelerator", None)
            if acc is not None and hasattr(acc, "memory_allocated"):
                assert acc.memory_allocated() == reservoir.memory_allocated(dev)
                assert acc.max_memory_reserved() == reservoir.max_memory_reserved(dev)
                assert dict(acc.memory_stats()) == reservoir.memory_stats(dev)
                acc.reset_peak_memory_stats()
                acc.reset_accumulated_memory_stats()
                print("accelerator ok")
            # Snapshots and history
            torch.cuda.memory._record_memory_history(max_entries=1000)
            z = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
            snap = torch.cuda.memory._snapshot()
            addresses = [b["address"] for s in snap["segments"] for b in s["blocks"]]
            assert z.data_ptr() in addresses
            assert any(e["action"] == "alloc" for e in snap["device_traces"][dev])
            segments = torch.cuda.memory_snapshot()
            assert len(segments) == len(snap["segments"])
            import os, tempfile, pickle
            path = os.path.join(tempfile.mkdtemp(), "s.pickle")
            torch.cuda.memory._dump_snapshot(path)
            with open(path, "rb") as f:
                assert pickle.load(f)["segments"]
            torch.cuda.memory._record_memory_history(enabled=None)
            # Fraction, empty_cache, raw alloc/free
            torch.cuda.set_per_process_memory_fraction(0.5)
            assert torch.cuda.get_per_process_memory_fraction() == 0.5
            torch.cuda.set_per_process_memory_fraction(1.0)
            p = torch.cuda.caching_allocator_alloc(1 << 20)
            assert reservoir.base_allocation(p)[0] != 0
            torch.cuda.caching_allocator_delete(p)
            del x, z
            torch.cuda.empty_cache()
            assert torch.cuda.memory_reserved() == reservoir.memory_reserved(dev)
            print(torch.cuda.list_gpu_processes()[:40].replace(chr(10), " "))
            reservoir.validate()
            print("patched", sorted(rt.memory_api_patched()["entry_points"]))
            print("done")
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("done", proc.stdout)
        self.assertIn("_cuda_memoryStats", proc.stdout)

    def test_trainer_style_loop_logs_peak_memory_each_step(self):
        proc = run(
            """
            import reservoir, reservoir.torch as rt
            rt.install()
            import torch
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            log = []
            for step in range(8):
                torch.cuda.reset_peak_memory_stats()
                batch = torch.randn(64 * (1 + step % 3), 512, device="cuda")
                loss = model(batch).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                log.append({"step": step, "loss": loss.item(),
                            "max_memory_allocated": torch.cuda.max_memory_allocated(),
                            "memory_reserved": torch.cuda.memory_reserved()})
            assert all(e["max_memory_allocated"] > 0 for e in log), log
            assert log[2]["max_memory_allocated"] > log[0]["max_memory_allocated"], log
            print("log", log[-1])
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("log", proc.stdout)

    def test_out_of_memory_is_torch_cuda_out_of_memory_error(self):
        proc = run(
            """
            import reservoir, reservoir.torch as rt
            rt.install()
            import torch
            print("type", rt.memory_api_patched()["out_of_memory"])
            total = torch.cuda.get_device_properties(0).total_memory
            try:
                torch.empty(total + (2 << 30), dtype=torch.uint8, device="cuda")
            except torch.cuda.OutOfMemoryError as e:
                text = str(e)
                print("caught", type(e).__name__)
                assert text.startswith("CUDA out of memory. Tried to allocate "), text[:300]
                assert " has a total capacity of " in text and " is free. " in text, text[:300]
                assert "Reservoir (cuda device 0): the request of " in text, text[:600]
                assert "Including non-PyTorch memory, this process has " in text, text[:600]
            else:
                raise SystemExit("no error")
            try:
                torch.empty(1 << 61, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as e:
                assert str(e).startswith("CUDA out of memory. Tried to allocate more than 1EB memory."), str(e)[:200]
                print("caught 1EB")
            x = torch.ones(10, device="cuda")  # still working
            assert x.sum().item() == 10
            print(torch.cuda.memory_stats()["num_ooms"])
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("type torch.cuda.OutOfMemoryError", proc.stdout)
        self.assertIn("caught OutOfMemoryError", proc.stdout)
        self.assertIn("caught 1EB", proc.stdout)


@needs_torch_cuda
class CudnnBenchmarkTest(unittest.TestCase):
    def test_cache_info_lets_cudnn_benchmark_run(self):
        proc = run(
            """
            import reservoir, reservoir.torch as rt
            rt.install()
            import torch
            status = rt.native_status()
            assert status["active"], status
            torch.backends.cudnn.benchmark = True
            conv = torch.nn.Conv2d(64, 128, 3, padding=1).cuda()
            x = torch.randn(16, 64, 56, 56, device="cuda", requires_grad=True)
            conv(x).sum().backward()  # the benchmark searches forward and backward
            torch.cuda.synchronize()
            del x
            torch.cuda.empty_cache()
            kept = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            del kept  # a 64 MiB block cached
            largest = reservoir.largest_cached_block(torch.cuda.current_device())
            assert largest >= 64 << 20, largest
            print("cudnn benchmark ok; largest cached", largest)
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("cudnn benchmark ok", proc.stdout)


@needs_torch_cuda
class CachingAllocatorEnableTest(unittest.TestCase):
    def test_disabled_requests_go_straight_to_the_device_uncounted(self):
        # PyTorch's meaning of torch.cuda.caching_allocator_enable(False): cudaMalloc
        # and cudaFree, nothing in the statistics; a raw pointer from then is freed the
        # same way even after caching is on again.
        proc = run(
            """
            import reservoir, reservoir.torch as rt
            rt.install()
            import torch
            assert rt.native_status()["active"], rt.native_status()
            dev = torch.cuda.current_device()
            stream = torch.cuda.current_stream().cuda_stream
            def requested():
                return torch.cuda.memory_stats()["requested_bytes.all.allocated"]
            torch.cuda.caching_allocator_enable(False)
            before, reserved = requested(), reservoir.memory_stats(dev)["reserved_bytes.all.current"]
            raw = torch._C._cuda_cudaCachingAllocator_raw_alloc(1 << 20, stream)
            t = torch.ones(1 << 18, device="cuda")
            assert requested() == before, (requested(), before)
            assert reservoir.memory_stats(dev)["reserved_bytes.all.current"] == reserved
            assert float(t.sum()) == float(1 << 18)
            del t
            torch.cuda.caching_allocator_enable(True)
            torch._C._cuda_cudaCachingAllocator_raw_delete(raw)  # cudaFree, not Reservoir
            raw = torch._C._cuda_cudaCachingAllocator_raw_alloc(1 << 20, stream)
            assert requested() == before + (1 << 20), (requested(), before)
            torch._C._cuda_cudaCachingAllocator_raw_delete(raw)
            reservoir.validate()
            print("caching enable ok")
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("caching enable ok", proc.stdout)


@needs_torch_cuda
class MemoryHistoryTest(unittest.TestCase):
    def test_history_has_pytorchs_frames_and_the_profiler_sees_memory(self):
        # The native part's recordHistory: PyTorch's context recorder gives each trace
        # entry and live block the Python frames of the call that made it; skip_actions
        # leaves those actions out; the profiler's memory events come from the
        # allocation and free paths.
        proc = run(
            """
            import reservoir, reservoir.torch as rt
            rt.install()
            import torch
            assert rt.native_status()["active"], rt.native_status()
            def make_weights():
                return torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
            torch.cuda.memory._record_memory_history(max_entries=1000, context="all",
                                                     stacks="python")
            assert torch._C._cuda_isHistoryEnabled()
            w = make_weights()
            t = torch.empty(1000, device="cuda")
            del t
            snap = torch.cuda.memory._snapshot()
            trace = snap["device_traces"][torch.cuda.current_device()]
            actions = [e["action"] for e in trace]
            assert "alloc" in actions and "free_requested" in actions, actions
            alloc = next(e for e in trace if e["action"] == "alloc" and e["size"] == 5 << 20)
            names = [f["name"] for f in alloc["frames"]]
            assert "make_weights" in names, names
            block = next(b for s in snap["segments"] for b in s["blocks"]
                         if b["state"] == "active_allocated" and b["size"] == 5 << 20)
            assert "make_weights" in [f["name"] for f in block["frames"]], block
            torch.cuda.memory._record_memory_history(enabled=None)
            torch.cuda.memory._record_memory_history(max_entries=1000, context="all",
                                                     stacks="python",
                                                     skip_actions=["free_requested"])
            t = torch.empty(1000, device="cuda")
            del t
            actions = [e["action"] for e in torch.cuda.memory._snapshot()["device_traces"][0]]
            assert "alloc" in actions and "free_requested" not in actions, actions
            torch.cuda.memory._record_memory_history(enabled=None)
            assert not torch._C._cuda_isHistoryEnabled()
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                         profile_memory=True) as prof:
                y = torch.ones(1 << 20, device="cuda") * 2
                del y
            events = [e for e in prof.events() if e.device_memory_usage != 0]
            assert any(e.device_memory_usage == 4 << 20 for e in events), \\
                [(e.name, e.device_memory_usage) for e in events]
            reservoir.validate()
            print("history ok", len(trace), len(events))
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("history ok", proc.stdout)


@needs_torch_cuda
class CaptureTest(unittest.TestCase):
    SCRIPT = textwrap.dedent(
        """
        import json, sys, torch, reservoir
        torch.manual_seed(0)
        side = torch.cuda.Stream()
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(6):
            x = torch.randn(128 * (1 + step % 3), 1024, device="cuda")
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.cuda.stream(side):
                y = x * 2
            x.record_stream(side)
            del x, y
            side.synchronize()
            torch.cuda.synchronize()
        dev = torch.cuda.current_device()
        s = reservoir.memory_stats(dev)
        json.dump({"requested": s["requested_bytes.all.peak"],
                   "allocated": s["allocated_bytes.all.peak"],
                   "reserved": s["reserved_bytes.all.peak"]}, open(sys.argv[1], "w"))
        """
    )

    def test_captured_trace_replays_to_the_live_peaks(self):
        tool = replay_tool()
        if tool is None:
            self.skipTest("reservoir-replay not built (set RESERVOIR_REPLAY)")
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "train.py")
            with open(script, "w") as f:
                f.write(self.SCRIPT)
            trace = os.path.join(tmp, "run.trace.gz")
            live_json = os.path.join(tmp, "live.json")
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (os.path.join(REPO, "python"), env.get("PYTHONPATH")) if p)
            proc = subprocess.run(
                [sys.executable, "-m", "reservoir.capture", "--out", trace, script, live_json],
                env=env, capture_output=True, text=True, timeout=600)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            with open(live_json) as f:
                live = json.load(f)
            replay = subprocess.run([tool, trace, "--json", "--capacity", "141GiB"],
                                    capture_output=True, text=True, timeout=600)
            self.assertEqual(replay.returncode, 0, replay.stderr)
            replayed = json.loads(replay.stdout)[0]
            import gzip
            with gzip.open(trace, "rt") as f:
                lines = f.read().splitlines()
            self.assertTrue(any(line.startswith("s,") for line in lines), "no host waits")
            self.assertTrue(any(line.startswith("u,") for line in lines), "no record_stream")
            print("live", live, "replayed", {k: replayed[k] for k in
                                             ("peak_requested", "peak_allocated", "peak_reserved")})
            self.assertEqual(replayed["peak_requested"], live["requested"])
            self.assertEqual(replayed["peak_allocated"], live["allocated"])
            self.assertLessEqual(replayed["peak_reserved"], live["reserved"] * 1.1)


if __name__ == "__main__":
    unittest.main()
