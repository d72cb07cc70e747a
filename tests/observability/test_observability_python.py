"""The Python package's history, snapshot and metrics functions, on the simulated
device (RESERVOIR_ALLOC_CONF=device:sim, set by CTest)."""

import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import unittest

import reservoir

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_]\w*="[^"]*",?)+)\} (-?\d+)$')
COMMENT = re.compile(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* \S.*$")


class ObservabilityTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        reservoir.record_history(False)
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def test_snapshot_has_pytorchs_layout_and_the_history(self):
        reservoir.record_history(True, max_entries=1000)
        p = reservoir.raw_alloc(1 << 20, stream=3)
        q = reservoir.raw_alloc(512)
        reservoir.raw_free(p)
        reservoir.dump_snapshot(self.path("snap.pickle"))
        with open(self.path("snap.pickle"), "rb") as f:
            snap = pickle.load(f)
        self.assertEqual(
            set(snap), {"segments", "device_traces", "allocator_settings", "external_annotations"}
        )
        trace = snap["device_traces"][0]
        actions = [e["action"] for e in trace]
        for action in ("alloc", "free_requested", "free_completed", "segment_alloc", "snapshot"):
            self.assertIn(action, actions)
        freed = [e for e in trace if e["action"] == "free_completed"]
        self.assertEqual(freed[-1]["addr"], p)
        self.assertEqual(freed[-1]["size"], 1 << 20)
        blocks = [b for s in snap["segments"] for b in s["blocks"]]
        live = [b for b in blocks if b["state"] == "active_allocated"]
        self.assertIn(q, [b["address"] for b in live])
        self.assertEqual(sum(s["allocated_size"] for s in snap["segments"]),
                         reservoir.memory_allocated())
        checker = os.environ.get("RESERVOIR_CHECK_SNAPSHOT")
        if checker:
            subprocess.run([sys.executable, checker, self.path("snap.pickle")], check=True,
                           stdout=subprocess.DEVNULL)
        reservoir.raw_free(q)

    def test_disabling_history_clears_it(self):
        reservoir.record_history(True)
        reservoir.raw_free(reservoir.raw_alloc(4096))
        reservoir.record_history(False)
        reservoir.dump_snapshot(self.path("off.pickle"))
        with open(self.path("off.pickle"), "rb") as f:
            snap = pickle.load(f)
        self.assertEqual([t for t in snap["device_traces"] if t], [])

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            reservoir.record_history(True, max_entries=0)
        with self.assertRaises(reservoir.ReservoirError) as caught:
            reservoir.dump_snapshot("/nonexistent-dir/snap.pickle")
        self.assertIn("/nonexistent-dir/snap.pickle", str(caught.exception))

    def test_metrics_text_is_prometheus_exposition(self):
        p = reservoir.raw_alloc(3 << 20)
        text = reservoir.metrics()
        values = {}
        for line in text.splitlines():
            if line.startswith("#"):
                self.assertRegex(line, COMMENT)
                continue
            m = SAMPLE.match(line)
            self.assertIsNotNone(m, line)
            values[m.group(1) + "{" + m.group(2) + "}"] = int(m.group(3))
        stats = reservoir.memory_stats()
        self.assertEqual(values['reservoir_allocated_bytes{device="0",pool="all"}'],
                         stats["allocated_bytes.all.current"])
        self.assertEqual(values['reservoir_reserved_bytes_peak{device="0",pool="large"}'],
                         stats["reserved_bytes.large_pool.peak"])
        self.assertEqual(values['reservoir_device_allocs_total{device="0"}'],
                         stats["num_device_alloc"])
        self.assertIn('reservoir_largest_cached_block_bytes{device="0"}', values)
        reservoir.raw_free(p)

    def test_metrics_json(self):
        data = json.loads(reservoir.metrics_json())
        device = data["devices"][0]
        self.assertEqual(device["device"], 0)
        stats = reservoir.memory_stats()
        self.assertEqual(device["stats"]["reserved_bytes"]["all"]["current"],
                         stats["reserved_bytes.all.current"])
        self.assertEqual(device["num_ooms"], stats["num_ooms"])
        self.assertEqual(set(device["reserved_unallocated_bytes"]), {"all", "small", "large"})


if __name__ == "__main__":
    unittest.main()
