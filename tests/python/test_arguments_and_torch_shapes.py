"""Argument checks of the Python API (ctypes would otherwise convert silently: a
str to the address of its bytes, 2**64 + 5 to stream 5) and the PyTorch-shaped
answers reservoir.torch gives for torch.cuda's memory API, on the simulated device.
"""

import os
import pickle
import sys
import tempfile
import unittest

from test_reservoir_package import MiB, reservoir

from reservoir import _torch_memory_api


def block_at(ptr):
    """The snapshot's (segment, block) whose block starts at ptr, or (None, None)."""
    for segment in _torch_memory_api.snapshot(include_traces=False)["segments"]:
        for block in segment["blocks"]:
            if block["address"] == ptr:
                return segment, block
    return None, None


class ArgumentTest(unittest.TestCase):
    def test_addresses_must_be_ints(self):
        for bad in ("abc", b"abc", 1.5, True, [1]):
            with self.assertRaises(TypeError):
                reservoir.raw_free(bad)
            with self.assertRaises(TypeError):
                reservoir.record_stream(bad, 0)
            with self.assertRaises(TypeError):
                reservoir.base_allocation(bad)
        for bad in (-1, 1 << 64):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
                reservoir.raw_free(bad)

    def test_streams_outside_64_bits_are_refused_not_truncated(self):
        before = reservoir.memory_stats()["allocation.all.current"]
        for bad in (1 << 64, (1 << 64) + 5, -1):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
                reservoir.raw_alloc(4096, stream=bad)
            self.assertIn(str(bad), str(caught.exception))
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
                reservoir.notify_host_wait(bad)
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
                reservoir.release_stream(bad)
        with self.assertRaises(TypeError):
            reservoir.raw_alloc(4096, stream="0")
        self.assertEqual(reservoir.memory_stats()["allocation.all.current"], before)

    def test_devices_beyond_a_c_int_are_refused_not_wrapped(self):
        for bad in (1 << 32, "cuda:4294967296"):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
                reservoir.memory_stats(bad)
        with self.assertRaises(ValueError):
            reservoir.memory_stats("cpu")

    def test_numpy_style_integers_are_accepted(self):
        class Index:
            def __init__(self, value):
                self.value = value

            def __index__(self):
                return self.value

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "index.trace")
            with reservoir.record_trace(path):
                ptr = reservoir.raw_alloc(Index(4096), device=Index(0), stream=Index(3))
                segment, block = block_at(ptr)
                reservoir.notify_host_wait(Index(3))
                reservoir.raw_free(Index(ptr))
            with open(path) as f:
                requests = f.read().splitlines()[1:]
        self.assertEqual((segment["device"], segment["stream"]), (0, 3))
        self.assertEqual((block["requested_size"], block["state"]), (4096, "active_allocated"))
        self.assertEqual(block_at(ptr)[1]["state"], "inactive")  # the free found the block
        # The trace numbers streams by first use: the wait named the allocation's stream.
        self.assertEqual(requests, ["a,0,4096,0", "s,0", "f,0"])

    def test_stream_objects_give_their_handle(self):
        class TorchStream:
            cuda_stream = 11

        class CupyStream:
            ptr = 12

        active = reservoir.memory_stats()["active.all.current"]
        torch_stream, cupy_stream = TorchStream(), CupyStream()
        for stream, handle, other in ((torch_stream, 11, cupy_stream),
                                      (cupy_stream, 12, torch_stream)):
            ptr = reservoir.raw_alloc(MiB, stream=stream)
            self.assertEqual(block_at(ptr)[0]["stream"], handle)
            reservoir.record_stream(ptr, stream)  # its own stream: nothing to wait for
            reservoir.raw_free(ptr)
            self.assertEqual(block_at(ptr)[1]["state"], "inactive")
            ptr = reservoir.raw_alloc(MiB, stream=stream)
            reservoir.record_stream(ptr, other)  # the other object's stream: the free waits
            reservoir.raw_free(ptr)
            self.assertEqual(block_at(ptr)[1]["state"], "active_pending_free")
            reservoir.release_stream(stream)  # before the program destroys it
        reservoir.empty_cache()  # waits for the pending frees
        self.assertEqual(reservoir.memory_stats()["active.all.current"], active)

    def test_text_with_a_nul_is_refused_not_cut_short(self):
        # C reads up to the first NUL: "/tmp/x\0y" would have written /tmp/x.
        with tempfile.TemporaryDirectory() as tmp:
            cut = os.path.join(tmp, "cut")
            for call in (reservoir.start_trace_recording, reservoir.dump_snapshot):
                with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
                    call(cut + "\0.trace")
                self.assertIn("NUL", str(caught.exception))
                with self.assertRaises(TypeError) as caught:
                    call(None)
                self.assertIn("path must be a str, bytes or os.PathLike", str(caught.exception))
            self.assertFalse(os.path.exists(cut))
        before = reservoir.config_string()
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.update_config("max_split_size_mb:64\0,garbage")
        self.assertEqual(reservoir.config_string(), before)

    def test_counts_and_descriptors_beyond_their_c_type_are_refused(self):
        for bad in (0, -1, (1 << 64) + 5):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
                reservoir.record_history(True, bad)
        with self.assertRaises(TypeError):
            reservoir.record_history(True, 1.5)
        for bad in (-1, 1 << 32, (1 << 32) + 1):  # 2**32 + 1 wrapped to descriptor 1
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
                reservoir.open(bad)
            self.assertIn("not a file descriptor", str(caught.exception))
        with self.assertRaises(TypeError):
            reservoir.share(1, "sock")

    # Stream UINTPTR_MAX once wrapped the stream table's empty-slot marker and crashed
    # the interpreter: the test runs in a child process, so a crash is reported.
    def test_largest_stream_handle_is_served(self):
        from test_reservoir_package import run_python

        result = run_python(
            "import reservoir\n"
            "p = reservoir.raw_alloc(4 << 20, stream=2**64 - 1)\n"
            "reservoir.notify_host_wait(2**64 - 1)\n"
            "reservoir.raw_free(p)\n"
            "reservoir.validate()\n"
            "print('ok')\n"
        )
        self.assertEqual(result.returncode, 0, "stream 2**64-1 crashed or failed: %r %s"
                         % (result.returncode, result.stderr[-2000:]))
        self.assertEqual(result.stdout.strip(), "ok")


