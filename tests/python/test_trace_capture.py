"""Trace capture from Python, on the simulated device: the trace is complete however
the interpreter ends (it was once 0 bytes: the recorder was never closed), the
record_trace context manager, reservoir.notify_host_wait, and
``python3 -m reservoir.capture``.

Each case runs a fresh interpreter: the process-wide allocator and its recorder
live until the process ends.
"""

import gzip
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from test_reservoir_package import reservoir, run_python


def read_trace(path):
    """The trace's lines (header first); gzip.open reads concatenated members."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read().splitlines()


def count(lines, tag):
    return sum(1 for line in lines if line.startswith(tag + ","))


# 20000 allocations (several recorder buffers) on two streams, all but every 64th
# freed at once (few live blocks: cheap under the full-check validator), with a
# host wait on stream 7 every 100.
ALLOCATE = textwrap.dedent(
    """
    import reservoir
    kept = []
    for i in range(20000):
        p = reservoir.raw_alloc(512 + 64 * (i % 32), stream=7 if i % 2 else 0)
        if i % 64 == 0:
            kept.append(p)
        else:
            reservoir.raw_free(p)
        if i % 100 == 0:
            reservoir.notify_host_wait(7)
    """
)


class InterpreterEndsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def record(self, ending, name="run.trace.gz"):
        path = os.path.join(self.dir.name, name)
        result = run_python(
            ALLOCATE + ending, RESERVOIR_ALLOC_CONF="device:sim,record_trace:" + path
        )
        return result, path

    def check_complete(self, path):
        lines = read_trace(path)
        self.assertTrue(lines[0].startswith("# trace v2"), lines[:1])
        self.assertEqual(count(lines, "a"), 20000)
        self.assertEqual(count(lines, "f"), 20000 - 313)
        self.assertEqual(count(lines, "s"), 200)
        self.assertIn("s,1", lines)  # stream 7 was the second stream seen

    def test_normal_end(self):
        result, path = self.record("")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.check_complete(path)

    def test_plain_text_trace(self):
        result, path = self.record("", name="run.trace")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.check_complete(path)

    def test_sys_exit_with_status(self):
        result, path = self.record("import sys; sys.exit(3)\n")
        self.assertEqual(result.returncode, 3, result.stderr)
        self.check_complete(path)

    def test_uncaught_exception(self):
        result, path = self.record("raise RuntimeError('boom')\n")
        self.assertEqual(result.returncode, 1)
        self.assertIn("boom", result.stderr)
        self.check_complete(path)

    @unittest.skipUnless(hasattr(os, "fork"), "needs os.fork")
    def test_fork_child_leaves_the_parent_trace_whole(self):
        result, path = self.record(
            "import os\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    q = reservoir.raw_alloc(1 << 20)\n"
            "    reservoir.raw_free(q)\n"
            "    raise SystemExit(0)  # runs the exit handlers in the child\n"
            "os.waitpid(pid, 0)\n"
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.check_complete(path)  # no child lines, no second gzip stream from it


class RecordTraceTest(unittest.TestCase):
    def test_context_manager_records_only_its_block(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "block.trace")
            before = reservoir.raw_alloc(4096)
            with reservoir.record_trace(path) as recorded:
                self.assertEqual(recorded, path)
                inside = reservoir.raw_alloc(8192, stream=3)
                reservoir.notify_host_wait(3)
                reservoir.raw_free(inside)
                reservoir.raw_free(before)  # allocated before: not recorded
            after = reservoir.raw_alloc(4096)
            reservoir.raw_free(after)
            self.assertEqual(read_trace(path)[1:], ["a,0,8192,0", "s,0", "f,0"])

    def test_tags_sleeps_wakes_and_empty_cache_are_recorded(self):
        """Trace v2: a request's tag, sleep and wake (on a stream too) and empty_cache,
        each in its place among the requests."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tags.trace")
            with reservoir.record_trace(path):
                with reservoir.tag("capture-weights"):
                    w = reservoir.raw_alloc(1 << 20)
                plain = reservoir.raw_alloc(4096)
                reservoir.sleep("capture-weights", "offload")
                reservoir.raw_free(plain)
                reservoir.empty_cache()
                reservoir.wake("capture-weights", stream=7)
                reservoir.sleep("capture-weights", "discard")
                reservoir.wake("capture-weights")
                reservoir.raw_free(w)
            self.assertEqual(
                read_trace(path)[1:],
                ["n,1,capture-weights", "a,0,1048576,0,1", "a,1,4096,0", "z,1,offload",
                 "f,1", "c", "w,1,1", "z,1,discard", "w,1", "f,0"],
            )

    def test_pools_captures_checkpoints_and_restores_are_recorded(self):
        """Trace v2's pool lines from Python (through the C API): a MemPool with its
        options, a capture on a stream, a thread's route, a checkpoint and a restore, the
        pool's releases; each request routed to its pool."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "pools.trace")
            with reservoir.record_trace(path):
                pool = reservoir.MemPool(use_on_oom=True)
                with reservoir.capture_to_pool(pool, stream=5):
                    a = reservoir.raw_alloc(1 << 20, stream=5)
                    b = reservoir.raw_alloc(4096, stream=6)  # not the capture's stream
                state = reservoir.checkpoint_pool(pool)
                with reservoir.use_mem_pool(pool):
                    c = reservoir.raw_alloc(8192, stream=5)
                freed, allocated = reservoir.restore_pool(state)
                self.assertEqual(sorted(freed), sorted([a, c]))
                self.assertEqual(allocated, [a])
                reservoir.raw_free(a)
                reservoir.raw_free(b)
                pool.release()
            lines = read_trace(path)[1:]
            self.assertEqual(
                lines,
                ["p,1,use_on_oom", "g,1,0", "a,0,1048576,0,0,1", "a,1,4096,1", "e,1", "x,1",
                 "k,1,1", "t,1", "a,2,8192,0,0,1", "e,1", "x,1", "r,1", "y,0", "y,2", "o,3,0",
                 "f,3", "f,1", "x,1"],
            )

    def test_exception_in_block_still_closes_the_trace(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "boom.trace.gz")
            with self.assertRaises(KeyError):
                with reservoir.record_trace(path):
                    reservoir.raw_free(reservoir.raw_alloc(100))
                    raise KeyError("boom")
            self.assertEqual(read_trace(path)[1:], ["a,0,100,0", "f,0"])

    def test_unwritable_path_is_an_io_error_and_the_allocator_works_on(self):
        with self.assertRaises(reservoir.ReservoirIoError) as caught:
            reservoir.start_trace_recording("/nonexistent-dir/x.trace.gz")
        self.assertIsInstance(caught.exception, OSError)
        self.assertEqual(caught.exception.status_name, "io")
        self.assertIn("/nonexistent-dir/x.trace.gz", str(caught.exception))
        self.assertIn("No such file or directory", str(caught.exception))
        reservoir.raw_free(reservoir.raw_alloc(4096))


class CaptureCommandTest(unittest.TestCase):
    def capture(self, *args, cwd=None):
        env = dict(os.environ)
        env["RESERVOIR_ALLOC_CONF"] = "device:sim"
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.dirname(reservoir.__file__)), env.get("PYTHONPATH", "")]
        )
        return subprocess.run(
            [sys.executable, "-m", "reservoir.capture"] + list(args),
            env=env, capture_output=True, text=True, timeout=120, cwd=cwd,
        )

    def test_runs_the_script_as_main_with_its_arguments(self):
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "work.py")
            with open(script, "w") as f:
                f.write(
                    "import sys, reservoir\n"
                    "assert __name__ == '__main__'\n"
                    "n = int(sys.argv[1])\n"
                    "print('argv', sys.argv[1:])\n"
                    "ps = [reservoir.raw_alloc(1024 * (i + 1), stream=5) for i in range(n)]\n"
                    "reservoir.notify_host_wait(5)\n"
                    "for p in ps: reservoir.raw_free(p)\n"
                    "sys.exit(int(sys.argv[2]))\n"
                )
            out = os.path.join(tmp, "cap.trace.gz")
            result = self.capture("--out", out, "--no-torch", script, "3", "4", "--flag")
            self.assertEqual(result.returncode, 4, result.stderr)
            self.assertIn("argv ['3', '4', '--flag']", result.stdout)
            self.assertIn("reservoir-replay " + out, result.stderr)
            self.assertEqual(
                read_trace(out)[1:],
                ["a,0,1024,0", "a,1,2048,0", "a,2,3072,0", "s,0", "f,0", "f,1", "f,2"],
            )

    def test_module_target_and_config(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "capmod.py"), "w") as f:
                f.write(
                    "import sys, reservoir\n"
                    "print('config', reservoir.config_string())\n"
                    "reservoir.raw_free(reservoir.raw_alloc(int(sys.argv[1])))\n"
                )
            out = os.path.join(tmp, "m.trace")
            result = self.capture("--out=" + out, "--config", "max_split_size_mb:64",
                                  "--no-torch", "-m", "capmod", "777", cwd=tmp)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("max_split_size_mb:64", result.stdout)
            self.assertEqual(read_trace(out)[1:], ["a,0,777,0", "f,0"])

    def assert_usage_error(self, result, text):
        """One line on stderr, "reservoir.capture: error: ...", exit status 2."""
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr.count("\n"), 1, result.stderr)
        self.assertTrue(result.stderr.startswith("reservoir.capture: error: "), result.stderr)
        self.assertIn(text, result.stderr)
        self.assertNotIn("Traceback", result.stderr)

    def test_help_goes_to_stdout_with_status_0(self):
        for flag in ("--help", "-h"):
            result = self.capture(flag)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertTrue(result.stdout.startswith("usage: python3 -m reservoir.capture"))
            self.assertIn("--no-torch", result.stdout)
            self.assertEqual(result.stderr, "")

    def test_usage_errors(self):
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "ok.py")
            with open(script, "w") as f:
                f.write("print('ran')\n")
            out = os.path.join(tmp, "x.trace")
            cases = (
                (("script.py",), "--out TRACE is required"),
                (("--out",), "--out needs a value"),
                (("--out", out), "no script to run"),
                (("--out", out, "--bogus", script), "unknown option --bogus"),
                (("--out", out, "-m"), "-m needs a module name"),
                (("--out", out, "/nonexistent/script.py"),
                 "cannot read script /nonexistent/script.py: No such file or directory"),
                (("--out", out, tmp), "can't find '__main__' module in " + tmp),
                (("--out", out, "--no-torch", "-m", "no_such_module_here"),
                 "No module named no_such_module_here"),
                (("--out", out, "--no-torch", "-m", "json.no_such_submodule"),
                 "No module named json.no_such_submodule"),
                (("--out", os.path.join(tmp, "missing", "x.trace"), "--no-torch", script),
                 "cannot open the trace file"),
                (("--out", out, "--no-torch", "--config", "bogus_key:1", script),
                 "unknown key 'bogus_key'"),
            )
            for args, text in cases:
                with self.subTest(args=args):
                    result = self.capture(*args)
                    self.assert_usage_error(result, text)
                    self.assertNotIn("ran", result.stdout)

    def test_a_failing_script_shows_its_own_traceback_and_status(self):
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "fails.py")
            with open(script, "w") as f:
                f.write("import reservoir\n"
                        "p = reservoir.raw_alloc(4096)\n"
                        "def step():\n"
                        "    raise KeyError('missing batch')\n"
                        "step()\n")
            out = os.path.join(tmp, "f.trace")
            result = self.capture("--out", out, "--no-torch", script)
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertIn("Traceback (most recent call last):\n  File \"%s\", line 5, "
                          "in <module>" % script, result.stderr)
            self.assertIn("KeyError: 'missing batch'", result.stderr)
            for runner in ("capture.py", "runpy", "reservoir.capture: error"):
                self.assertNotIn(runner, result.stderr)
            self.assertEqual(read_trace(out)[1:], ["a,0,4096,0"])
            with open(script, "w") as f:
                f.write("x = (\n")
            result = self.capture("--out", out, "--no-torch", script)
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertIn("SyntaxError", result.stderr)
            self.assertNotIn("runpy", result.stderr)

if __name__ == "__main__":
    unittest.main()
