#!/usr/bin/env python3
"""End-to-end tests of the reservoir-replay executable: exit codes and messages for
every kind of bad input, JSON keys, the table, and the SVG plot.

    python3 test_replay_cli.py path/to/reservoir-replay
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

BINARY = None  # set from argv in __main__

KEYS = ["config", "events", "peak_requested", "peak_allocated", "peak_reserved", "ratio",
        "device_allocs", "device_frees", "device_time_us", "ooms", "ns_per_event"]

TRACE = """# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM
a,0,1048576,0
a,1,4096,0
a,2,33554432,1
u,0,1
f,1
s,1
f,0
a,3,2097152,0
f,2
f,3
"""


class ReplayCliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.trace = self.write("t.trace", TRACE)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_tool(self, *args):
        return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=300)

    def assert_error(self, result, message):
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(message, result.stderr)
        self.assertEqual(result.stdout, "")

    def test_help(self):
        r = self.run_tool("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: reservoir-replay TRACE", r.stdout)

    def test_usage_errors(self):
        self.assert_error(self.run_tool(), "no trace given")
        self.assert_error(self.run_tool(self.trace, "--bogus"), "unknown option '--bogus'")
        self.assert_error(self.run_tool(self.trace, "--capacity", "lots"), "not a byte count")
        self.assert_error(self.run_tool(self.trace, "--config"), "--config needs a value")

    def test_input_errors(self):
        missing = os.path.join(self.tmp.name, "missing.trace")
        self.assert_error(self.run_tool(missing), missing + ": no such file")
        bad = self.write("bad.trace", "# c\na,0,10,0\na,1,10\n")
        self.assert_error(self.run_tool(bad), bad + ":3: expected a,ID,SIZE,STREAM")
        self.assert_error(self.run_tool(self.trace, "--config", "", "--config", "bogus_key:1"),
                          "--config 'bogus_key:1'")

    def test_table(self):
        r = self.run_tool(self.trace, "--config", "", "--config", "max_split_size_mb:256")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("default", r.stdout)
        self.assertIn("max_split_size_mb:256", r.stdout)
        self.assertIn("peak reserved", r.stdout)
        # Peak requested: block 0 stays pending on stream 1 after its free (no later
        # s,1), so 1 MiB more than the live peak, as in PyTorch's statistics.
        self.assertIn("36,700,160", r.stdout)

    def test_json_keys_and_fit(self):
        r = self.run_tool(self.trace, "--json", "--config", "", "--config",
                          "max_split_size_mb:256")
        self.assertEqual(r.returncode, 0, r.stderr)
        data = json.loads(r.stdout)
        self.assertEqual([d["config"] for d in data], ["", "max_split_size_mb:256"])
        for d in data:
            self.assertEqual(list(d.keys()), KEYS)
            self.assertEqual(d["events"], 10)
            self.assertEqual(d["peak_requested"], 36700160)
            self.assertEqual(d["ooms"], 0)

        r = self.run_tool(self.trace, "--json", "--fit")
        self.assertEqual(r.returncode, 0, r.stderr)
        (d,) = json.loads(r.stdout)
        self.assertEqual(list(d.keys()), KEYS + ["fit_capacity", "fit_ratio"])
        self.assertGreaterEqual(d["fit_capacity"], d["peak_requested"])
        self.assertGreaterEqual(d["fit_ratio"], 1.0)

    def test_oom_is_a_result_not_an_error(self):
        r = self.run_tool(self.trace, "--json", "--capacity", "16MiB")
        self.assertEqual(r.returncode, 0, r.stderr)
        (d,) = json.loads(r.stdout)
        self.assertGreater(d["ooms"], 0)

    def test_plot(self):
        svg = os.path.join(self.tmp.name, "p.svg")
        r = self.run_tool(self.trace, "--plot", svg, "--config", "", "--config",
                          "expandable_segments:True")
        self.assertEqual(r.returncode, 0, r.stderr)
        root = ET.parse(svg).getroot()
        self.assertTrue(root.tag.endswith("svg"))
        text = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
        self.assertIn("t.trace", text)
        self.assertIn("memory (GiB)", text)
        self.assertIn("reserved (expandable_segments:True)", text)
        polylines = [e for e in root.iter() if e.tag.endswith("polyline")]
        self.assertEqual(len(polylines), 3)  # requested once + reserved per config

        # Checked before any replay: no output, exit 2.
        self.assert_error(self.run_tool(self.trace, "--plot", "/nonexistent-dir/p.svg"),
                          "cannot write plot '/nonexistent-dir/p.svg'")


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
