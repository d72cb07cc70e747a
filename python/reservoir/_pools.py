"""Private memory pools from Python (docs/pools.md).

    pool = reservoir.MemPool()                 # its own segments and blocks
    with reservoir.use_mem_pool(pool):
        buf = reservoir.raw_alloc(1 << 20)     # this thread's requests go to the pool
    state = reservoir.checkpoint_pool(pool.id)
    ...
    freed, allocated = reservoir.restore_pool(state)

A pool id is a pair of ints, as PyTorch's MempoolId_t. The pool lives while it has
uses: a MemPool object is one (released when the object goes away, or by
release()), each use_mem_pool block another while it runs.
"""

import contextlib
import ctypes
import sys

from . import _args, _lib


def _id(pool_id):
    first, second = pool_id
    return _lib.PoolId(first, second)


def _pair(pool_id):
    """The id of pool (a MemPool, refused once released, or an id), checked."""
    if isinstance(pool_id, MemPool):
        return pool_id._live_id()
    return _args.pool_id(pool_id)


def _device_of(pool, device):
    """The device index for a call on pool: a MemPool's own device, which an
    explicit device must name too; else device (None: the current one)."""
    if not isinstance(pool, MemPool):
        return _args.device_index(device)
    if device is not None:
        index = _device_at(_args.device_index(device))
        if index != pool.device:
            raise _args.invalid("%r lives on device %d, not on device %d"
                                % (pool, pool.device, index))
    return pool.device


def _device_at(index):
    """index, with -1 (the current device) resolved to the device it names now."""
    if index != -1:
        return index
    current = ctypes.c_int(0)
    _lib.check(_lib.load().reservoir_current_device(ctypes.byref(current)))
    return current.value


def private_pool_stats(device=None):
    """{"private_pool_reserved_bytes": bytes of reserved memory held by private pools,
    "private_pools": how many exist} (not in memory_stats(), whose keys are PyTorch's)."""
    reserved = ctypes.c_int64(0)
    pools = ctypes.c_int64(0)
    _lib.check(_lib.load().reservoir_private_pool_stats(
        _args.device_index(device), ctypes.byref(reserved), ctypes.byref(pools)))
    return {"private_pool_reserved_bytes": reserved.value, "private_pools": pools.value}


def retain_pool(pool_id, device=None, use_on_oom=False, no_split=False):
    """Creates the pool named pool_id (use count 1) or adds a use of it."""
    _lib.check(_lib.load().reservoir_pool_retain(
        _device_of(pool_id, device), _id(_pair(pool_id)), int(bool(use_on_oom)),
        int(bool(no_split))))


def release_pool(pool_id, device=None, empty_cache=False):
    """Drops a use of the pool; at 0 its memory goes back once its blocks are freed
    (at the next empty_cache). empty_cache: when that was the last use, its cached
    memory goes back now (torch.cuda.MemPool's destructor; not during a capture)."""
    lib = _lib.load()
    release = lib.reservoir_pool_release_and_empty if empty_cache else lib.reservoir_pool_release
    _lib.check(release(_device_of(pool_id, device), _id(_pair(pool_id))))


def pool_use_count(pool_id, device=None):
    count = ctypes.c_int(0)
    _lib.check(_lib.load().reservoir_pool_use_count(_device_of(pool_id, device),
                                                    _id(_pair(pool_id)), ctypes.byref(count)))
    return count.value


def pool_usage(pool, device=None):
    """What the pool (a MemPool or an id) holds now: {"reserved_bytes": its segments'
    device memory, "allocated_bytes": its allocated blocks'} (a released pool's too,
    until its memory is gone)."""
    reserved, allocated = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _lib.check(_lib.load().reservoir_pool_usage(_device_of(pool, device), _id(_pair(pool)),
                                                ctypes.byref(reserved), ctypes.byref(allocated)))
    return {"reserved_bytes": reserved.value, "allocated_bytes": allocated.value}


# The callbacks of every segment source given to a MemPool: kept for the life of the
# process, since a released pool's segments go back through them later (empty_cache).
_SOURCES = []
_OK, _OUT_OF_MEMORY, _DEVICE_ERROR = 0, 1, 5


