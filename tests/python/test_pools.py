"""Private pools from Python (reservoir.MemPool, use_mem_pool, checkpoints), on the
simulated device (CTest python_package; docs/pools.md)."""

import importlib.util
import os
import sys
import threading
import unittest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if importlib.util.find_spec("reservoir") is None:
    sys.path.insert(0, os.path.join(_REPO, "python"))

import reservoir  # noqa: E402

MiB = 1 << 20


def pool_segments(pool_id):
    import pickle
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "s.pickle")
        reservoir.dump_snapshot(path)
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
    return [s for s in snapshot["segments"] if tuple(s["segment_pool_id"]) == tuple(pool_id)]


class MemPoolTest(unittest.TestCase):
    def tearDown(self):
        reservoir.empty_cache()
        reservoir.validate()

    def test_use_mem_pool_routes_this_thread_only(self):
        pool = reservoir.MemPool()
        self.assertEqual(pool.use_count(), 1)
        other = []
        with reservoir.use_mem_pool(pool):
            self.assertEqual(pool.use_count(), 2)
            mine = reservoir.raw_alloc(MiB)
            thread = threading.Thread(target=lambda: other.append(reservoir.raw_alloc(MiB)))
            thread.start()
            thread.join()
        self.assertEqual(pool.use_count(), 1)
        segments = pool_segments(pool.id)
        self.assertEqual(len(segments), 1)
        base = segments[0]["address"]
        self.assertTrue(base <= mine < base + segments[0]["total_size"])
        self.assertFalse(base <= other[0] < base + segments[0]["total_size"])
        self.assertTrue(reservoir.pool_live_allocations_are(pool, [mine]))
        self.assertEqual(reservoir.pool_usage(pool),
                         {"reserved_bytes": segments[0]["total_size"], "allocated_bytes": MiB})
        stats = reservoir.private_pool_stats()
        self.assertEqual(stats["private_pools"], 1)
        self.assertEqual(stats["private_pool_reserved_bytes"], segments[0]["total_size"])
        self.assertIn("Private pools (CUDA graphs, MemPool): 1", reservoir.memory_summary())
        reservoir.raw_free(mine)
        reservoir.raw_free(other[0])
        pool.release()
        pool.release()  # idempotent
        reservoir.empty_cache()
        self.assertEqual(reservoir.private_pool_stats()["private_pools"], 0)
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            pool.use_count()

    def test_checkpoint_and_restore(self):
        pool = reservoir.MemPool()
        with reservoir.use_mem_pool(pool):
            x = reservoir.raw_alloc(256 << 10)
            y = reservoir.raw_alloc(256 << 10)
        state = reservoir.checkpoint_pool(pool)
        reservoir.raw_free(x)
        with reservoir.use_mem_pool(pool):
            z = reservoir.raw_alloc(64 << 10)
        freed, allocated = reservoir.restore_pool(state)
        self.assertEqual(sorted(freed), sorted([y, z]))
        self.assertEqual(sorted(allocated), sorted([x, y]))
        self.assertTrue(reservoir.pool_live_allocations_are(pool, [x, y]))
        for p in allocated:
            reservoir.raw_free(p)
        del pool

    def test_capture_to_pool_and_bad_ids(self):
        pool = reservoir.MemPool(no_split=True)
        with reservoir.capture_to_pool(pool, stream=7):
            p = reservoir.raw_alloc(4096, stream=7)
            q = reservoir.raw_alloc(4096, stream=8)
        self.assertEqual(len(pool_segments(pool.id)), 1)
        reservoir.raw_free(p)
        reservoir.raw_free(q)
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.release_pool((0, 123456789))
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.retain_pool((0, 0))
        adopted = reservoir.MemPool(pool_id=(0, 31337))
        self.assertEqual(adopted.id, (0, 31337))
        self.assertEqual(reservoir.pool_use_count((0, 31337)), 1)
        adopted.release()


