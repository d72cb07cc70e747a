"""Tagged memory from Python (reservoir.tag, sleep, wake, tag_state), on the simulated
device (CTest python_package; docs/sleep.md). The simulated device has no contents
unless host backed, which no configuration key selects: what offload keeps is counted
here (offloaded_bytes), not read back.

Tags are known to the whole process and cannot be dropped, and a sleeping tag keeps
its address ranges: so these tests run in a process of their own (one for the module,
see load_tests), where each makes its own names, and leave the other modules'
allocator as they found it.
"""

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if importlib.util.find_spec("reservoir") is None:
    sys.path.insert(0, os.path.join(_REPO, "python"))

import reservoir  # noqa: E402
from reservoir import _lib  # noqa: E402

MiB = 1 << 20
_names = itertools.count()


def fresh_tag():
    """A tag name no other test used (tags live as long as the process)."""
    return "py-test.%d:%d" % (os.getpid(), next(_names))


def tagged_alloc(name, size=MiB):
    with reservoir.tag(name):
        return reservoir.raw_alloc(size)


def no_scope_open():
    """Whether this thread has no tag scope open (pop_tag refuses then)."""
    return _lib.load().reservoir_pop_tag() == 3


class TagScopeTest(unittest.TestCase):
    def tearDown(self):
        reservoir.validate()

    def test_tagged_allocations_are_counted_under_the_tag(self):
        name = fresh_tag()
        before = reservoir.memory_allocated()
        ptr = tagged_alloc(name)
        state = reservoir.tag_state(name)
        self.assertEqual(state["name"], name)
        self.assertFalse(state["asleep"])
        self.assertIsNone(state["mode"])
        self.assertGreaterEqual(state["allocated_bytes"], MiB)
        self.assertGreaterEqual(state["reserved_bytes"], state["allocated_bytes"])
        self.assertEqual(state["asleep_bytes"], 0)
        self.assertEqual(state["offloaded_bytes"], 0)
        self.assertEqual(state["pools"], 1)
        self.assertEqual(sorted(state), sorted(("name", "asleep", "mode", "allocated_bytes",
                                                "reserved_bytes", "asleep_bytes",
                                                "offloaded_bytes", "pools")))
        self.assertEqual(reservoir.memory_allocated() - before, state["allocated_bytes"])
        reservoir.raw_free(ptr)
        self.assertEqual(reservoir.tag_state(name)["allocated_bytes"], 0)

    def test_requests_outside_the_scope_are_not_tagged(self):
        name = fresh_tag()
        with reservoir.tag(name) as entered:
            self.assertEqual(entered, name)
            inside = reservoir.raw_alloc(MiB)
        outside = reservoir.raw_alloc(MiB)
        self.assertTrue(no_scope_open())
        self.assertEqual(reservoir.tag_state(name)["allocated_bytes"], MiB)
        reservoir.raw_free(inside)
        reservoir.raw_free(outside)

    def test_scopes_nest(self):
        outer, inner = fresh_tag(), fresh_tag()
        with reservoir.tag(outer):
            with reservoir.tag(inner):
                a = reservoir.raw_alloc(MiB)
            b = reservoir.raw_alloc(2 * MiB)
        self.assertEqual(reservoir.tag_state(inner)["allocated_bytes"], MiB)
        self.assertEqual(reservoir.tag_state(outer)["allocated_bytes"], 2 * MiB)
        reservoir.raw_free(a)
        reservoir.raw_free(b)

    def test_the_scope_is_the_calling_threads(self):
        name = fresh_tag()
        other = []
        with reservoir.tag(name):
            thread = threading.Thread(target=lambda: other.append(reservoir.raw_alloc(MiB)))
            thread.start()
            thread.join()
        self.assertEqual(reservoir.tag_state(name)["allocated_bytes"], 0)
        reservoir.raw_free(other[0])

    def test_the_scope_pops_when_the_block_raises(self):
        name = fresh_tag()
        with self.assertRaises(KeyError):
            with reservoir.tag(name):
                raise KeyError("boom")
        self.assertTrue(no_scope_open())
        # Asleep, the tag refuses its requests: this one is not under it.
        reservoir.sleep(name, "discard")
        ptr = reservoir.raw_alloc(MiB)
        reservoir.raw_free(ptr)
        reservoir.wake(name)

    def test_tag_as_a_decorator(self):
        name = fresh_tag()

        @reservoir.tag(name)
        def allocate():
            return reservoir.raw_alloc(MiB)

        ptr = allocate()
        self.assertTrue(no_scope_open())
        self.assertEqual(reservoir.tag_state(name)["allocated_bytes"], MiB)
        reservoir.raw_free(ptr)

    def test_a_mem_pool_made_under_a_tag_carries_it(self):
        name = fresh_tag()
        with reservoir.tag(name):
            pool = reservoir.MemPool()
        self.assertEqual(reservoir.tag_state(name)["pools"], 2)
        with reservoir.use_mem_pool(pool):
            ptr = reservoir.raw_alloc(MiB)
        self.assertEqual(reservoir.tag_state(name)["allocated_bytes"], MiB)
        reservoir.sleep(name, "discard")
        self.assertEqual(reservoir.tag_state(name)["reserved_bytes"], 0)
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
            with reservoir.use_mem_pool(pool):
                reservoir.raw_alloc(MiB)
        self.assertIn("asleep", str(caught.exception))
        reservoir.wake(name)
        reservoir.raw_free(ptr)
        pool.release(empty_cache=True)
        self.assertEqual(reservoir.tag_state(name)["pools"], 1)