def _source_callbacks(source):
    """The C callbacks over a Python segment source (see MemPool)."""
    def alloc(_ctx, device, size, stream, out):
        try:
            address = source.allocate(device, size, stream)
        except MemoryError:
            return _OUT_OF_MEMORY
        except Exception as e:  # noqa: BLE001 - any failure is the device error it reports
            print("reservoir: segment source %r failed to allocate %d bytes: %s"
                  % (source, size, e), file=sys.stderr)
            return _DEVICE_ERROR
        if not address:
            return _OUT_OF_MEMORY
        out[0] = address
        return _OK

    def free(_ctx, device, ptr, size, stream):
        try:
            source.deallocate(device, ptr, size, stream)
        except Exception as e:  # noqa: BLE001
            print("reservoir: segment source %r failed to free %#x: %s" % (source, ptr, e),
                  file=sys.stderr)
            return _DEVICE_ERROR
        return _OK

    callbacks = (_lib.SEGMENT_ALLOC_FN(alloc), _lib.SEGMENT_FREE_FN(free))
    _SOURCES.append((source, callbacks))
    return callbacks


def _function(prototype, address):
    """A C function pointer of prototype at address (a NULL one for None: refused by
    the library with the argument's name)."""
    return prototype(address) if address else ctypes.cast(None, prototype)


class MemPool:
    """A private pool of device memory (as torch.cuda.MemPool): its blocks never serve
    requests outside it, except, with use_on_oom, when the device is out of memory;
    with no_split its blocks are never split. pool_id: adopt that id (e.g. one from
    torch.cuda.graph_pool_handle()) instead of a fresh one.

    segment_source: the pool's segments come from it instead of the device (as
    torch.cuda.MemPool(allocator=...)): an object with allocate(device, size, stream)
    returning an address (512-byte aligned; 0 or MemoryError: none now) and
    deallocate(device, address, size, stream), called once no block of the segment is
    in use and the pool's stream has been waited for. It must not call Reservoir, and
    is kept for the life of the process (docs/pools.md).

    pluggable: the pool's segments come from two C functions of the shape of PyTorch's
    CUDAPluggableAllocator, given as addresses (alloc_address, free_address):
    alloc(size, device, stream) -> pointer (NULL: none), free(ptr, size, device,
    stream); what torch.cuda.MemPool(allocator=...) of a
    torch.cuda.memory.CUDAPluggableAllocator gives under reservoir.torch. No Python
    runs on their path."""

    def __init__(self, use_on_oom=False, no_split=False, device=None, pool_id=None,
                 segment_source=None, pluggable=None):
        self._released = True  # until the pool exists: __del__ then releases nothing
        # The device now current, not -1: the pool stays on it if the current one changes.
        self._device = _device_at(_args.device_index(device))
        if segment_source is not None and pluggable is not None:
            raise _args.invalid("MemPool: give segment_source or pluggable, not both")
        if pluggable is not None:
            if pool_id is not None:
                raise _args.invalid("MemPool: pluggable makes a new pool; "
                                    "it cannot adopt pool_id %r" % (pool_id,))
            if not isinstance(pluggable, (tuple, list)) or len(pluggable) != 2:
                raise TypeError("MemPool: pluggable must be (alloc_address, free_address), "
                                "got %r" % (pluggable,))
            alloc_address = _args.address(pluggable[0], "alloc")
            free_address = _args.address(pluggable[1], "free")
            made = _lib.PoolId()
            _lib.check(_lib.load().reservoir_pool_create_with_pluggable(
                self._device, int(bool(use_on_oom)), int(bool(no_split)),
                _function(_lib.PLUGGABLE_ALLOC_FN, alloc_address),
                _function(_lib.PLUGGABLE_FREE_FN, free_address),
                ctypes.byref(made)))
            self._id = (made.first, made.second)
        elif segment_source is not None:
            if pool_id is not None:
                raise _args.invalid("MemPool: segment_source makes a new pool; "
                                    "it cannot adopt pool_id %r" % (pool_id,))
            for name in ("allocate", "deallocate"):
                if not callable(getattr(segment_source, name, None)):
                    raise TypeError("MemPool: segment_source needs an %s method, %r has none"
                                    % (name, segment_source))
            alloc, free = _source_callbacks(segment_source)
            made = _lib.PoolId()
            _lib.check(_lib.load().reservoir_pool_create_with_source(
                self._device, int(bool(use_on_oom)), int(bool(no_split)), alloc, free, None,
                ctypes.byref(made)))
            self._id = (made.first, made.second)
        elif pool_id is None:
            made = _lib.PoolId()
            _lib.check(_lib.load().reservoir_pool_create(
                self._device, int(bool(use_on_oom)), int(bool(no_split)), ctypes.byref(made)))
            self._id = (made.first, made.second)
        else:
            self._id = _pair(pool_id)
            retain_pool(self._id, self._device, use_on_oom, no_split)
        self._released = False

    def _live_id(self):
        """The id, for a call on the pool; refused once release() ran: the pool may
        be gone, and a route to its id would create a new one unnoticed."""
        if self._released:
            raise _args.invalid("%r was released (MemPool.release()); "
                                "create a new MemPool" % (self,))
        return self._id

    @property
    def id(self):
        """The pool's id, a tuple of two ints."""
        return self._id

    @property
    def device(self):
        return self._device

    def use_count(self):
        """Uses of the pool: this object, and every use_mem_pool block running."""
        return pool_use_count(self._live_id(), self._device)

    def release(self, empty_cache=False):
        """Drops this object's use now (idempotent). empty_cache: when that was the
        last use, the pool's cached memory goes back to the device now."""
        if not self._released:
            self._released = True
            release_pool(self._id, self._device, empty_cache=empty_cache)

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown, or the library is gone
            pass

    def __repr__(self):
        return "reservoir.MemPool(id=%r, device=%d)" % (self._id, self._device)


