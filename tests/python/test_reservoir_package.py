"""CPU tests of the reservoir Python package, on the simulated device.

Run by CTest (python_package) with RESERVOIR_LIBRARY set to the built library and
RESERVOIR_ALLOC_CONF=device:sim. Stdlib only. By hand:
  RESERVOIR_LIBRARY=build/src/libreservoir.so RESERVOIR_ALLOC_CONF=device:sim \
    python3 -m unittest discover -s tests/python -v
"""

import ctypes
import importlib.util
import os
import subprocess
import sys
import threading
import unittest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if importlib.util.find_spec("reservoir") is None:
    sys.path.insert(0, os.path.join(_REPO, "python"))

import reservoir  # noqa: E402
from reservoir import _lib  # noqa: E402

MiB = 1 << 20

# The keys of torch.cuda.memory_stats() (PyTorch 2.x: Module.cpp's memoryStats
# flattened by torch.cuda.memory_stats), sorted as torch returns them.
TORCH_MEMORY_STATS_KEYS = (
    "active.all.allocated",
    "active.all.current",
    "active.all.freed",
    "active.all.peak",
    "active.large_pool.allocated",
    "active.large_pool.current",
    "active.large_pool.freed",
    "active.large_pool.peak",
    "active.small_pool.allocated",
    "active.small_pool.current",
    "active.small_pool.freed",
    "active.small_pool.peak",
    "active_bytes.all.allocated",
    "active_bytes.all.current",
    "active_bytes.all.freed",
    "active_bytes.all.peak",
    "active_bytes.large_pool.allocated",
    "active_bytes.large_pool.current",
    "active_bytes.large_pool.freed",
    "active_bytes.large_pool.peak",
    "active_bytes.small_pool.allocated",
    "active_bytes.small_pool.current",
    "active_bytes.small_pool.freed",
    "active_bytes.small_pool.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.current",
    "allocated_bytes.all.freed",
    "allocated_bytes.all.peak",
    "allocated_bytes.large_pool.allocated",
    "allocated_bytes.large_pool.current",
    "allocated_bytes.large_pool.freed",
    "allocated_bytes.large_pool.peak",
    "allocated_bytes.small_pool.allocated",
    "allocated_bytes.small_pool.current",
    "allocated_bytes.small_pool.freed",
    "allocated_bytes.small_pool.peak",
    "allocation.all.allocated",
    "allocation.all.current",
    "allocation.all.freed",
    "allocation.all.peak",
    "allocation.large_pool.allocated",
    "allocation.large_pool.current",
    "allocation.large_pool.freed",
    "allocation.large_pool.peak",
    "allocation.small_pool.allocated",
    "allocation.small_pool.current",
    "allocation.small_pool.freed",
    "allocation.small_pool.peak",
    "inactive_split.all.allocated",
    "inactive_split.all.current",
    "inactive_split.all.freed",
    "inactive_split.all.peak",
    "inactive_split.large_pool.allocated",
    "inactive_split.large_pool.current",
    "inactive_split.large_pool.freed",
    "inactive_split.large_pool.peak",
    "inactive_split.small_pool.allocated",
    "inactive_split.small_pool.current",
    "inactive_split.small_pool.freed",
    "inactive_split.small_pool.peak",
    "inactive_split_bytes.all.allocated",
    "inactive_split_bytes.all.current",
    "inactive_split_bytes.all.freed",
    "inactive_split_bytes.all.peak",
    "inactive_split_bytes.large_pool.allocated",
    "inactive_split_bytes.large_pool.current",
    "inactive_split_bytes.large_pool.freed",
    "inactive_split_bytes.large_pool.peak",
    "inactive_split_bytes.small_pool.allocated",
    "inactive_split_bytes.small_pool.current",
    "inactive_split_bytes.small_pool.freed",
    "inactive_split_bytes.small_pool.peak",
    "max_split_size",
    "num_alloc_retries",
    "num_device_alloc",
    "num_device_free",
    "num_ooms",
    "num_sync_all_streams",
    "oversize_allocations.allocated",
    "oversize_allocations.current",
    "oversize_allocations.freed",
    "oversize_allocations.peak",
    "oversize_segments.allocated",
    "oversize_segments.current",
    "oversize_segments.freed",
    "oversize_segments.peak",
    "requested_bytes.all.allocated",
    "requested_bytes.all.current",
    "requested_bytes.all.freed",
    "requested_bytes.all.peak",
    "requested_bytes.large_pool.allocated",
    "requested_bytes.large_pool.current",
    "requested_bytes.large_pool.freed",
    "requested_bytes.large_pool.peak",
    "requested_bytes.small_pool.allocated",
    "requested_bytes.small_pool.current",
    "requested_bytes.small_pool.freed",
    "requested_bytes.small_pool.peak",
    "reserved_bytes.all.allocated",
    "reserved_bytes.all.current",
    "reserved_bytes.all.freed",
    "reserved_bytes.all.peak",
    "reserved_bytes.large_pool.allocated",
    "reserved_bytes.large_pool.current",
    "reserved_bytes.large_pool.freed",
    "reserved_bytes.large_pool.peak",
    "reserved_bytes.small_pool.allocated",
    "reserved_bytes.small_pool.current",
    "reserved_bytes.small_pool.freed",
    "reserved_bytes.small_pool.peak",
    "segment.all.allocated",
    "segment.all.current",
    "segment.all.freed",
    "segment.all.peak",
    "segment.large_pool.allocated",
    "segment.large_pool.current",
    "segment.large_pool.freed",
    "segment.large_pool.peak",
    "segment.small_pool.allocated",
    "segment.small_pool.current",
    "segment.small_pool.freed",
    "segment.small_pool.peak",
)