class SleepWakeTest(unittest.TestCase):
    def tearDown(self):
        reservoir.validate()

    def test_sleep_discard_gives_the_memory_back_and_wake_maps_it_again(self):
        name = fresh_tag()
        ptr = tagged_alloc(name)
        awake = reservoir.tag_state(name)
        reserved_before = reservoir.memory_reserved()
        reservoir.sleep(name, mode="discard")
        asleep = reservoir.tag_state(name)
        self.assertTrue(asleep["asleep"])
        self.assertEqual(asleep["mode"], "discard")
        self.assertEqual(asleep["reserved_bytes"], 0)
        self.assertEqual(asleep["asleep_bytes"], awake["reserved_bytes"])
        self.assertEqual(asleep["offloaded_bytes"], 0)
        self.assertEqual(asleep["allocated_bytes"], awake["allocated_bytes"])
        self.assertEqual(reservoir.memory_reserved(), reserved_before - awake["reserved_bytes"])
        reservoir.wake(name)
        woken = reservoir.tag_state(name)
        self.assertFalse(woken["asleep"])
        self.assertIsNone(woken["mode"])
        self.assertEqual(woken["reserved_bytes"], awake["reserved_bytes"])
        self.assertEqual(woken["asleep_bytes"], 0)
        self.assertEqual(reservoir.memory_reserved(), reserved_before)
        reservoir.raw_free(ptr)

    def test_memory_stats_and_the_summary_list_the_tag(self):
        name = fresh_tag()
        ptr = tagged_alloc(name, 3 * MiB)
        reservoir.sleep(name, "discard")
        stats = reservoir.memory_stats()
        self.assertEqual(stats["tags.%s.asleep" % name], 1)
        self.assertEqual(stats["tags.%s.allocated_bytes" % name], 3 * MiB)
        self.assertEqual(stats["tags.%s.reserved_bytes" % name], 0)
        self.assertGreater(stats["tags.%s.asleep_bytes" % name], 0)
        self.assertEqual(stats["tags.%s.offloaded_bytes" % name], 0)
        self.assertIn("Tag '%s'" % name, reservoir.memory_summary())
        reservoir.wake(name)
        self.assertEqual(reservoir.memory_stats()["tags.%s.asleep" % name], 0)
        reservoir.raw_free(ptr)
        reservoir.empty_cache()  # the tag's free memory goes back as any cache's
        self.assertEqual(reservoir.memory_stats()["tags.%s.reserved_bytes" % name], 0)

    def test_the_snapshot_names_the_tag_of_each_segment(self):
        import pickle

        name = fresh_tag()
        ptr = tagged_alloc(name, 3 * MiB)
        reservoir.sleep(name, "discard")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snapshot.pickle")
            reservoir.dump_snapshot(path)
            with open(path, "rb") as f:
                segments = pickle.load(f)["segments"]
        mine = [s for s in segments if s.get("tag") == name]
        self.assertTrue(mine)
        self.assertTrue(all(s["asleep"] for s in mine))
        self.assertEqual(sum(s["total_size"] for s in mine),
                         reservoir.tag_state(name)["asleep_bytes"])
        # Untagged segments keep PyTorch's keys only.
        self.assertTrue(all("asleep" not in s for s in segments if "tag" not in s))
        reservoir.wake(name)
        reservoir.raw_free(ptr)

    def test_sleep_offload_keeps_the_contents_in_host_memory(self):
        name = fresh_tag()
        ptr = tagged_alloc(name)
        reserved = reservoir.tag_state(name)["reserved_bytes"]
        reservoir.sleep(name)  # offload is the default
        state = reservoir.tag_state(name)
        self.assertEqual(state["mode"], "offload")
        self.assertEqual(state["offloaded_bytes"], reserved)
        self.assertEqual(state["asleep_bytes"], reserved)
        reservoir.wake(name)
        state = reservoir.tag_state(name)
        self.assertEqual(state["offloaded_bytes"], 0)
        self.assertEqual(state["reserved_bytes"], reserved)
        reservoir.raw_free(ptr)

    def test_a_wake_keeps_the_pinned_host_memory_for_the_next_offload(self):
        name = fresh_tag()
        ptr = tagged_alloc(name)
        reservoir.empty_host_cache()
        reservoir.sleep(name)
        offloaded = reservoir.tag_state(name)["offloaded_bytes"]
        self.assertEqual(reservoir.memory_stats()["host_kept_bytes"], 0)  # in use
        reservoir.wake(name)
        self.assertEqual(reservoir.memory_stats()["host_kept_bytes"], offloaded)
        self.assertIn("Pinned host memory kept for the next offload", reservoir.memory_summary())
        reservoir.sleep(name)  # takes it again
        self.assertEqual(reservoir.memory_stats()["host_kept_bytes"], 0)
        reservoir.wake(name)
        reservoir.empty_host_cache()
        self.assertEqual(reservoir.memory_stats()["host_kept_bytes"], 0)
        reservoir.raw_free(ptr)

    def test_wake_on_a_stream_keeps_the_host_copies_until_its_copies_are_done(self):
        name = fresh_tag()
        ptr = tagged_alloc(name)
        reserved = reservoir.tag_state(name)["reserved_bytes"]
        reservoir.sleep(name)
        reservoir.wake(name, stream=7)
        state = reservoir.tag_state(name)
        self.assertFalse(state["asleep"])
        self.assertEqual(state["reserved_bytes"], reserved)
        self.assertEqual(state["offloaded_bytes"], reserved)  # the copies may still read them
        reservoir.notify_host_wait(7)  # the simulated stream's work is done
        self.assertEqual(reservoir.tag_state(name)["offloaded_bytes"], 0)
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.wake(name, stream=7)  # not asleep
        with self.assertRaises(ValueError):
            reservoir.wake(name, stream=-1)
        reservoir.raw_free(ptr)

    def test_allocating_under_a_sleeping_tag_is_refused(self):
        name = fresh_tag()
        ptr = tagged_alloc(name)
        reservoir.sleep(name, "discard")
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
            tagged_alloc(name, 4096)
        self.assertIsInstance(caught.exception, ValueError)
        self.assertIn(name, str(caught.exception))
        self.assertIn("asleep", str(caught.exception))
        self.assertTrue(no_scope_open())
        reservoir.wake(name)
        reservoir.raw_free(ptr)

    def test_sleeping_twice_and_waking_an_awake_tag_are_refused(self):
        name = fresh_tag()
        ptr = tagged_alloc(name)
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.wake(name)
        reservoir.sleep(name, "discard")
        for mode in ("discard", "offload"):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
                reservoir.sleep(name, mode)
            self.assertIn("asleep already", str(caught.exception))
        self.assertEqual(reservoir.tag_state(name)["mode"], "discard")
        reservoir.wake(name)
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
            reservoir.wake(name)
        self.assertIn("not asleep", str(caught.exception))
        reservoir.raw_free(ptr)

    def test_free_while_asleep_then_wake(self):
        name = fresh_tag()
        a = tagged_alloc(name)
        b = tagged_alloc(name, 4096)
        reservoir.sleep(name, "offload")
        reservoir.raw_free(a)
        self.assertEqual(reservoir.tag_state(name)["allocated_bytes"], 4096)
        reservoir.validate()
        reservoir.wake(name)
        self.assertFalse(reservoir.tag_state(name)["asleep"])
        reservoir.raw_free(b)
        self.assertEqual(reservoir.tag_state(name)["allocated_bytes"], 0)
        # Woken, the tag serves requests again.
        reservoir.raw_free(tagged_alloc(name))

    def test_sleep_during_a_capture_is_refused(self):
        name = fresh_tag()
        ptr = tagged_alloc(name)
        pool = reservoir.MemPool()
        with reservoir.capture_to_pool(pool, 0x1234):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
                reservoir.sleep(name)
            self.assertIn("capture", str(caught.exception))
        self.assertFalse(reservoir.tag_state(name)["asleep"])
        reservoir.raw_free(ptr)
        pool.release(empty_cache=True)

    def test_device_arguments(self):
        name = fresh_tag()
        ptr = tagged_alloc(name)
        self.assertEqual(reservoir.tag_state(name, 0), reservoir.tag_state(name))
        self.assertEqual(reservoir.tag_state(name, "cuda:0"), reservoir.tag_state(name))
        reservoir.sleep(name, "discard", device="cuda:0")
        self.assertTrue(reservoir.tag_state(name, device=0)["asleep"])
        reservoir.wake(name, device=0)
        missing = reservoir.device_count()
        for call in (lambda: reservoir.sleep(name, device=missing),
                     lambda: reservoir.wake(name, device=missing),
                     lambda: reservoir.tag_state(name, device=missing)):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
                call()
        with self.assertRaises(TypeError):
            reservoir.tag_state(name, device=1.5)
        self.assertFalse(reservoir.tag_state(name)["asleep"])
        reservoir.raw_free(ptr)