@contextlib.contextmanager
def use_mem_pool(pool, device=None):
    """Routes the calling thread's requests to pool (a MemPool or an id) while the
    block runs; the block holds a use of the pool."""
    index = _device_of(pool, device)
    pool_id = _id(_pair(pool))
    lib = _lib.load()
    _lib.check(lib.reservoir_pool_begin_thread(index, pool_id))
    try:
        yield pool
    finally:
        _lib.check(lib.reservoir_pool_end(index, pool_id))
        _lib.check(lib.reservoir_pool_release(index, pool_id))


@contextlib.contextmanager
def capture_to_pool(pool, stream, device=None):
    """Routes requests on stream (a graph capture on it) to pool while the block
    runs: frees wait and nothing returns to the device until it ends. stream as for
    raw_alloc()."""
    handle = _args.stream_handle(stream)
    index = _device_of(pool, device)
    pool_id = _id(_pair(pool))
    lib = _lib.load()
    _lib.check(lib.reservoir_pool_begin_capture(index, pool_id, handle))
    try:
        yield pool
    finally:
        _lib.check(lib.reservoir_pool_end(index, pool_id))
        _lib.check(lib.reservoir_pool_release(index, pool_id))


class PoolCheckpoint:
    """A recorded state of a private pool (reservoir.checkpoint_pool)."""

    def __init__(self, handle, pool_id, device):
        self._handle = ctypes.c_void_p(handle)
        self.pool_id = pool_id
        self.device = device

    def __del__(self):
        try:
            if self._handle:
                _lib.load().reservoir_pool_checkpoint_free(self._handle)
                self._handle = ctypes.c_void_p(None)
        except Exception:
            pass


def checkpoint_pool(pool, device=None):
    """The pool's segments and each block's state now (pending frees are waited for)."""
    index = _device_of(pool, device)
    pool_id = _pair(pool)
    handle = ctypes.c_void_p()
    _lib.check(_lib.load().reservoir_pool_checkpoint_take(index, _id(pool_id),
                                                          ctypes.byref(handle)))
    return PoolCheckpoint(handle.value, pool_id, index)


def restore_pool(checkpoint):
    """Rolls the pool back to checkpoint: every allocated block of it is freed, then
    the blocks the checkpoint records as allocated are allocated again. Returns
    (freed, allocated): lists of addresses (ints)."""
    if not isinstance(checkpoint, PoolCheckpoint):
        raise TypeError("checkpoint must be a reservoir.PoolCheckpoint (from "
                        "checkpoint_pool()), not %s" % type(checkpoint).__name__)
    lib = _lib.load()
    result = ctypes.c_void_p()
    _lib.check(lib.reservoir_pool_checkpoint_restore(checkpoint._handle, ctypes.byref(result)))
    try:
        lists = []
        for which in (0, 1):
            n = lib.reservoir_pool_restore_count(result, which)
            lists.append([lib.reservoir_pool_restore_pointer(result, which, i) or 0
                          for i in range(n)])
        return lists[0], lists[1]
    finally:
        lib.reservoir_pool_restore_free(result)


def pool_live_allocations_are(pool, addresses, device=None):
    """Whether the pool's allocated blocks are exactly the given addresses."""
    index = _device_of(pool, device)
    pool_id = _id(_pair(pool))
    if isinstance(addresses, (str, bytes)) or not hasattr(addresses, "__iter__"):
        raise TypeError("addresses must be an iterable of ints, not %s"
                        % type(addresses).__name__)
    items = list(set(_args.address(a, "address") or 0 for a in addresses))
    array = (ctypes.c_void_p * max(1, len(items)))(*items)
    result = ctypes.c_int(0)
    _lib.check(_lib.load().reservoir_pool_live_allocations_are(
        index, pool_id, array, len(items), ctypes.byref(result)))
    return bool(result.value)