def run_python(code, **env_changes):
    """Runs code in a fresh interpreter (its own process-wide allocator)."""
    env = dict(os.environ)
    env.setdefault("RESERVOIR_ALLOC_CONF", "device:sim")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(reservoir.__file__)), env.get("PYTHONPATH", "")]
    )
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def current(key):
    return reservoir.memory_stats()[key]


class LibraryTest(unittest.TestCase):
    def test_library_is_found_and_uses_the_simulated_device(self):
        path = reservoir.library_path()
        self.assertTrue(os.path.exists(path), path)
        if "device:sim" in os.environ.get("RESERVOIR_ALLOC_CONF", ""):
            self.assertEqual(reservoir.backend_name(), "sim")
        self.assertGreaterEqual(reservoir.device_count(), 1)
        self.assertEqual(reservoir.current_device(), 0)

    def test_missing_library_is_a_clear_error(self):
        result = run_python(
            "import reservoir\n"
            "try:\n"
            "    reservoir.memory_stats()\n"
            "except reservoir.ReservoirLibraryNotFoundError as e:\n"
            "    print('ERR', e)\n",
            RESERVOIR_LIBRARY="/nonexistent/libreservoir.so",
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("ERR", result.stdout)
        self.assertIn("RESERVOIR_LIBRARY", result.stdout)
        self.assertIn("/nonexistent/libreservoir.so", result.stdout)

    def test_status_names_and_thread_local_last_error(self):
        lib = _lib.load()
        self.assertEqual(lib.reservoir_status_name(0), b"ok")
        self.assertEqual(lib.reservoir_status_name(1), b"out_of_memory")
        self.assertEqual(lib.reservoir_status_name(3), b"invalid_argument")
        self.assertEqual(lib.reservoir_status_name(6), b"internal")
        ptr = ctypes.c_void_p()
        self.assertEqual(lib.reservoir_allocate(ctypes.byref(ptr), -7, -1, 0), 3)
        self.assertIn(b"-7", lib.reservoir_last_error())
        self.assertEqual(lib.reservoir_allocate(None, 16, -1, 0), 3)
        self.assertIn(b"ptr", lib.reservoir_last_error())
        # Another thread sees only its own errors.
        seen = []
        thread = threading.Thread(target=lambda: seen.append(lib.reservoir_last_error()))
        thread.start()
        thread.join()
        self.assertEqual(seen, [b""])
        self.assertIn(b"ptr", lib.reservoir_last_error())
        # A successful call clears it.
        self.assertEqual(lib.reservoir_validate(), 0)
        self.assertEqual(lib.reservoir_last_error(), b"")


class StatsTest(unittest.TestCase):
    def test_keys_are_torch_memory_stats_keys(self):
        stats = reservoir.memory_stats()
        self.assertEqual(list(stats), list(TORCH_MEMORY_STATS_KEYS))
        self.assertEqual(len(stats), 122)
        for key, value in stats.items():
            self.assertIsInstance(value, int, key)

    def test_stats_of_an_explicit_device(self):
        self.assertEqual(reservoir.memory_stats(0).keys(), reservoir.memory_stats().keys())
        self.assertEqual(
            reservoir.memory_stats("cuda:0").keys(), reservoir.memory_stats("cuda").keys()
        )
        with self.assertRaises(ValueError):
            reservoir.memory_stats("cpu")
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.memory_stats(1000)

    def test_stats_text_buffer_convention(self):
        lib = _lib.load()
        needed = ctypes.c_size_t(0)
        self.assertEqual(lib.reservoir_stats_text(-1, None, 0, ctypes.byref(needed)), 0)
        full = needed.value
        self.assertGreater(full, 122 * 10)
        small = ctypes.create_string_buffer(16)
        self.assertEqual(lib.reservoir_stats_text(-1, small, 16, ctypes.byref(needed)), 0)
        self.assertEqual(needed.value, full)
        self.assertEqual(len(small.value), 15)  # truncated, NUL-terminated

    def test_allocate_and_free_move_the_counters(self):
        before = reservoir.memory_stats()
        ptr = reservoir.raw_alloc(1000)
        self.assertNotEqual(ptr, 0)
        self.assertEqual(ptr % 512, 0)
        during = reservoir.memory_stats()
        self.assertEqual(during["allocation.all.current"], before["allocation.all.current"] + 1)
        self.assertEqual(
            during["allocation.small_pool.current"], before["allocation.small_pool.current"] + 1
        )
        self.assertEqual(
            during["requested_bytes.all.current"], before["requested_bytes.all.current"] + 1000
        )
        grown = during["allocated_bytes.all.current"] - before["allocated_bytes.all.current"]
        self.assertGreaterEqual(grown, 1000)
        self.assertEqual(grown % 512, 0)
        self.assertGreaterEqual(during["reserved_bytes.all.current"], grown)
        self.assertEqual(
            during["requested_bytes.all.allocated"], before["requested_bytes.all.allocated"] + 1000
        )
        reservoir.raw_free(ptr)
        after = reservoir.memory_stats()
        for key in ("allocation.all.current", "requested_bytes.all.current",
                    "allocated_bytes.all.current", "active_bytes.all.current"):
            self.assertEqual(after[key], before[key], key)
        self.assertEqual(after["allocation.all.freed"], before["allocation.all.freed"] + 1)

    def test_host_waits_complete_frees_pending_on_the_simulated_device(self):
        # A host wait the program reports completes the simulated device's work on that
        # stream: the free pending on stream 71 completes and one segment serves every
        # round (before, 50 rounds left 50 segments of 64 MiB, all active).
        reservoir.empty_cache()
        before = reservoir.memory_stats()
        for _ in range(50):
            ptr = reservoir.raw_alloc(64 * MiB, stream=70)
            reservoir.record_stream(ptr, 71)
            reservoir.raw_free(ptr)
            reservoir.notify_host_wait(71)
            reservoir.notify_host_wait(70)
        after = reservoir.memory_stats()
        for key, grown in (("active_bytes.all.current", 0), ("reserved_bytes.all.current", 64 * MiB)):
            self.assertEqual(after[key] - before[key], grown, key)

    def test_large_allocation_goes_to_the_large_pool(self):
        before = reservoir.memory_stats()
        ptr = reservoir.raw_alloc(3 * MiB + 5)
        during = reservoir.memory_stats()
        reservoir.raw_free(ptr)
        self.assertEqual(
            during["allocation.large_pool.current"], before["allocation.large_pool.current"] + 1
        )
        self.assertEqual(
            during["requested_bytes.large_pool.current"],
            before["requested_bytes.large_pool.current"] + 3 * MiB + 5,
        )

    def test_size_zero_and_null(self):
        self.assertEqual(reservoir.raw_alloc(0), 0)
        reservoir.raw_free(0)
        reservoir.raw_free(None)

    def test_bad_sizes_and_pointers(self):
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
            reservoir.raw_alloc(-5)
        self.assertIsInstance(caught.exception, ValueError)
        self.assertIn("-5", str(caught.exception))
        self.assertEqual(caught.exception.status_name, "invalid_argument")

        device_allocs = current("num_device_alloc")
        for size in (1 << 60, (1 << 63) - 1, 1 << 64):
            with self.assertRaises(reservoir.ReservoirOutOfMemoryError) as caught:
                reservoir.raw_alloc(size)
            self.assertIsInstance(caught.exception, MemoryError)
        self.assertEqual(current("num_device_alloc"), device_allocs)

        ptr = reservoir.raw_alloc(4096)
        reservoir.raw_free(ptr)
        with self.assertRaises(reservoir.ReservoirInvalidPointerError) as caught:
            reservoir.raw_free(ptr)  # twice
        self.assertIsInstance(caught.exception, ValueError)
        self.assertIn(format(ptr, "x"), str(caught.exception).lower())
        with self.assertRaises(reservoir.ReservoirInvalidPointerError):
            reservoir.raw_free(0x1000)  # never handed out
        with self.assertRaises(reservoir.ReservoirInvalidPointerError):
            reservoir.record_stream(0x1000, 0)
        with self.assertRaises(TypeError):
            reservoir.raw_alloc(1.5)

    def test_inner_pointer_is_refused_and_base_allocation_finds_the_segment(self):
        ptr = reservoir.raw_alloc(3 * MiB)
        try:
            base, size = reservoir.base_allocation(ptr)
            self.assertLessEqual(base, ptr)
            self.assertGreaterEqual(base + size, ptr + 3 * MiB)
            self.assertEqual(reservoir.base_allocation(ptr + 4096), (base, size))
            with self.assertRaises(reservoir.ReservoirInvalidPointerError):
                reservoir.raw_free(ptr + 512)
            reservoir.record_stream(ptr, 0)  # its own stream: nothing to do
        finally:
            reservoir.raw_free(ptr)

    def test_reset_peak(self):
        ptr = reservoir.raw_alloc(8 * MiB)
        reservoir.raw_free(ptr)
        stats = reservoir.memory_stats()
        self.assertGreaterEqual(stats["allocated_bytes.all.peak"], 8 * MiB)
        self.assertGreaterEqual(stats["requested_bytes.all.peak"], 8 * MiB)
        reservoir.reset_peak_memory_stats()
        stats = reservoir.memory_stats()
        for key, value in stats.items():
            if key.endswith(".peak"):
                self.assertEqual(value, stats[key[: -len("peak")] + "current"], key)
        self.assertEqual(reservoir.max_memory_allocated(), reservoir.memory_allocated())

    def test_reset_accumulated(self):
        reservoir.raw_free(reservoir.raw_alloc(4096))
        reservoir.reset_accumulated_memory_stats()
        stats = reservoir.memory_stats()
        for key, value in stats.items():
            if key.endswith(".allocated") or key.endswith(".freed"):
                self.assertEqual(value, 0, key)

    def test_empty_cache_returns_cached_segments(self):
        ptrs = [reservoir.raw_alloc(size) for size in (512, 2 * MiB, 25 * MiB)]
        for ptr in ptrs:
            reservoir.raw_free(ptr)
        self.assertGreater(reservoir.memory_reserved(), 0)
        self.assertGreater(reservoir.largest_cached_block(), 0)
        frees = current("num_device_free")
        reservoir.empty_cache()
        stats = reservoir.memory_stats()
        self.assertEqual(stats["reserved_bytes.all.current"], 0)
        self.assertEqual(stats["segment.all.current"], 0)
        self.assertGreater(stats["num_device_free"], frees)
        self.assertEqual(reservoir.largest_cached_block(), 0)

    def test_validate(self):
        # The walk passes in every state the package can reach: blocks live on two
        # streams, a free deferred by record_stream, split and merged blocks, an empty
        # cache.
        small = reservoir.raw_alloc(12345)
        big = reservoir.raw_alloc(25 * MiB, stream=7)
        reservoir.record_stream(big, 3)
        reservoir.validate()
        reservoir.raw_free(big)  # pending until stream 3's work passes
        reservoir.validate()
        reservoir.raw_free(small)
        reservoir.empty_cache()
        reservoir.validate()
        # A violation found by the C library's walk is raised as ReservoirInternalError.
        lib = _lib.load()
        real = lib.reservoir_validate
        try:
            lib.reservoir_validate = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 6)
            with self.assertRaises(reservoir.ReservoirInternalError) as caught:
                reservoir.validate()
            self.assertEqual(caught.exception.status_name, "internal")
        finally:
            lib.reservoir_validate = real
        reservoir.validate()


