#!/usr/bin/env python3
"""CPU checks of train_bench.py's lockstep driver (run_lockstep): the steps of the
workers never overlap, step i is taken by every worker before any takes step i + 1,
the order rotates, a worker's own figures come back, and a failing worker is
reported with its output. The workers here are small Python processes that speak
the lockstep protocol (the training workers need PyTorch and a GPU; their GPU run
is scripts/gpu/torch.sh OUT train).

    python3 bench/python/test_train_bench_lockstep.py      (CTest: train_bench_lockstep)
"""

import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import train_bench  # noqa: E402

# A worker: "ready", then for each "step" sleeps a little, answers with its times, and
# at "end" writes every step's (start, end) to its --out file. Noise on stdout and
# stderr must not disturb the protocol.
WORKER = r'''
import json, sys, time
out = sys.argv[sys.argv.index("--out") + 1]
fail_at = int(sys.argv[sys.argv.index("--fail-at") + 1])
print("some library's banner")
print("LOCKSTEP ready", flush=True)
spans = []
for line in sys.stdin:
    if line.strip() == "end":
        break
    assert line.strip() == "step", line
    if len(spans) == fail_at:
        sys.stderr.write("worker broke at step %d\n" % fail_at)
        sys.exit(5)
    t0 = time.monotonic()
    time.sleep(0.004)
    t1 = time.monotonic()
    spans.append((t0, t1))
    print("LOCKSTEP " + json.dumps({"loss": 1.0, "time": t1 - t0, "gpu_time": 0.0}), flush=True)
with open(out, "w") as f:
    json.dump({"spans": spans, "step_times": [b - a for a, b in spans]}, f)
'''


class LockstepTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.script = os.path.join(self.dir.name, "worker.py")
        with open(self.script, "w") as f:
            f.write(WORKER)

    def tearDown(self):
        self.dir.cleanup()

    def spec(self, name, fail_at=-1):
        out = os.path.join(self.dir.name, name + ".json")
        return (name, [sys.executable, self.script, "--out", out, "--fail-at", str(fail_at)],
                dict(os.environ))

    def test_order_rotates_so_each_worker_takes_each_place_equally_often(self):
        names = ["a", "b", "c"]
        self.assertEqual(train_bench.lockstep_order(names, 0), ["a", "b", "c"])
        self.assertEqual(train_bench.lockstep_order(names, 1), ["b", "c", "a"])
        self.assertEqual(train_bench.lockstep_order(names, 5), ["c", "a", "b"])
        places = {n: [0, 0, 0] for n in names}
        for step in range(9):
            for place, name in enumerate(train_bench.lockstep_order(names, step)):
                places[name][place] += 1
        self.assertEqual(places, {n: [3, 3, 3] for n in names})

    def test_steps_alternate_and_never_overlap(self):
        steps = 6
        results = train_bench.run_lockstep([self.spec("a"), self.spec("b"), self.spec("c")],
                                           steps, timeout=60)
        self.assertEqual(sorted(results), ["a", "b", "c"])
        events = []  # (start, end, worker, step)
        for name, result in results.items():
            self.assertEqual(len(result["spans"]), steps)
            self.assertEqual(len(result["step_times"]), steps)
            for i, (t0, t1) in enumerate(result["spans"]):
                events.append((t0, t1, name, i))
        events.sort()
        # No two steps overlap: each worker waits, idle, while another steps.
        for (_, end, _, _), (start, _, _, _) in zip(events, events[1:]):
            self.assertLessEqual(end, start)
        # Every worker takes step i before any takes step i + 1, in the rotated order.
        self.assertEqual([step for _, _, _, step in events],
                         [i for i in range(steps) for _ in range(3)])
        for i in range(steps):
            order = [name for _, _, name, step in events if step == i]
            self.assertEqual(order, train_bench.lockstep_order(["a", "b", "c"], i))

    def test_a_failing_worker_is_reported_with_its_output(self):
        with self.assertRaises(RuntimeError) as caught:
            train_bench.run_lockstep([self.spec("a"), self.spec("b", fail_at=2)], 4, timeout=60)
        message = str(caught.exception)
        self.assertIn("lockstep worker b", message)
        self.assertIn("worker broke at step 2", message)


if __name__ == "__main__":
    unittest.main()
