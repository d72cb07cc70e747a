#!/usr/bin/env python3
"""End-to-end tests of the reservoir-replay executable: help and version, exit codes
and messages for every kind of bad input, standard input, JSON keys, the table and
its explanations, and the plots.

    python3 test_replay_cli.py path/to/reservoir-replay

CTest sets RESERVOIR_VERSION (project(VERSION)) and RESERVOIR_HAVE_CAIRO (1 when the
build writes PNG).
"""

import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

BINARY = None  # set from argv in __main__

KEYS = ["config", "events", "peak_requested", "peak_allocated", "peak_reserved", "ratio",
        "device_allocs", "device_frees", "device_time_us", "ooms", "ns_per_event"]
FIT_KEYS = ["fit_capacity", "fit_ratio", "fit_fraction"]
OPTIONS = ["--config", "--capacity", "--fit", "--json", "--plot", "--device", "--version",
           "--help"]


def shrinking_oversize_trace():
    """Oversize requests of ever smaller sizes, 30 MiB apart: under max_split_size_mb
    each takes a new segment, so reserved memory piles up."""
    lines = []
    for i in range(21):
        lines += ["a,%d,%d,0" % (i, (900 - 30 * i) << 20), "f,%d" % i]
    return "\n".join(lines) + "\n"

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

    def run_tool(self, *args, stdin=None):
        return subprocess.run([BINARY, *args], capture_output=True, text=stdin is None or
                              isinstance(stdin, str), input=stdin, timeout=300)

    def assert_error(self, result, message):
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(message, result.stderr)
        self.assertEqual(result.stdout, "")

    def test_help(self):
        r = self.run_tool("--help")
        self.assertEqual(r.returncode, 0)
        self.assertEqual(r.stdout.count("Usage: reservoir-replay [OPTIONS] TRACE\n"), 1)
        for option in OPTIONS:  # each documented once, at the start of its line
            lines = [l for l in r.stdout.splitlines()
                     if l.startswith("  ") and l[2] != " " and l.split()[0].endswith(option)]
            self.assertEqual(len(lines), 1, (option, r.stdout))
        self.assertTrue(all(len(l) <= 88 for l in r.stdout.splitlines()), r.stdout)

    def test_version(self):
        r = self.run_tool("--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "reservoir-replay %s\n" % os.environ["RESERVOIR_VERSION"])

    def test_usage_errors(self):
        self.assert_error(self.run_tool(), "no trace given")
        self.assert_error(self.run_tool(self.trace, "--bogus"), "unknown option '--bogus'")
        self.assert_error(self.run_tool(self.trace, "--capacity", "lots"), "not a byte count")
        self.assert_error(self.run_tool(self.trace, "--config"), "--config needs a value")

    def test_standard_input(self):
        plain = self.run_tool("-", "--json", stdin=TRACE)
        self.assertEqual(plain.returncode, 0, plain.stderr)
        packed = self.run_tool("--json", "-", stdin=gzip.compress(TRACE.encode()))
        self.assertEqual(packed.returncode, 0, packed.stderr)
        for r in (plain, packed):
            (d,) = json.loads(r.stdout)
            self.assertEqual(d["events"], 10)
            self.assertEqual(d["peak_requested"], 35651584)  # the device keeps up
        self.assert_error(self.run_tool("-", stdin="a,0,1,0\nf,9\n"), "<stdin>:2: free of ID 9")

    def test_damaged_gzip_is_reported_as_such(self):
        data = gzip.compress("".join("a,%d,512,0\n" % i for i in range(20000)).encode())
        cut = os.path.join(self.tmp.name, "cut.trace.gz")
        with open(cut, "wb") as f:
            f.write(data[: len(data) // 2])
        r = self.run_tool(cut)
        self.assert_error(r, cut + ": corrupt or truncated gzip data at line ")
        self.assertIn(": unexpected end of file", r.stderr)
        self.assertNotIn("expected a,ID,SIZE,STREAM", r.stderr)

    def test_empty_traces_are_refused(self):
        for name, text in (("empty.trace", ""), ("header.trace", TRACE.splitlines()[0] + "\n")):
            path = self.write(name, text)
            self.assert_error(self.run_tool(path), path + " has no events")
        waits = self.write("waits.trace", "s,0\ns,1\n")
        self.assert_error(self.run_tool(waits), waits + " has no allocations")

    def test_process_settings_are_refused(self):
        for config, flag in (("sim_capacity:8GiB", "--capacity"), ("device:cuda", "--device"),
                             ("record_trace:x.gz", "remove the key"),
                             ("oom_snapshot:x.pickle", "remove the key")):
            self.assert_error(self.run_tool(self.trace, "--config", config),
                              "--config '%s': " % config)
            self.assertIn(flag, self.run_tool(self.trace, "--config", config).stderr)
        self.assert_error(self.run_tool(self.trace, "--fit", "--config",
                                        "per_process_memory_fraction:0.5"), "--fit searches")
        r = self.run_tool(self.trace, "--json", "--config", "per_process_memory_fraction:0.5")
        self.assertEqual(r.returncode, 0, r.stderr)  # without --fit, a setting like any

    def test_a_tagged_trace_is_refused_where_tags_cannot_be(self):
        tagged = self.write("tagged.trace", "n,1,weights\na,0,1048576,0,1\nz,1,offload\n"
                                            "a,1,1048576,0\nf,1\nw,1\nf,0\n")
        r = self.run_tool(tagged, "--config", "", "--config", "backend:cudaMallocAsync")
        self.assert_error(r, "--config 'backend:cudaMallocAsync': the trace tags its memory "
                             "(1 sleeps), which this setting cannot: ")
        r = self.run_tool(tagged, "--config", "policy:compact", "--fit")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 allocations, 1 stream, 1 sleeps and 1 wakes of tags;", r.stdout)
        # A wake without room is named: 1 MiB asleep, its room taken under a 2 MiB device.
        full = self.write("full.trace", "n,1,weights\na,0,1048576,0,1\nz,1,offload\n"
                                        "a,1,2097152,0\nw,1\nf,1\nf,0\n")
        r = self.run_tool(full, "--capacity", "2MiB", "--config", "policy:compact")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(the wake of tag 'weights', 2.00 MiB asleep) failed", r.stdout)

    def test_streams_are_counted(self):
        sparse = self.write("sparse.trace", "a,0,4096,3\na,1,4096,65535\nf,0\nf,1\n")
        r = self.run_tool(sparse)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 allocations, 2 streams;", r.stdout)

    def test_oom_message_speaks_of_the_trace(self):
        t = self.write("s3.trace", "a,0,41943040,3\na,1,41943040,3\nf,0\nf,1\n")
        r = self.run_tool(t, "--capacity", "64MiB")
        self.assertEqual(r.returncode, 0, r.stderr)
        line = [l for l in r.stdout.splitlines() if l.startswith("first OOM under default: ")]
        self.assertEqual(len(line), 1, r.stdout)
        self.assertIn("event 1 (an allocation of 40.00 MiB on trace stream 3) failed", line[0])
        self.assertIn("--capacity", line[0])
        for foreign in ("0x", "RESERVOIR_ALLOC_CONF", "reservoir-replay --fit"):
            self.assertNotIn(foreign, line[0])

    def test_extreme_ratio_is_explained(self):
        t = self.write("shrink.trace", shrinking_oversize_trace())
        r = self.run_tool(t, "--config", "", "--config", "max_split_size_mb:256")
        self.assertEqual(r.returncode, 0, r.stderr)
        why = [l for l in r.stdout.splitlines() if l.startswith("why ")]
        self.assertEqual(len(why), 1, r.stdout)  # the default setting needs no explaining
        self.assertTrue(why[0].startswith("why max_split_size_mb:256 reserves "), why[0])
        self.assertIn("never split", why[0])
        self.assertIn("21 such segments", why[0])

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
        self.assertIn("35,651,584", r.stdout)

    def test_json_keys_and_fit(self):
        r = self.run_tool(self.trace, "--json", "--config", "", "--config",
                          "max_split_size_mb:256")
        self.assertEqual(r.returncode, 0, r.stderr)
        data = json.loads(r.stdout)
        self.assertEqual([d["config"] for d in data], ["", "max_split_size_mb:256"])
        for d in data:
            self.assertEqual(list(d.keys()), KEYS)
            self.assertEqual(d["events"], 10)
            self.assertEqual(d["peak_requested"], 35651584)
            self.assertEqual(d["ooms"], 0)
        # A lagging device keeps block 0 (used on stream 1 after its last host wait).
        r = self.run_tool(self.trace, "--json", "--device-lags")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)[0]["peak_requested"], 36700160)

        r = self.run_tool(self.trace, "--json", "--fit")
        self.assertEqual(r.returncode, 0, r.stderr)
        (d,) = json.loads(r.stdout)
        self.assertEqual(list(d.keys()), KEYS + FIT_KEYS)
        self.assertGreaterEqual(d["fit_capacity"], d["peak_requested"])
        self.assertGreaterEqual(d["fit_ratio"], 1.0)
        # The fit is a memory fraction of the device; its bytes do not depend on the
        # device's size (beyond the search's 1e-4 relative precision).
        small = json.loads(self.run_tool(self.trace, "--json", "--fit", "--capacity",
                                         "1GiB").stdout)[0]
        self.assertLess(abs(small["fit_capacity"] - d["fit_capacity"]), 2e-4 * d["fit_capacity"])
        # fit_capacity = fit_fraction * device total (JSON keeps 6 significant digits).
        self.assertAlmostEqual(small["fit_fraction"] * 2**30 / small["fit_capacity"], 1, delta=1e-5)

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
        text = [t.text or "" for t in root.iter() if t.tag.endswith("text")]
        self.assertIn("t.trace", " ".join(text))
        self.assertIn("MiB", text)  # a 36 MiB trace is drawn in MiB
        titles = [t for t in text if ": peak reserved " in t]
        self.assertEqual([t.split(":")[0] for t in titles], ["default", "expandable_segments"])
        polylines = [e for e in root.iter() if e.tag.endswith("polyline")]
        self.assertEqual(len(polylines), 4)  # one panel per config: requested and reserved

        # Checked before any replay: no output, exit 2.
        self.assert_error(self.run_tool(self.trace, "--plot", "/nonexistent-dir/p.svg"),
                          "cannot write plot '/nonexistent-dir/p.svg'")
        self.assert_error(self.run_tool(self.trace, "--plot", "p.jpg"),
                          "must end in .svg or .png")

    def test_png_plot(self):
        png = os.path.join(self.tmp.name, "p.png")
        r = self.run_tool(self.trace, "--plot", png)
        if os.environ.get("RESERVOIR_HAVE_CAIRO") != "1":
            self.assert_error(r, "install libcairo2-dev")
            self.assertNotIn("replaying", r.stderr)  # refused before the replay
            return
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(png, "rb") as f:
            head = f.read(24)
        self.assertEqual(head[:8], b"\x89PNG\r\n\x1a\n")
        width, height = struct.unpack(">II", head[16:24])
        self.assertEqual(width, 1000)
        self.assertGreater(height, 200)


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