class SummaryTest(unittest.TestCase):
    """memory_summary() is the C library's table (Allocator::summary), asked for with
    reservoir_summary_with_options; Python formats nothing."""

    def test_layout(self):
        ptr = reservoir.raw_alloc(3 * MiB)
        try:
            text = reservoir.memory_summary()
        finally:
            reservoir.raw_free(ptr)
        lines = text.rstrip("\n").split("\n")
        widths = {len(line) for line in lines}
        self.assertEqual(widths, {85}, text)
        self.assertIn("Reservoir memory summary, device 0 (sim", text)
        for label in ("Allocated memory", "Active memory", "Requested memory",
                      "Reserved memory", "Non-releasable memory", "Allocations",
                      "Active allocs", "Reserved segments", "Non-releasable allocs",
                      "Oversize allocations", "Oversize segments", "from large pool",
                      "from small pool", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed",
                      "Private pools (CUDA graphs, MemPool): 0", "Processes using the device"):
            self.assertIn(label, text)
        requested = next(line for line in lines if line.startswith("| Requested memory"))
        cells = [cell.strip() for cell in requested.split("|")[2:-1]]
        self.assertEqual(cells[0], "3.00 MiB", requested)

    def test_sync_and_split_line_is_added_to_the_c_table(self):
        stats = reservoir.memory_stats()
        text = reservoir.memory_summary()
        line = "synchronizations of all streams: %d   max split size: unlimited" % (
            stats["num_sync_all_streams"])
        self.assertIn(line, text)
        # The rest is the table C and C++ get.
        plain = [row for row in text.split("\n") if "synchronizations of all streams" not in row]
        self.assertEqual("\n".join(plain), reservoir.engine_summary())
        result = run_python("import reservoir\nprint(reservoir.memory_summary())\n",
                            RESERVOIR_ALLOC_CONF="device:sim,max_split_size_mb:256")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("max split size: 256.00 MiB", result.stdout)

    def test_abbreviated_and_explicit_device(self):
        text = reservoir.memory_summary(device=0, abbreviated=True)
        self.assertNotIn("from large pool", text)
        self.assertIn("Allocated memory", text)
        self.assertIn("synchronizations of all streams", text)
        self.assertIn("from large pool", reservoir.memory_summary(device=0))

    def test_unknown_option_bits_are_refused(self):
        lib = _lib.load()
        needed = ctypes.c_size_t(0)
        status = lib.reservoir_summary_with_options(0, 4, None, 0, ctypes.byref(needed))
        self.assertEqual(status, 3)  # RESERVOIR_ERROR_INVALID_ARGUMENT
        self.assertIn("unknown option bits 4", lib.reservoir_last_error().decode())

    def test_engine_summary(self):
        ptr = reservoir.raw_alloc(3 * MiB)
        try:
            text = reservoir.engine_summary()
            stats = reservoir.memory_stats()
        finally:
            reservoir.raw_free(ptr)
        self.assertIn("Reservoir memory summary, device 0 (sim", text)
        self.assertIn("device allocs/frees: %d/%d" % (stats["num_device_alloc"],
                                                      stats["num_device_free"]), text)
        self.assertNotIn("synchronizations of all streams", text)
        # The Allocations row's current and peak counts are the statistics'.
        row = next(line for line in text.split("\n") if line.startswith("| Allocations "))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        self.assertEqual(int(cells[1]), stats["allocation.all.current"])
        self.assertEqual(int(cells[2]), stats["allocation.all.peak"])


