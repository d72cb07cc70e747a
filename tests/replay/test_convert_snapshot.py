#!/usr/bin/env python3
"""Tests of tools/convert_snapshot.py on small snapshot pickles built here, with the
structure torch.cuda.memory._snapshot() returns (no torch needed)."""

import collections
import gzip
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "convert_snapshot.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import convert_snapshot  # noqa: E402

S_DEFAULT = 0
S_SIDE = 0x55D0C0FFEE00  # a cudaStream_t value as PyTorch records it


def entry(action, addr, size, stream=S_DEFAULT):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": 1, "frames": [{"filename": "x.py", "line": 1, "name": "f"}]}


def device_entries():
    return [
        entry("segment_alloc", 0x7F0000000000, 20971520),
        entry("alloc", 0x7F0000000000, 1000),
        entry("alloc", 0x7F0000000400, 4096, S_SIDE),
        entry("free_requested", 0x7E0000000000, 512),  # allocated before recording
        entry("alloc", 0x7F0000200000, 2097152),
        entry("free_requested", 0x7F0000000000, 1000),
        entry("free_completed", 0x7F0000000000, 1000),
        entry("alloc", 0x7F0000000000, 768, S_SIDE),    # address reused: new ID
        entry("oom", 0, 1 << 40),
        entry("free_requested", 0x7F0000000400, 4096, S_SIDE),
        entry("snapshot", 0, 0),
        entry("segment_free", 0x7F0000000000, 20971520),
    ]


EXPECTED = ["a,0,1000,0", "a,1,4096,1", "a,2,2097152,0", "f,0", "a,3,768,1", "f,1"]


def snapshot(devices):
    return {"segments": [], "device_traces": devices}


def trace_lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [line.rstrip("\n") for line in f]


class ConvertTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write_pickle(self, obj, name="snap.pickle"):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            pickle.dump(obj, f)
        return path

    def run_tool(self, *args):
        return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)

    def test_convert_keeps_requests_only(self):
        lines, stats = convert_snapshot.convert(device_entries())
        self.assertEqual(lines, EXPECTED)
        self.assertEqual(stats.allocations, 4)
        self.assertEqual(stats.frees, 2)
        self.assertEqual(stats.unknown_frees, 1)
        self.assertEqual(stats.streams, 2)
        self.assertEqual(stats.live_at_end, 2)

    def test_lost_free_is_repaired(self):
        lines, stats = convert_snapshot.convert(
            [entry("alloc", 0x100, 10), entry("alloc", 0x100, 20)])
        self.assertEqual(lines, ["a,0,10,0", "f,0", "a,1,20,0"])
        self.assertEqual(stats.missed_frees, 1)

    def test_command_line_writes_gzip_and_plain(self):
        snap = self.write_pickle(snapshot([device_entries()]))
        for name in ("out.trace.gz", "out.trace"):
            out = os.path.join(self.dir, name)
            r = self.run_tool(snap, out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("4 allocations, 2 frees, 2 streams", r.stderr)
            self.assertIn("skipped 1 frees", r.stderr)
            lines = trace_lines(out)
            self.assertEqual(lines[0], convert_snapshot.HEADER)
            self.assertTrue(lines[1].startswith("# converted from"))
            self.assertEqual(lines[2:], EXPECTED)
        with open(os.path.join(self.dir, "out.trace.gz"), "rb") as f:
            self.assertEqual(f.read(2), b"\x1f\x8b")

    def test_output_is_reproducible(self):
        snap = self.write_pickle(snapshot([device_entries()]))
        outs = []
        for i in range(2):
            out = os.path.join(self.dir, f"r{i}.trace.gz")
            self.assertEqual(self.run_tool(snap, out).returncode, 0)
            with open(out, "rb") as f:
                outs.append(f.read())
        self.assertEqual(outs[0], outs[1])

    def test_gzipped_snapshot_is_read(self):
        path = os.path.join(self.dir, "snap.pickle.gz")
        with gzip.open(path, "wb") as f:
            pickle.dump(snapshot([device_entries()]), f)
        out = os.path.join(self.dir, "g.trace")
        self.assertEqual(self.run_tool(path, out).returncode, 0)
        self.assertEqual(trace_lines(out)[2:], EXPECTED)

    def test_device_selection(self):
        two = self.write_pickle(snapshot([device_entries(), [entry("alloc", 0x10, 5)]]))
        out = os.path.join(self.dir, "d.trace")
        r = self.run_tool(two, out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("choose one with --device", r.stderr)
        self.assertEqual(self.run_tool(two, out, "--device", "1").returncode, 0)
        self.assertEqual(trace_lines(out)[2:], ["a,0,5,0"])
        r = self.run_tool(two, out, "--device", "7")
        self.assertEqual(r.returncode, 2)
        self.assertIn("device 7 not in the snapshot", r.stderr)
        # Only device 1 recorded anything: it is chosen without --device.
        one = self.write_pickle(snapshot([[], [entry("alloc", 0x10, 5)]]), "one.pickle")
        self.assertEqual(self.run_tool(one, out).returncode, 0)

    def test_errors_exit_2_with_a_message(self):
        out = os.path.join(self.dir, "e.trace")
        r = self.run_tool(os.path.join(self.dir, "missing.pickle"), out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot read", r.stderr)

        not_pickle = os.path.join(self.dir, "text.pickle")
        with open(not_pickle, "w") as f:
            f.write("hello\n")
        r = self.run_tool(not_pickle, out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a pickle file", r.stderr)

        r = self.run_tool(self.write_pickle({"segments": []}, "nt.pickle"), out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no 'device_traces'", r.stderr)

        r = self.run_tool(self.write_pickle(snapshot([[]]), "empty.pickle"), out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no trace entries", r.stderr)

        bad = snapshot([[entry("alloc", 0x10, -3)]])
        r = self.run_tool(self.write_pickle(bad, "neg.pickle"), out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("is not a byte count", r.stderr)

    def test_pickles_naming_globals_are_refused(self):
        # Loading such a pickle could run code: the converter must not.
        evil = snapshot([[entry("alloc", 0x10, 5)]])
        evil["extra"] = collections.Counter("ab")
        r = self.run_tool(self.write_pickle(evil, "evil.pickle"), os.path.join(self.dir, "x"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("collections.Counter", r.stderr)


if __name__ == "__main__":
    unittest.main()