class TagArgumentTest(unittest.TestCase):
    def test_an_unknown_tag_is_named(self):
        for call in (reservoir.tag_state, reservoir.sleep, reservoir.wake):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
                call("never-made")
            self.assertIsInstance(caught.exception, ValueError)
            self.assertIn("'never-made'", str(caught.exception))

    def test_invalid_names_are_refused(self):
        for bad in ("", "a b", "x" * 64, "tab\there", "caf\u00e9"):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError, msg=repr(bad)):
                with reservoir.tag(bad):
                    self.fail("the block ran under %r" % bad)
            for call in (reservoir.tag_state, reservoir.sleep, reservoir.wake):
                with self.assertRaises(reservoir.ReservoirInvalidArgumentError, msg=repr(bad)):
                    call(bad)
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.tag("nul\0inside").__enter__()
        self.assertTrue(no_scope_open())
        with reservoir.tag("y" * 63):  # the longest name
            pass
        self.assertTrue(no_scope_open())

    def test_names_must_be_str(self):
        for bad in (None, 7, b"bytes", ["list"]):
            with self.assertRaises(TypeError, msg=repr(bad)):
                with reservoir.tag(bad):
                    self.fail("the block ran under %r" % (bad,))
            for call in (reservoir.tag_state, reservoir.sleep, reservoir.wake):
                with self.assertRaises(TypeError, msg=repr(bad)):
                    call(bad)
        self.assertTrue(no_scope_open())

    def test_mode_must_be_offload_or_discard(self):
        name = fresh_tag()
        ptr = tagged_alloc(name)
        for bad in ("sideways", "OFFLOAD", "", 0, 1, None):
            with self.assertRaises(ValueError, msg=repr(bad)) as caught:
                reservoir.sleep(name, bad)
            self.assertIn("'offload'", str(caught.exception))
            self.assertIn("'discard'", str(caught.exception))
        self.assertFalse(reservoir.tag_state(name)["asleep"])
        reservoir.raw_free(ptr)

    def test_torch_module_mirrors_the_tag_functions(self):
        # reservoir.torch imports torch only when used; an explicit device needs none.
        import reservoir.torch as rtorch

        self.assertIs(rtorch.tag, reservoir.tag)
        self.assertIs(rtorch.empty_host_cache, reservoir.empty_host_cache)
        name = fresh_tag()
        with rtorch.tag(name):
            ptr = reservoir.raw_alloc(MiB)
        rtorch.sleep(name, "discard", device=0)
        self.assertTrue(rtorch.tag_state(name, device=0)["asleep"])
        rtorch.wake(name, device=0)
        self.assertFalse(rtorch.tag_state(name, device=0)["asleep"])
        reservoir.raw_free(ptr)