class ConfigTest(unittest.TestCase):
    def test_unknown_key_is_a_value_error_with_the_c_message(self):
        before = reservoir.config_string()
        with self.assertRaises(reservoir.ReservoirConfigError) as caught:
            reservoir.update_config("no_such_key:1")
        self.assertIsInstance(caught.exception, ValueError)
        self.assertIn("no_such_key", str(caught.exception))
        self.assertEqual(caught.exception.status_name, "config")
        self.assertEqual(str(caught.exception), _lib.load().reservoir_last_error().decode())
        self.assertEqual(reservoir.config_string(), before)

    def test_bad_value(self):
        with self.assertRaises(ValueError) as caught:
            reservoir.update_config({"max_split_size_mb": "lots"})
        self.assertIn("max_split_size_mb", str(caught.exception))
        with self.assertRaises(TypeError):
            reservoir.update_config(42)

    def test_valid_config_applies(self):
        result = run_python(
            "import reservoir\n"
            "reservoir.update_config({'max_split_size_mb': 256})\n"
            "print(reservoir.memory_stats()['max_split_size'])\n"
            "print(reservoir.config_string())\n"
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.split("\n")
        self.assertEqual(int(lines[0]), 256 * MiB)
        self.assertIn("max_split_size_mb", lines[1])

    def test_environment_config(self):
        result = run_python(
            "import reservoir\nprint(reservoir.memory_stats()['max_split_size'])\n",
            RESERVOIR_ALLOC_CONF="device:sim,max_split_size_mb:128",
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(int(result.stdout), 128 * MiB)

    def test_bad_environment_config_is_reported_at_first_use(self):
        result = run_python(
            "import reservoir\n"
            "try:\n"
            "    reservoir.memory_stats()\n"
            "except ValueError as e:\n"
            "    print(type(e).__name__, e)\n",
            RESERVOIR_ALLOC_CONF="device:sim,bogus_key:1",
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("ReservoirConfigError", result.stdout)
        self.assertIn("bogus_key", result.stdout)


class MemoryFractionTest(unittest.TestCase):
    def tearDown(self):
        reservoir.set_memory_fraction(1.0)

    def test_set_and_get(self):
        reservoir.set_memory_fraction(0.5)
        self.assertEqual(reservoir.get_memory_fraction(), 0.5)
        reservoir.set_memory_fraction(0.25, device=0)
        self.assertEqual(reservoir.get_memory_fraction(0), 0.25)

    def test_out_of_range(self):
        for bad in (1.5, -0.1, float("nan"), float("inf")):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
                reservoir.set_memory_fraction(bad)
            self.assertIsInstance(caught.exception, ValueError)
            self.assertIn(str(bad), str(caught.exception).lower())
        with self.assertRaises(TypeError):
            reservoir.set_memory_fraction("half")
        self.assertEqual(reservoir.get_memory_fraction(), 1.0)

    def test_unknown_device(self):
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.set_memory_fraction(0.5, device=1000)

    def test_zero_fraction_refuses_new_segments(self):
        reservoir.empty_cache()
        reservoir.set_memory_fraction(0.0)
        ooms = current("num_ooms")
        with self.assertRaises(reservoir.ReservoirOutOfMemoryError) as caught:
            reservoir.raw_alloc(4 * MiB)
        self.assertTrue(str(caught.exception))
        self.assertEqual(current("num_ooms"), ooms + 1)


class IntegrationModulesTest(unittest.TestCase):
    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "torch is installed")
    def test_torch_module_without_torch(self):
        import reservoir.torch as rt

        self.assertFalse(rt.is_installed())
        with self.assertRaises(ImportError) as caught:
            rt.install()
        self.assertIn("PyTorch", str(caught.exception))

    @unittest.skipIf(importlib.util.find_spec("cupy") is not None, "cupy is installed")
    def test_cupy_module_without_cupy(self):
        import reservoir.cupy as rc

        with self.assertRaises(ImportError) as caught:
            rc.install()
        self.assertIn("CuPy", str(caught.exception))

    def test_torch_hook_symbols_are_exported(self):
        import reservoir.torch as rt

        lib = _lib.load()
        for symbol in [rt.MALLOC_SYMBOL, rt.FREE_SYMBOL] + [s for _, s in rt.HOOKS]:
            self.assertTrue(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value, symbol)

    def test_torch_free_hook_never_raises(self):
        # Called from tensor destructors: a bad pointer is reported once on stderr.
        result = run_python(
            "import ctypes, reservoir\n"
            "lib = ctypes.CDLL(reservoir.library_path())\n"
            "f = lib.reservoir_torch_free\n"
            "f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]\n"
            "f(0x1000, 16, 0, None)\n"
            "f(0x2000, 16, 0, None)\n"
            "print('alive')\n"
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("alive", result.stdout)
        self.assertEqual(result.stderr.count("reservoir: freeing"), 1, result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)

    def test_torch_malloc_hook_round_trip_on_sim(self):
        result = run_python(
            "import ctypes, reservoir\n"
            "lib = ctypes.CDLL(reservoir.library_path())\n"
            "m = lib.reservoir_torch_malloc\n"
            "m.restype = ctypes.c_void_p\n"
            "m.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]\n"
            "f = lib.reservoir_torch_free\n"
            "f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]\n"
            "p = m(5000, 0, None)\n"
            "print(reservoir.memory_stats()['requested_bytes.all.current'])\n"
            "f(p, 5000, 0, None)\n"
            "print(reservoir.memory_stats()['requested_bytes.all.current'])\n"
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.split(), ["5000", "0"])
        self.assertEqual(result.stderr, "")


class DeviceIndexTest(unittest.TestCase):
    def test_conversions(self):
        index = reservoir._device_index
        self.assertEqual(index(None), -1)
        self.assertEqual(index(2), 2)
        self.assertEqual(index("cuda"), -1)
        self.assertEqual(index("cuda:3"), 3)

        class TorchDevice:
            type = "cuda"
            index = None

        self.assertEqual(index(TorchDevice()), -1)
        TorchDevice.index = 1
        self.assertEqual(index(TorchDevice()), 1)

        class CupyDevice:
            id = 4

        self.assertEqual(index(CupyDevice()), 4)
        with self.assertRaises(TypeError):
            index(True)
        for bad in ("cuda:x", "cuda:", "cuda:-1", "cpu"):
            with self.assertRaises(ValueError):
                index(bad)


if __name__ == "__main__":
    unittest.main()