class IoErrorTest(unittest.TestCase):
    def test_dump_snapshot_to_an_unwritable_path(self):
        with self.assertRaises(reservoir.ReservoirIoError) as caught:
            reservoir.dump_snapshot("/nonexistent-dir/s.pickle")
        self.assertIsInstance(caught.exception, OSError)
        self.assertIn("/nonexistent-dir/s.pickle", str(caught.exception))
        reservoir.raw_free(reservoir.raw_alloc(4096))


class TorchShapesTest(unittest.TestCase):
    def test_nested_stats_have_torchs_shape(self):
        ptr = reservoir.raw_alloc(3 * MiB)
        try:
            nested = _torch_memory_api.nested_stats(0)
            flat = reservoir.memory_stats(0)
        finally:
            reservoir.raw_free(ptr)
        for family in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                       "reserved_bytes", "active_bytes", "inactive_split_bytes",
                       "requested_bytes"):
            self.assertEqual(set(nested[family]), {"all", "small_pool", "large_pool"})
            for pool in nested[family].values():
                self.assertEqual(set(pool), {"current", "peak", "allocated", "freed"})
        for counter in ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
                        "num_device_alloc", "num_device_free", "max_split_size"):
            self.assertIsInstance(nested[counter], int)
        self.assertEqual(set(nested["oversize_allocations"]),
                         {"current", "peak", "allocated", "freed"})
        # Flattened as torch.cuda.memory_stats flattens it: the same dict.
        flattened = {}

        def flatten(prefix, value):
            if isinstance(value, dict):
                for key, item in value.items():
                    flatten(prefix + "." + key if prefix else key, item)
            else:
                flattened[prefix] = value

        flatten("", nested)
        self.assertEqual(flattened, flat)
        self.assertGreaterEqual(nested["requested_bytes"]["all"]["current"], 3 * MiB)

    def test_patch_replaces_the_accelerator_entry_points(self):
        import types

        names = ("_cuda_memoryStats", "_accelerator_getDeviceStats",
                 "_accelerator_isAllocatorInitialized", "_accelerator_emptyCache")
        fake = types.SimpleNamespace(_C=types.SimpleNamespace(
            **{name: (lambda *a: "pytorch's") for name in names}))
        replaced = _torch_memory_api.patch(fake)
        self.assertEqual(sorted(replaced), sorted(names))
        self.assertEqual(_torch_memory_api.patch(fake), [], "patch is idempotent")
        # torch.accelerator.empty_cache reaches Reservoir's empty_cache.
        reservoir.raw_free(reservoir.raw_alloc(3 * MiB))
        self.assertGreater(reservoir.memory_reserved(0), 0)
        fake._C._accelerator_emptyCache()
        self.assertEqual(reservoir.memory_reserved(0), 0)
        self.assertEqual(fake._C._accelerator_getDeviceStats(0),
                         _torch_memory_api.nested_stats(0))

    def test_with_the_native_part_history_and_snapshot_stay_pytorchs(self):
        import types

        names = ("_cuda_memoryStats", "_cuda_memorySnapshot", "_cuda_record_memory_history",
                 "_cuda_record_memory_history_legacy", "_cuda_isHistoryEnabled")
        fake = types.SimpleNamespace(_C=types.SimpleNamespace(
            **{name: (lambda *a: "pytorch's") for name in names}))
        replaced = _torch_memory_api.patch(fake, native=True)
        self.assertEqual(replaced, ["_cuda_memoryStats"])
        for name in _torch_memory_api.NATIVE_ANSWERS:
            self.assertEqual(getattr(fake._C, name)(), "pytorch's", name)
        # Without the native part they are Reservoir's.
        replaced = _torch_memory_api.patch(fake)
        self.assertEqual(sorted(replaced), sorted(_torch_memory_api.NATIVE_ANSWERS))
        self.assertFalse(fake._C._cuda_isHistoryEnabled())

    def test_torchs_allocator_settings_reach_reservoir_with_torchs_meaning(self):
        import types

        forwarded = []
        fake = types.SimpleNamespace(_C=types.SimpleNamespace(
            _cuda_cudaCachingAllocator_set_allocator_settings=forwarded.append,
            _accelerator_setAllocatorSettings=forwarded.append))
        _torch_memory_api.patch(fake)
        set_settings = fake._C._cuda_cudaCachingAllocator_set_allocator_settings
        before = reservoir.config_string()
        try:
            set_settings("roundup_power2_divisions:[64:8,>:1],pinned_use_cuda_host_register:True")
            self.assertIn("roundup_power2_divisions", reservoir.config_string())
            # PyTorch's pinned host allocator keeps its own keys.
            self.assertEqual(forwarded, ["pinned_use_cuda_host_register:True"])
            # 84 MiB: 64-128 MiB in 8 steps, the "64" entry's (PyTorch's test_allocator_settings)
            ptr = reservoir.raw_alloc(84 * MiB)
            try:
                self.assertEqual(reservoir.memory_stats()["active_bytes.all.current"], 88 * MiB)
            finally:
                reservoir.raw_free(ptr)
            # A setting it does not name goes back to its default, as in PyTorch.
            fake._C._accelerator_setAllocatorSettings("garbage_collection_threshold:0.5")
            self.assertNotIn("roundup_power2_divisions", reservoir.config_string())
            self.assertIn("garbage_collection_threshold:0.5", reservoir.config_string())
            self.assertEqual(len(forwarded), 1)
            with self.assertRaises(ValueError):
                set_settings("garbage_collection_threshold:1.2")
            with self.assertRaises(ValueError):
                set_settings("foo:1,bar:2")
            self.assertIn("garbage_collection_threshold:0.5", reservoir.config_string())
        finally:
            reservoir.set_allocator_settings("")
        self.assertEqual(reservoir.config_string(), before)

    def test_a_bad_pinned_setting_raises_torchs_error_and_changes_nothing(self):
        import types

        def accelerator_settings(text):  # torch 2.11 has this setter only
            if "none" in text:
                raise ValueError("Expected a boolean for pinned_use_cuda_host_register")

        fake = types.SimpleNamespace(_C=types.SimpleNamespace(
            _accelerator_setAllocatorSettings=accelerator_settings))
        saved = dict(_torch_memory_api._originals)
        _torch_memory_api._originals.clear()
        try:
            _torch_memory_api.patch(fake)
            before = reservoir.config_string()
            with self.assertRaises(ValueError):
                fake._C._accelerator_setAllocatorSettings(
                    "max_split_size_mb:64,pinned_use_cuda_host_register:none")
            self.assertEqual(reservoir.config_string(), before)
        finally:
            _torch_memory_api._originals.clear()
            _torch_memory_api._originals.update(saved)
            reservoir.set_allocator_settings("")

    def test_torchs_out_of_memory_observers_are_called_as_torch_calls_them(self):
        import types

        fake = types.SimpleNamespace(_C=types.SimpleNamespace(
            _cuda_attach_out_of_memory_observer=lambda observer: None))
        _torch_memory_api.patch(fake)
        seen, inside = [], []

        def observer(device, alloc_size, allowed, free):
            seen.append((device, alloc_size, allowed, free))
            # A dump-on-OOM tool reads the allocator from here: no lock is held.
            inside.append(reservoir.memory_stats()["num_ooms"])

        raised = []

        def raising(*args):
            if not raised:  # once: observers stay attached for the later tests
                raised.append(True)
                raise RuntimeError("an observer's own error")

        with self.assertRaises(TypeError):
            reservoir.attach_oom_observer(42)
        fake._C._cuda_attach_out_of_memory_observer(observer)
        reservoir.attach_oom_observer(raising)  # printed and ignored: the error goes on
        ooms = reservoir.memory_stats()["num_ooms"]
        huge = 1 << 50
        reported, hook = [], sys.unraisablehook
        sys.unraisablehook = lambda unraisable: reported.append(unraisable.exc_value)
        try:
            with self.assertRaises(reservoir.ReservoirOutOfMemoryError):
                reservoir.raw_alloc(huge)
        finally:
            sys.unraisablehook = hook
        self.assertEqual([str(e) for e in reported], ["an observer's own error"])
        self.assertEqual(len(seen), 1)
        device, alloc_size, allowed, free = seen[0]
        self.assertEqual(device, 0)
        self.assertGreaterEqual(alloc_size, huge)
        self.assertGreater(allowed, 0)  # the device's total: no memory fraction set
        self.assertLessEqual(free, allowed)
        self.assertEqual(inside, [ooms + 1])
        # Under a memory fraction, the bytes it allows.
        reservoir.set_memory_fraction(0.5)
        try:
            with self.assertRaises(reservoir.ReservoirOutOfMemoryError):
                reservoir.raw_alloc(allowed)
        finally:
            reservoir.set_memory_fraction(1.0)
        self.assertEqual(len(seen), 2)
        self.assertEqual(seen[1][2], allowed // 2)

    def test_a_registering_tracker_sees_every_segment_listed(self):
        # What a communication library does: register the segments listed, then every
        # segment made, deregister those given back (by address, the range given).
        if "expandable_segments:True" in reservoir.config_string():
            self.skipTest("expandable segments map and unmap runs of pages that need not pair")
        reservoir.empty_cache()
        registered, problems = {}, []

        def tracker(action, device, address, size, stream, pool):
            if action in ("segment_alloc", "segment_map"):
                registered[address] = size
            elif action in ("segment_free", "segment_unmap"):
                if registered.pop(address, None) != size:
                    problems.append((action, address, size))

        with self.assertRaises(TypeError):
            reservoir.attach_trace_tracker(None)
        first = reservoir.raw_alloc(5 * MiB)
        for segment in reservoir.segments():
            registered[segment["address"]] = segment["size"]
        reservoir.attach_trace_tracker(tracker)
        ptrs = [reservoir.raw_alloc(size) for size in (30 * MiB, 700 * 1024, 3 * MiB)]
        self.addCleanup(reservoir.empty_cache)
        for ptr in ptrs + [first]:
            self.addCleanup(reservoir.raw_free, ptr)
        listed = reservoir.segments(0)
        self.assertEqual(reservoir.segments(), listed)
        for segment in listed:
            self.assertEqual(registered.get(segment["address"]), segment["size"])
            self.assertEqual(segment["device"], 0)
            self.assertEqual(segment["pool"], (0, 0))
            self.assertGreaterEqual(segment["size"], segment["allocated"])
        holding = [s for s in listed if s["address"] <= ptrs[0] < s["address"] + s["size"]]
        self.assertEqual(len(holding), 1)
        self.assertGreaterEqual(holding[0]["requested"], 30 * MiB)  # others may share it
        self.assertTrue(holding[0]["is_large"])
        self.doCleanups()
        self.assertEqual(reservoir.segments(), [])
        self.assertEqual(problems, [])
        self.assertEqual(registered, {})
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.segments(device=99)

    def test_snapshot_is_the_dict_torchs_snapshot_returns(self):
        reservoir.record_history(True, 1000)
        ptr = reservoir.raw_alloc(3 * MiB)
        try:
            snap = _torch_memory_api.snapshot()
            light = _torch_memory_api._memory_snapshot((0, 0, False))
        finally:
            reservoir.raw_free(ptr)
            reservoir.record_history(False)
        self.assertIn("segments", snap)
        self.assertIn("device_traces", snap)
        addresses = [b["address"] for s in snap["segments"] for b in s["blocks"]]
        self.assertIn(ptr, addresses)
        self.assertTrue(any(t["action"] == "alloc" for t in snap["device_traces"][0]))
        self.assertEqual(light["device_traces"], [[] for _ in light["device_traces"]])
        with tempfile.TemporaryDirectory() as tmp:  # what _dump_snapshot writes
            path = os.path.join(tmp, "s.pickle")
            with open(path, "wb") as f:
                pickle.dump(snap, f)
            with open(path, "rb") as f:
                self.assertEqual(pickle.load(f)["segments"], snap["segments"])


    def test_skipped_actions_are_left_out_of_the_traces(self):
        # torch.cuda.memory._record_memory_history(..., skip_actions=[...]) reaches
        # torch._C._cuda_record_memory_history with the list as its eighth argument.
        record = _torch_memory_api._record_memory_history
        for skip in (["alloc"], ["free_requested", "free_completed"], [], None):
            with self.subTest(skip=skip):
                record("all", "all", "python", 1000, False, False, False, skip)
                try:
                    reservoir.raw_free(reservoir.raw_alloc(3 * MiB))
                    actions = {t["action"] for t in _torch_memory_api.snapshot()["device_traces"][0]}
                finally:
                    record(None)
                for action in skip or ():
                    self.assertNotIn(action, actions)
                self.assertTrue(actions - set(skip or ()), actions)
                if not skip:
                    self.assertIn("alloc", actions)
        record("all", max_entries=1000, skip_actions=["alloc"])  # by keyword too
        try:
            reservoir.raw_free(reservoir.raw_alloc(3 * MiB))
            traces = _torch_memory_api.snapshot()["device_traces"][0]
        finally:
            record(None)
        self.assertNotIn("alloc", {t["action"] for t in traces})


if __name__ == "__main__":
    unittest.main()