class WakeOutOfMemoryTest(unittest.TestCase):
    def test_wake_without_room_raises_and_leaves_the_tag_asleep(self):
        # Its own process: a 64 MiB simulated device that the test fills.
        code = (
            "import reservoir\n"
            "MiB = 1 << 20\n"
            "with reservoir.tag('w'):\n"
            "    p = reservoir.raw_alloc(16 * MiB)\n"
            "reservoir.sleep('w', 'offload')\n"
            "fill = []\n"
            "try:\n"
            "    while True:\n"
            "        fill.append(reservoir.raw_alloc(8 * MiB))\n"
            "except reservoir.ReservoirOutOfMemoryError:\n"
            "    pass\n"
            "try:\n"
            "    reservoir.wake('w')\n"
            "    print('WOKE')\n"
            "except reservoir.ReservoirOutOfMemoryError as e:\n"
            "    assert isinstance(e, MemoryError)\n"
            "    print('OOM', e)\n"
            "s = reservoir.tag_state('w')\n"
            "assert s['asleep'] and s['mode'] == 'offload' and s['reserved_bytes'] == 0, s\n"
            "for f in fill:\n"
            "    reservoir.raw_free(f)\n"
            "reservoir.empty_cache()\n"
            "reservoir.wake('w')\n"
            "assert not reservoir.tag_state('w')['asleep']\n"
            "reservoir.raw_free(p)\n"
            "reservoir.validate()\n"
            "print('DONE')\n"
        )
        env = dict(os.environ, RESERVOIR_ALLOC_CONF="device:sim,sim_capacity:64MiB")
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.dirname(reservoir.__file__)), env.get("PYTHONPATH", "")])
        env.setdefault("RESERVOIR_LIBRARY", reservoir.library_path())
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("OOM reservoir: out of memory waking tag 'w'", result.stdout)
        self.assertIn("DONE", result.stdout)


