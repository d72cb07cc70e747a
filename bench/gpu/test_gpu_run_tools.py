#!/usr/bin/env python3
"""CPU checks of the GPU runs' tools (scripts/gpu/): tools/trace_stats.py,
bench/gpu/gpu_truth.py without a GPU, the workloads' command lines, the scripts' syntax
and their dry runs.

    python3 bench/gpu/test_gpu_run_tools.py BUILD_DIR     (CTest: gpu_run_tools)
"""

import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = None  # set from argv
TRACE = ("# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM\n"
         "a,0,30000000,0\na,1,1000,0\na,2,50000000,1\nu,2,0\nf,0\na,3,30000000,0\n"
         "f,2\ns,0\na,4,60000000,1\nf,1\n")


def run(*cmd, **kw):
    return subprocess.run(list(cmd), capture_output=True, text=True, **kw)


class ToolsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.plain = os.path.join(self.dir.name, "small.trace")
        self.gz = os.path.join(self.dir.name, "small.trace.gz")
        with open(self.plain, "w") as f:
            f.write(TRACE)
        with gzip.open(self.gz, "wt") as f:
            f.write(TRACE)

    def tearDown(self):
        self.dir.cleanup()

    def test_trace_stats_counts_every_kind(self):
        for path in (self.plain, self.gz):
            p = run(sys.executable, os.path.join(REPO, "tools", "trace_stats.py"), "--json", path)
            self.assertEqual(p.returncode, 0, p.stderr)
            s = json.loads(p.stdout)
            self.assertEqual((s["events"], s["allocations"], s["frees"], s["uses"],
                              s["host_waits"], s["streams"], s["live_at_end"]),
                             (10, 5, 3, 1, 1, 2, 2))
            # Live bytes peak at the last alloc: 1000 + 30e6 (ID 3) + 60e6 (ID 4).
            self.assertEqual(s["peak_live_bytes"], 90001000)
            self.assertEqual(s["bytes_requested"], 170001000)

    def test_trace_stats_counts_tags_sleeps_and_wakes(self):
        """Trace v2: a sleeping tag's bytes leave the live peak; its lines are counted."""
        v2 = os.path.join(self.dir.name, "v2.trace")
        with open(v2, "w") as f:
            f.write("n,1,weights\na,0,100,0,1\nz,1,offload\na,1,50,0\nf,1\nc\n"
                    "w,1,2\nf,0\n")
        p = run(sys.executable, os.path.join(REPO, "tools", "trace_stats.py"), "--json", v2)
        self.assertEqual(p.returncode, 0, p.stderr)
        s = json.loads(p.stdout)
        self.assertEqual((s["events"], s["tags"], s["sleeps"], s["wakes"], s["empty_caches"],
                          s["streams"], s["peak_live_bytes"]), (7, 1, 1, 1, 1, 2, 100))
        with open(v2, "w") as f:
            f.write("n,1,weights\na,0,100,0,1\nz,1,offload\na,1,50,0,1\n")
        p = run(sys.executable, os.path.join(REPO, "tools", "trace_stats.py"), v2)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{v2}:4: allocation under a sleeping tag", p.stderr)

    def test_trace_stats_names_the_bad_line(self):
        bad = os.path.join(self.dir.name, "bad.trace")
        with open(bad, "w") as f:
            f.write("a,0,10,0\nf,7\n")
        p = run(sys.executable, os.path.join(REPO, "tools", "trace_stats.py"), bad)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{bad}:2: free of ID 7, which is not live", p.stderr)

    def test_gpu_truth_without_gpu_matches_reservoir_replay(self):
        out = os.path.join(self.dir.name, "truth.json")
        settings = ["", "max_split_size_mb:40"]
        p = run(sys.executable, os.path.join(REPO, "bench", "gpu", "gpu_truth.py"), "--build",
                BUILD, "--out", out, "--no-gpu", "--settings", *settings, "--", self.gz)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        with open(out) as f:
            doc = json.load(f)
        self.assertEqual(doc["schema"], "reservoir gpu truth v1")
        self.assertEqual(doc["failed_steps"], 0)
        t = doc["traces"]["small"]
        self.assertEqual((t["events"], t["streams"]), (10, 2))
        replay = os.path.join(BUILD, "tools", "replay", "reservoir-replay")
        for s in settings:
            ref = json.loads(run(replay, self.gz, "--config", s, "--json").stdout)[0]
            self.assertEqual(t["settings"][s]["reservoir_sim"]["peak_reserved"],
                             ref["peak_reserved"], s)
            self.assertNotIn("c10", t["settings"][s])

    def test_workloads_parse_their_arguments_without_torch(self):
        folder = os.path.join(REPO, "bench", "python", "workloads")
        scripts = sorted(f for f in os.listdir(folder) if f.endswith(".py") and f[0] != "_")
        self.assertEqual(scripts, ["compile_gpt2_train.py", "encoder_varbatch.py",
                                   "graph_decode.py", "infer_varbatch.py",
                                   "pipeline_multistream.py", "snapshot_capture.py",
                                   "textgen_varbatch.py", "threads_textgen.py"])
        for name in scripts:
            p = run(sys.executable, os.path.join(folder, name), "--help")
            self.assertEqual(p.returncode, 0, name + p.stderr)
            self.assertIn("usage:", p.stdout, name)
            if name != "snapshot_capture.py":
                self.assertIn("--steps", p.stdout, name)

    def test_scripts_are_valid_bash(self):
        gpu = os.path.join(REPO, "scripts", "gpu")
        names = [os.path.join(gpu, n) for n in sorted(os.listdir(gpu)) if n.endswith(".sh")]
        self.assertEqual([os.path.basename(n) for n in names],
                         ["bench.sh", "check.sh", "common.sh", "ipc.sh", "multi-gpu.sh",
                          "torch.sh", "truth.sh"])
        for name in names + [os.path.join(REPO, "scripts", "capture-traces.sh")]:
            p = run("bash", "-n", name)
            self.assertEqual(p.returncode, 0, name + p.stderr)

    def test_gpu_scripts_dry_run_every_part(self):
        # GPU_DRY_RUN=1 prints the build and each step instead of running them: every
        # part of every script is known, and an unknown one is refused (exit code 2).
        gpu = os.path.join(REPO, "scripts", "gpu")
        env = dict(os.environ, GPU_DRY_RUN="1")
        parts = {"check.sh": "tests memcheck examples",
                 "bench.sh": "default expandable driver-calls replay-calls threads-ab",
                 "truth.sh": "placement capture truth replays graphs async",
                 "torch.sh": "native memory-api graphs viewer cudnn train sources",
                 "ipc.sh": "pair memcheck cupy", "multi-gpu.sh": "ddp allreduce peer"}
        for name, every in parts.items():
            out = os.path.join(self.dir.name, name)
            p = run(os.path.join(gpu, name), out, *every.split(), env=env)
            self.assertEqual(p.returncode, 0, name + p.stdout + p.stderr)
            self.assertIn("[dry run]", p.stdout, name)
            self.assertTrue(p.stdout.rstrip().endswith(": ok"), name + p.stdout)
            p = run(os.path.join(gpu, name), out, "no-such-part", env=env)
            self.assertEqual(p.returncode, 2, name + p.stdout)
            self.assertIn("unknown part 'no-such-part'", p.stdout, name)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_gpu_run_tools.py BUILD_DIR")
    BUILD = sys.argv.pop(1)
    unittest.main()