class HostSource:
    """A segment source over host buffers (512-byte aligned views into ctypes arrays)."""

    def __init__(self):
        self.live = {}
        self.allocs = 0
        self.frees = 0
        self.refuse = None

    def allocate(self, device, size, stream):
        import ctypes

        self.allocs += 1
        if self.refuse is not None:
            raise self.refuse
        buffer = (ctypes.c_char * (size + 512))()
        address = (ctypes.addressof(buffer) + 511) & ~511
        self.live[address] = (buffer, size, stream)
        return address

    def deallocate(self, device, address, size, stream):
        self.frees += 1
        buffer, kept, _ = self.live.pop(address)
        assert kept == size


class SegmentSourceTest(unittest.TestCase):
    def tearDown(self):
        reservoir.empty_cache()
        reservoir.validate()

    def test_the_pools_segments_come_from_the_source_and_go_back_through_it(self):
        source = HostSource()
        pool = reservoir.MemPool(segment_source=source)
        with reservoir.use_mem_pool(pool):
            a = reservoir.raw_alloc(MiB // 2)
            b = reservoir.raw_alloc(MiB // 2)  # the same segment, split
        self.assertEqual(source.allocs, 1)
        (base, (_, size, _)), = source.live.items()
        for p in (a, b):
            self.assertTrue(base <= p < base + size)
        reservoir.raw_free(a)
        reservoir.raw_free(b)
        pool.release()
        reservoir.empty_cache()
        self.assertEqual(source.frees, 1)
        self.assertEqual(source.live, {})

    def test_its_failures_are_out_of_memory_or_device_errors(self):
        source = HostSource()
        pool = reservoir.MemPool(segment_source=source)
        with reservoir.use_mem_pool(pool):
            source.refuse = MemoryError()
            with self.assertRaises(reservoir.ReservoirOutOfMemoryError):
                reservoir.raw_alloc(4 * MiB)
            source.refuse = RuntimeError("the test's source broke")
            with self.assertRaises(reservoir.ReservoirDeviceError):
                reservoir.raw_alloc(4 * MiB)
        pool.release()

    def test_a_source_without_the_two_methods_or_with_a_pool_id_is_refused(self):
        with self.assertRaises(TypeError):
            reservoir.MemPool(segment_source=object())
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.MemPool(segment_source=HostSource(), pool_id=(0, 1))


# C functions of the shape of PyTorch's CUDAPluggableAllocator over host memory, with
# counters: what torch.cuda.memory.CUDAPluggableAllocator loads from a program's library.
PLUGGABLE_SOURCE = r"""
#include <stdlib.h>
static int allocs, frees, refuse;
void* test_alloc(size_t size, int device, void* stream) {
  (void)device; (void)stream;
  ++allocs;
  return refuse ? NULL : aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
}
void test_free(void* ptr, size_t size, int device, void* stream) {
  (void)size; (void)device; (void)stream;
  ++frees;
  free(ptr);
}
int test_allocs(void) { return allocs; }
int test_frees(void) { return frees; }
void test_refuse(int on) { refuse = on; }
"""


def build_pluggable(folder):
    """The library above, built with the system's C compiler; None without one."""
    import shutil
    import subprocess

    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None
    source = os.path.join(folder, "pluggable.c")
    with open(source, "w") as f:
        f.write(PLUGGABLE_SOURCE)
    library = os.path.join(folder, "libpluggable.so")
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", source, "-o", library], check=True)
    return library


class PluggableMemPoolTest(unittest.TestCase):
    """torch.cuda.MemPool(allocator=X) under reservoir.torch, X a
    torch.cuda.memory.CUDAPluggableAllocator: the pool's segments come from X's C
    functions (on a stand-in for torch that loads them as PyTorch does)."""

    def setUp(self):
        import ctypes
        import tempfile
        import types

        from reservoir import _torch_pools

        self.folder = tempfile.TemporaryDirectory()
        self.addCleanup(self.folder.cleanup)
        self.library = build_pluggable(self.folder.name)
        if self.library is None:
            self.skipTest("no C compiler")
        self.lib = ctypes.CDLL(self.library)

        class CUDAPluggableAllocator:  # as torch.cuda.memory's
            def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
                allocator = ctypes.CDLL(path_to_so_file)
                alloc_fn = ctypes.cast(getattr(allocator, alloc_fn_name), ctypes.c_void_p).value
                free_fn = ctypes.cast(getattr(allocator, free_fn_name), ctypes.c_void_p).value
                assert alloc_fn is not None and free_fn is not None
                self._allocator = types.SimpleNamespace(functions=(alloc_fn, free_fn))

        class MemPool:  # a PyTorch whose MemPool has the allocator property
            allocator = None

        memory = types.SimpleNamespace(__name__="torch.cuda.memory", MemPool=MemPool,
                                       CUDAPluggableAllocator=CUDAPluggableAllocator)
        cuda = types.SimpleNamespace(__name__="torch.cuda", memory=memory, MemPool=MemPool,
                                     current_device=lambda: 0,
                                     graph_pool_handle=lambda: (0, 424242))
        self.torch = types.SimpleNamespace(cuda=cuda, _C=types.SimpleNamespace())
        self.replaced = _torch_pools.patch(self.torch, native=True)

    def tearDown(self):
        reservoir.empty_cache()
        reservoir.validate()

    def test_the_pools_segments_come_from_the_allocators_functions(self):
        self.assertIn("torch.cuda.memory.CUDAPluggableAllocator.__init__", self.replaced)
        made = self.torch.cuda.memory.CUDAPluggableAllocator(self.library, "test_alloc",
                                                             "test_free")
        # vLLM passes the C++ allocator (._allocator); the wrapper works as well.
        for allocator in (made._allocator, made):
            allocs, frees = self.lib.test_allocs(), self.lib.test_frees()
            pool = self.torch.cuda.MemPool(allocator)
            self.addCleanup(pool.release)
            self.assertIs(pool.allocator, allocator)
            with reservoir.use_mem_pool(pool):
                a = reservoir.raw_alloc(3 * MiB)
                b = reservoir.raw_alloc(2 * MiB)  # a block split off the same segment
            self.assertEqual(self.lib.test_allocs(), allocs + 1)
            mine = [s for s in reservoir.segments() if s["pool"] == pool.id]
            self.assertEqual(len(mine), 1)
            for p in (a, b):
                self.assertTrue(mine[0]["address"] <= p < mine[0]["address"] + mine[0]["size"])
            reservoir.raw_free(a)
            reservoir.raw_free(b)
            pool.release()
            reservoir.empty_cache()
            self.assertEqual(self.lib.test_frees(), frees + 1)

    def test_mem_pool_has_allocator_only_where_pytorchs_has_it(self):
        import types

        from reservoir import _torch_pools

        # torch 2.11's MemPool has no allocator attribute: neither has Reservoir's there.
        older = types.SimpleNamespace(cuda=types.SimpleNamespace(
            MemPool=object, current_device=lambda: 0, graph_pool_handle=lambda: (0, 424243)))
        pool = _torch_pools.make_mem_pool(older)()
        self.addCleanup(pool.release)
        self.assertFalse(hasattr(pool, "allocator"))
        pool = self.torch.cuda.MemPool()
        self.addCleanup(pool.release)
        self.assertIsNone(pool.allocator)

    def test_releasing_the_last_use_gives_the_pools_memory_back_at_once(self):
        # As PyTorch's MemPool destructor (emptyCache with the pool active): no
        # empty_cache needed, and a pool still routed to keeps its memory.
        made = self.torch.cuda.memory.CUDAPluggableAllocator(self.library, "test_alloc",
                                                             "test_free")
        pool = self.torch.cuda.MemPool(made)
        with reservoir.use_mem_pool(pool):
            reservoir.raw_free(reservoir.raw_alloc(3 * MiB))
        frees = self.lib.test_frees()
        pool.release()
        self.assertEqual(self.lib.test_frees(), frees + 1)
        self.assertEqual([s for s in reservoir.segments() if s["pool"] == pool.id], [])
        # A plain reservoir.MemPool keeps reservoir's rule: back at the next empty_cache.
        plain = reservoir.MemPool(pluggable=reservoir._torch_pools.pluggable_functions(made))
        with reservoir.use_mem_pool(plain):
            reservoir.raw_free(reservoir.raw_alloc(3 * MiB))
        frees = self.lib.test_frees()
        plain.release()
        self.assertEqual(self.lib.test_frees(), frees)
        reservoir.empty_cache()
        self.assertEqual(self.lib.test_frees(), frees + 1)

    def test_an_allocator_that_has_nothing_is_out_of_memory(self):
        made = self.torch.cuda.memory.CUDAPluggableAllocator(self.library, "test_alloc",
                                                             "test_free")
        pool = self.torch.cuda.MemPool(made._allocator)
        self.lib.test_refuse(1)
        try:
            with reservoir.use_mem_pool(pool):
                with self.assertRaises(reservoir.ReservoirOutOfMemoryError):
                    reservoir.raw_alloc(MiB)
        finally:
            self.lib.test_refuse(0)
            pool.release()

    def test_other_allocators_and_bad_functions_are_refused(self):
        with self.assertRaises(RuntimeError) as caught:
            self.torch.cuda.MemPool(object())
        self.assertIn("CUDAPluggableAllocator", str(caught.exception))
        with self.assertRaises(TypeError):
            reservoir.MemPool(pluggable=(1,))
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.MemPool(pluggable=(0, 0))  # NULL functions
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError):
            reservoir.MemPool(pluggable=(1, 2), segment_source=HostSource())


class PoolArgumentTest(unittest.TestCase):
    """The pool functions check their arguments as raw_alloc does: before a value
    reaches ctypes (which turned stream 2**64 into stream 0 and a pool id part -1
    into 2**64 - 1) and with the package's errors, never an AttributeError from
    inside it."""

    def tearDown(self):
        reservoir.empty_cache()
        reservoir.validate()

    def test_capture_to_pool_checks_its_stream_as_raw_alloc(self):
        pool = reservoir.MemPool()
        for bad, error in ((-1, reservoir.ReservoirInvalidArgumentError),
                           (1 << 64, reservoir.ReservoirInvalidArgumentError),
                           (1.5, TypeError), ("abc", TypeError), (None, TypeError)):
            with self.assertRaises(error) as caught:
                with reservoir.capture_to_pool(pool, bad):
                    self.fail("capture_to_pool accepted stream %r" % (bad,))
            self.assertIn("stream", str(caught.exception))
            self.assertEqual(pool.use_count(), 1)  # no route begun
        pool.release()

    def test_pool_ids_are_pairs_of_unsigned_64_bit_ints(self):
        before = reservoir.private_pool_stats()["private_pools"]
        for bad in ("nope", None, 7, 1.5):
            for call in (reservoir.checkpoint_pool, reservoir.retain_pool,
                         reservoir.pool_use_count, reservoir.release_pool):
                with self.assertRaises(TypeError) as caught:
                    call(bad)
                self.assertIn("pool must be a MemPool or a pool id", str(caught.exception))
        for bad in ((0, -1), (0, 1 << 64), (1 << 64, 3), (1, 2, 3), ()):
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
                reservoir.retain_pool(bad)
            self.assertIn("pool id", str(caught.exception))
        with self.assertRaises(TypeError):
            reservoir.checkpoint_pool((1.5, 2))
        with self.assertRaises(TypeError):
            reservoir.MemPool(pool_id=("a", "b"))
        self.assertEqual(reservoir.private_pool_stats()["private_pools"], before)

    def test_restore_pool_needs_a_checkpoint(self):
        for bad in (None, "state", (0, 1)):
            with self.assertRaises(TypeError) as caught:
                reservoir.restore_pool(bad)
            self.assertIn("checkpoint must be a reservoir.PoolCheckpoint", str(caught.exception))

    def test_live_allocations_need_an_iterable_of_addresses(self):
        pool = reservoir.MemPool()
        for bad, error in (("abc", TypeError), (None, TypeError), ([1.5], TypeError),
                           ([-1], reservoir.ReservoirInvalidArgumentError)):
            with self.assertRaises(error):
                reservoir.pool_live_allocations_are(pool, bad)
        self.assertTrue(reservoir.pool_live_allocations_are(pool, []))
        pool.release()

    def test_a_mem_pool_names_its_own_device(self):
        pool = reservoir.MemPool()
        self.assertEqual(pool.device, reservoir.current_device())
        self.assertTrue(reservoir.pool_live_allocations_are(pool, [], device=pool.device))
        with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
            reservoir.checkpoint_pool(pool, device=pool.device + 1)
        self.assertIn("lives on device", str(caught.exception))
        pool.release()

    def test_a_released_mem_pool_is_refused_everywhere(self):
        pool = reservoir.MemPool()
        pool.release()
        self.assertEqual(reservoir.private_pool_stats()["private_pools"], 0)

        def route():
            with reservoir.use_mem_pool(pool):
                self.fail("use_mem_pool re-created a released pool")

        def capture():
            with reservoir.capture_to_pool(pool, 0):
                self.fail("capture_to_pool re-created a released pool")

        calls = (route, capture, pool.use_count, lambda: reservoir.checkpoint_pool(pool),
                 lambda: reservoir.pool_live_allocations_are(pool, []),
                 lambda: reservoir.retain_pool(pool), lambda: reservoir.release_pool(pool),
                 lambda: reservoir.pool_use_count(pool),
                 lambda: reservoir.MemPool(pool_id=pool))
        for call in calls:
            with self.assertRaises(reservoir.ReservoirInvalidArgumentError) as caught:
                call()
            self.assertIn("was released", str(caught.exception))
        self.assertEqual(reservoir.private_pool_stats()["private_pools"], 0)
        pool.release()  # still idempotent
        self.assertEqual(pool.id[0], 0)  # the id stays readable


class FreeAndRemoveDeleterTest(unittest.TestCase):
    """cudagraph trees free a path's live outputs with torch._C._free_And_Remove_DeleterFn;
    for a storage a restore adopted (no deleter: a pluggable allocator cannot give it
    one) PyTorch's function would fail with "Expected standard deleter", so Reservoir
    frees the block itself (reservoir._torch_pools)."""

    def fake_torch(self, addresses, calls):
        import types

        class Storage:
            def __init__(self, address):
                self.address = address

            def data_ptr(self):
                return self.address

        def original(cdata):
            calls.append(cdata)
            raise RuntimeError("Expected standard deleter")

        untyped = types.SimpleNamespace(
            _new_with_weak_ptr=lambda cdata: Storage(addresses[cdata]))
        return types.SimpleNamespace(UntypedStorage=untyped,
                                     _C=types.SimpleNamespace(_free_And_Remove_DeleterFn=original))

    def test_an_adopted_storage_is_freed_by_reservoir(self):
        from reservoir import _torch_pools

        address = reservoir.raw_alloc(2 * MiB)
        calls = []
        torch = self.fake_torch({7: address, 8: 12345}, calls)
        _torch_pools._adopted.append((None, address, 0))
        free = _torch_pools.make_free_and_remove_deleter(torch)
        before = reservoir.memory_allocated(0)
        self.assertIsNone(free(7))
        self.assertEqual(calls, [], "PyTorch's function was called for an adopted storage")
        self.assertEqual(reservoir.memory_allocated(0), before - 2 * MiB)
        self.assertFalse(any(entry[1] == address for entry in _torch_pools._adopted))
        # Any other storage goes to PyTorch's own function.
        with self.assertRaises(RuntimeError):
            free(8)
        self.assertEqual(calls, [8])

if __name__ == "__main__":
    unittest.main()