# Running the module in its own process: the parent's suite holds one stand-in per
# test, which reports the outcome the child process gave that test.
_IN_PROCESS = "RESERVOIR_TAG_TESTS_IN_PROCESS"
_CHILD = """
import json, sys, unittest
import {module} as tests
suite = unittest.defaultTestLoader.loadTestsFromModule(tests)
result = unittest.TestResult()
suite.run(result)
outcomes = {{}}
for kind, listed in (("failed", result.failures), ("error", result.errors),
                     ("skipped", result.skipped), ("failed", result.unexpectedSuccesses)):
    for test, text in (item if isinstance(item, tuple) else (item, "") for item in listed):
        outcomes[test.id()] = (kind, text)
with open(sys.argv[1], "w") as f:
    json.dump(outcomes, f)
"""
_child = {}


def _child_outcomes():
    """{test id: (outcome, text)} for the tests that did not pass in the child."""
    if "outcomes" not in _child:
        env = dict(os.environ)
        env[_IN_PROCESS] = "1"
        env.setdefault("RESERVOIR_ALLOC_CONF", "device:sim")
        env.setdefault("RESERVOIR_LIBRARY", reservoir.library_path())
        here = os.path.dirname(os.path.abspath(__file__))
        env["PYTHONPATH"] = os.pathsep.join(
            [here, os.path.dirname(os.path.dirname(reservoir.__file__)),
             env.get("PYTHONPATH", "")])
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "outcomes.json")
            run = subprocess.run(
                [sys.executable, "-c", _CHILD.format(module=__name__), path], env=env,
                capture_output=True, text=True, timeout=300)
            outcomes = None
            if run.returncode == 0 and os.path.exists(path):
                with open(path) as f:
                    outcomes = json.load(f)
        _child["outcomes"] = outcomes
        _child["output"] = "exit status %d\n%s%s" % (run.returncode, run.stdout, run.stderr)
    return _child["outcomes"], _child["output"]


class _InOwnProcess(unittest.TestCase):
    """Stands for the test test_id, which ran in the child process."""

    def __init__(self, test_id):
        super().__init__("run_in_child")
        self._test_id = test_id

    def id(self):
        return self._test_id

    def __str__(self):
        module, _, name = self._test_id.rpartition(".")
        return "%s (%s, in its own process)" % (name, module)

    def run_in_child(self):
        outcomes, output = _child_outcomes()
        if outcomes is None:
            self.fail("the tag tests' process did not finish: " + output)
        kind, text = outcomes.get(self._test_id, ("ok", ""))
        if kind == "skipped":
            self.skipTest(text)
        if kind != "ok":
            self.fail("%s in its own process:\n%s" % (kind, text))


def _each(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _each(item)
        else:
            yield item


def load_tests(loader, tests, pattern):
    if os.environ.get(_IN_PROCESS) == "1":
        return tests
    return unittest.TestSuite(_InOwnProcess(test.id()) for test in _each(tests))


if __name__ == "__main__":
    unittest.main()
