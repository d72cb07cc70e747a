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
        self.assertTrue(lines[0].startswith("# trace v1"), lines[:1])
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

    def test_usage_errors(self):
        result = self.capture("script.py")
        self.assertEqual(result.returncode, 2)
        self.assertIn("--out TRACE is required", result.stderr)
        result = self.capture("--out", "x.trace", "--bogus", "script.py")
        self.assertEqual(result.returncode, 2)
        self.assertIn("unknown option --bogus", result.stderr)
        result = self.capture("--out", "x.trace", "/nonexistent/script.py")
        self.assertEqual(result.returncode, 2)
        self.assertIn("no such script", result.stderr)


if __name__ == "__main__":
    unittest.main()
