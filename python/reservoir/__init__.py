"""Reservoir, a caching allocator for CUDA device memory, from Python.

Pure Python over the C API of libreservoir.so (ctypes). The statistics use the
names and meaning of ``torch.cuda.memory_stats()``::

    import reservoir.torch
    reservoir.torch.install()          # first thing, before any CUDA tensor
    ...
    import reservoir
    print(reservoir.memory_stats()["allocated_bytes.all.peak"])
    print(reservoir.memory_summary())

The library is found through RESERVOIR_LIBRARY, else next to this package, else in
the build folders of the repository, else on the loader's search path.
"""

import contextlib
import ctypes

from . import _args, _lib
from ._pools import (
    MemPool,
    PoolCheckpoint,
    capture_to_pool,
    checkpoint_pool,
    pool_live_allocations_are,
    pool_usage,
    pool_use_count,
    private_pool_stats,
    release_pool,
    restore_pool,
    retain_pool,
    use_mem_pool,
)
from ._tags import empty_host_cache, sleep, tag, tag_state, wake
from ._lib import (
    ReservoirConfigError,
    ReservoirDeviceError,
    ReservoirError,
    ReservoirInternalError,
    ReservoirInvalidArgumentError,
    ReservoirInvalidPointerError,
    ReservoirIoError,
    ReservoirLibraryNotFoundError,
    ReservoirOutOfMemoryError,
)

__version__ = "0.1.0"

__all__ = [
    "MemPool",
    "PoolCheckpoint",
    "capture_to_pool",
    "checkpoint_pool",
    "pool_live_allocations_are",
    "pool_usage",
    "pool_use_count",
    "private_pool_stats",
    "release_pool",
    "restore_pool",
    "retain_pool",
    "use_mem_pool",
    "sleep",
    "tag",
    "tag_state",
    "wake",
    "ReservoirConfigError",
    "ReservoirDeviceError",
    "ReservoirError",
    "ReservoirInternalError",
    "ReservoirInvalidArgumentError",
    "ReservoirInvalidPointerError",
    "ReservoirIoError",
    "ReservoirLibraryNotFoundError",
    "ReservoirOutOfMemoryError",
    "attach_oom_observer",
    "attach_trace_tracker",
    "backend_name",
    "base_allocation",
    "close",
    "config_string",
    "current_device",
    "device_count",
    "dump_snapshot",
    "empty_cache",
    "empty_host_cache",
    "engine_summary",
    "get_memory_fraction",
    "largest_cached_block",
    "library_path",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "metrics",
    "metrics_json",
    "notify_host_wait",
    "open",
    "raw_alloc",
    "raw_free",
    "record_history",
    "record_stream",
    "release_stream",
    "record_trace",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_allocator_settings",
    "set_memory_fraction",
    "segments",
    "share",
    "start_trace_recording",
    "stop_trace_recording",
    "unshare",
    "update_config",
    "validate",
]


# None, an int, "cuda:N", a torch.device or a cupy.cuda.Device -> an index (-1:
# the current device), checked (see _args).
_device_index = _args.device_index


def library_path():
    """Path of the libreservoir.so in use (loads it; raises
    ReservoirLibraryNotFoundError with the places tried)."""
    return _lib.path()


def backend_name():
    """The device backend in use: "cuda" or "sim" (the simulated device)."""
    name = ctypes.c_char_p()
    _lib.check(_lib.load().reservoir_backend_name(ctypes.byref(name)))
    return name.value.decode()


def device_count():
    count = ctypes.c_int(0)
    _lib.check(_lib.load().reservoir_device_count(ctypes.byref(count)))
    return count.value


def current_device():
    device = ctypes.c_int(0)
    _lib.check(_lib.load().reservoir_current_device(ctypes.byref(device)))
    return device.value


def _config_text(config):
    if isinstance(config, str):
        return config
    if isinstance(config, dict):
        parts = []
        for key, value in config.items():
            if isinstance(value, bool):
                value = "True" if value else "False"
            parts.append("%s:%s" % (key, value))
        return ",".join(parts)
    raise TypeError("config must be a 'key:value,...' string or a dict, not %r" % type(config))


def update_config(config):
    """Applies settings at run time, in PYTORCH_CUDA_ALLOC_CONF syntax
    ("max_split_size_mb:256,garbage_collection_threshold:0.8") or as a dict
    ({"max_split_size_mb": 256}). Raises ReservoirConfigError (a ValueError) naming
    the key and what is allowed; the configuration is then left unchanged."""
    text = _args.text(_config_text(config), "config")
    _lib.check(_lib.load().reservoir_update_config(text))


def set_allocator_settings(config):
    """As torch.cuda.memory._set_allocator_settings (reservoir.torch answers it with
    this): max_split_size_mb, roundup_power2_divisions and
    garbage_collection_threshold go back to their defaults unless config names them;
    every other setting keeps its value. Raises ReservoirConfigError (a ValueError),
    leaving the configuration unchanged."""
    text = _args.text(_config_text(config), "config")
    _lib.check(_lib.load().reservoir_set_allocator_settings(text))


# The ctypes callbacks handed to the library: they must live as long as it may call
# them (the process).
_oom_observers = []


def attach_oom_observer(observer):
    """Calls observer(device, alloc_size, allowed, free) on every out-of-memory error,
    before ReservoirOutOfMemoryError (or torch.cuda.OutOfMemoryError) is raised: the
    device, the bytes the request needed, the bytes the device allows (the memory
    fraction's bound when one is set, else its total) and the bytes it reported free,
    as torch._C._cuda_attach_out_of_memory_observer calls its observers. The observer
    runs without Reservoir's locks and may call it (memory_stats, dump_snapshot,
    empty_cache); an exception it raises is printed and ignored (the error goes on).
    Observers stay attached for the life of the process."""
    if not callable(observer):
        raise TypeError("observer must be callable, not %r" % type(observer).__name__)

    def call(_ctx, device, alloc_size, allowed, free):
        observer(device, alloc_size, allowed, free)

    callback = _lib.OOM_OBSERVER_FN(call)
    _lib.check(_lib.load().reservoir_attach_oom_observer(callback, None))
    _oom_observers.append(callback)


_trace_trackers = []


def attach_trace_tracker(tracker):
    """Calls tracker(action, device, address, size, stream, pool) with every trace entry
    of every device (PyTorch's trace trackers): action is one of "alloc",
    "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
    "segment_unmap", "snapshot", "oom"; pool is a (first, second) pair ((0, 0): the
    default pools). It runs on the thread whose call made the entry, without
    Reservoir's locks, once that call let go of them: it may register memory with a
    communication library or call Reservoir. Every request then pays for a Python
    call: attach one only where needed. A segment_free / segment_unmap entry comes
    after the memory went back. Trackers stay attached for the life of the process;
    an exception is printed and ignored."""
    if not callable(tracker):
        raise TypeError("tracker must be callable, not %r" % type(tracker).__name__)

    def call(_ctx, entry):
        e = entry.contents
        action = _lib.TRACE_ACTIONS[e.action] if 0 <= e.action < len(_lib.TRACE_ACTIONS) else e.action
        tracker(action, e.device, e.address, e.size, e.stream, (e.pool.first, e.pool.second))

    callback = _lib.TRACE_TRACKER_FN(call)
    _lib.check(_lib.load().reservoir_attach_trace_tracker(callback, None))
    _trace_trackers.append(callback)


def segments(device=None):
    """The segments of a device, in address order, as dicts: device, address, size,
    allocated, active, requested (bytes), stream, is_large, is_expandable, pool (a
    (first, second) pair). A segment is one device allocation, or under policy:compact
    one extent's mapping: what a communication library registers (docs/observability.md)."""
    lib = _lib.load()
    index = _device_index(device)
    count = ctypes.c_size_t(0)
    _lib.check(lib.reservoir_segments(index, None, 0, ctypes.byref(count)))
    while True:  # other threads may make segments between the two calls
        capacity = count.value + 16
        listed = (_lib.Segment * capacity)()
        _lib.check(lib.reservoir_segments(index, listed, capacity, ctypes.byref(count)))
        if count.value <= capacity:
            break
    return [{"device": s.device, "address": s.address, "size": s.size,
             "allocated": s.allocated, "active": s.active, "requested": s.requested,
             "stream": s.stream, "is_large": bool(s.is_large),
             "is_expandable": bool(s.is_expandable), "pool": (s.pool.first, s.pool.second)}
            for s in listed[:count.value]]


def config_string():
    """The settings in force that differ from the defaults, as "key:value,..."."""
    lib = _lib.load()
    return _lib.read_text(lib.reservoir_config_text)


def memory_stats(device=None):
    """Statistics of a device as a dict with the flat keys of
    torch.cuda.memory_stats() ("allocated_bytes.all.current", ...), sorted."""
    lib = _lib.load()
    text = _lib.read_text(lib.reservoir_stats_text, _device_index(device))
    stats = {}
    for line in text.splitlines():
        if line:
            key, _, value = line.rpartition(" ")
            stats[key] = int(value)
    return dict(sorted(stats.items()))


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    """Sets every peak to its current value."""
    _lib.check(_lib.load().reservoir_reset_peak_stats(_device_index(device)))


def reset_accumulated_memory_stats(device=None):
    """Sets the allocated/freed totals and the event counters to zero."""
    _lib.check(_lib.load().reservoir_reset_accumulated_stats(_device_index(device)))


def empty_cache():
    """Returns every unused cached segment to the device (all devices)."""
    _lib.check(_lib.load().reservoir_empty_cache())


def set_memory_fraction(fraction, device=None):
    """Caps the memory Reservoir reserves on a device at fraction * its total memory.
    fraction must be in [0, 1]; raises ReservoirInvalidArgumentError (a ValueError)
    otherwise or for an unknown device."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError("fraction must be a float in [0, 1], not %r" % (fraction,))
    _lib.check(_lib.load().reservoir_set_memory_fraction(float(fraction), _device_index(device)))


def get_memory_fraction(device=None):
    fraction = ctypes.c_double(0.0)
    _lib.check(
        _lib.load().reservoir_get_memory_fraction(_device_index(device), ctypes.byref(fraction))
    )
    return fraction.value


def largest_cached_block(device=None):
    """Size in bytes of the largest cached (free) block."""
    size = ctypes.c_size_t(0)
    _lib.check(
        _lib.load().reservoir_largest_cached_block(_device_index(device), ctypes.byref(size))
    )
    return size.value


def raw_alloc(size, device=None, stream=0):
    """Allocates size bytes on a device for a stream (a cudaStream_t as int, a
    torch.cuda.Stream or a cupy stream; 0 is the default stream) and returns the
    address as int (0 for size 0). The block is reused only on that stream; see
    record_stream()."""
    size = _args.as_int(size, "size")
    if size < 0:
        raise _args.invalid("raw_alloc: size %d is negative" % size)
    if size >= 1 << 60:
        raise ReservoirOutOfMemoryError(
            1, "cannot allocate %d bytes: requests of 1 EiB or more exceed any device's memory" % size
        )
    handle = _args.stream_handle(stream)
    index = _device_index(device)
    ptr = ctypes.c_void_p()
    lib = _lib.load()
    _lib.check(lib.reservoir_allocate(ctypes.byref(ptr), size, index, handle))
    return ptr.value or 0


def raw_free(ptr):
    """Frees an address from raw_alloc (0 is ignored). Raises
    ReservoirInvalidPointerError for an address Reservoir does not hold, TypeError
    for anything but an int."""
    _lib.check(_lib.load().reservoir_free(_args.address(ptr)))


def record_stream(ptr, stream):
    """Marks the block at ptr as used on another stream too: it is not reused until
    the work queued there by the time it is freed has completed."""
    address = _args.address(ptr)
    _lib.check(_lib.load().reservoir_record_stream(address, _args.stream_handle(stream)))


def notify_host_wait(stream=0, device=None):
    """Tells Reservoir that the host waited for stream's work to finish
    (torch.cuda.synchronize, Stream.synchronize, Event.synchronize): blocks freed
    while in use there are reusable at once, and a trace being recorded gets an
    "s,STREAM" line."""
    handle = _args.stream_handle(stream)
    _lib.check(_lib.load().reservoir_notify_host_wait(handle, _device_index(device)))


def release_stream(stream, device=None):
    """Call before destroying a stream that memory was allocated or freed on (a CuPy
    or CUDA stream the program created and drops): under policy:compact Reservoir
    records on a stream, lazily, the event that later reuse of its memory waits for;
    this records it now, while the stream exists. With expandable segments, giving
    free pages back synchronizes the stream that used them; after this call it waits
    for the device instead."""
    handle = _args.stream_handle(stream)
    _lib.check(_lib.load().reservoir_release_stream(handle, _device_index(device)))


def base_allocation(ptr):
    """(base, size) of the device segment holding the address ptr."""
    base = ctypes.c_void_p()
    size = ctypes.c_size_t(0)
    lib = _lib.load()
    address = _args.address(ptr)
    _lib.check(lib.reservoir_base_allocation(address, ctypes.byref(base), ctypes.byref(size)))
    return (base.value or 0, size.value)


def validate():
    """Runs the allocator's consistency checks; raises ReservoirInternalError on a
    violation. Safe while other threads allocate and free: each device is checked at
    one consistent moment."""
    _lib.check(_lib.load().reservoir_validate())


def start_trace_recording(path):
    """Writes every allocator request to path (docs/trace_format.md), for
    reservoir-replay; ".gz" compresses. The file is complete on disk after each
    buffer and written out at exit. Raises ReservoirIoError (an OSError) when path
    cannot be created; a running recording then goes on. An empty path raises
    ReservoirInvalidArgumentError (stop_trace_recording stops)."""
    _lib.check(_lib.load().reservoir_start_trace_recording(_args.path(path)))


def stop_trace_recording():
    """Writes out and closes the running recording (nothing when none runs)."""
    _lib.check(_lib.load().reservoir_stop_trace_recording())


@contextlib.contextmanager
def record_trace(path):
    """Records every allocator request made inside the with block to path (a
    context manager, also usable as a decorator); the trace is complete on disk
    when the block ends, even by an exception. For PyTorch programs use
    reservoir.torch.record_trace, which also installs Reservoir and reports host
    synchronizations."""
    start_trace_recording(path)
    try:
        yield path
    finally:
        stop_trace_recording()


def record_history(enabled=True, max_entries=100000):
    """Keeps the last max_entries allocator events (alloc, free_requested,
    free_completed, segment_alloc, segment_free, oom, ...) per device for
    dump_snapshot(); enabled=False stops and clears them. No stack traces are
    recorded through this interface (docs/observability.md)."""
    entries = _args.count(max_entries, "max_entries")
    _lib.check(_lib.load().reservoir_record_history(1 if enabled else 0, entries))


def dump_snapshot(path):
    """Writes the allocator's segments, blocks and history to path as a pickle in the
    layout of torch.cuda.memory._snapshot(): open it at https://pytorch.org/memory_viz
    or with ``python -m torch.cuda._memory_viz trace_plot PATH -o trace.html``."""
    _lib.check(_lib.load().reservoir_dump_snapshot(_args.path(path)))


def metrics():
    """The statistics of every device in the Prometheus text exposition format
    (``reservoir_allocated_bytes{device="0",pool="large"} 1024`` ...)."""
    return _lib.read_text(_lib.load().reservoir_metrics_prometheus)


def metrics_json():
    """The statistics of every device as a JSON string (json.loads() it)."""
    return _lib.read_text(_lib.load().reservoir_metrics_json)


def memory_summary(device=None, abbreviated=False):
    """A readable table of the statistics, laid out like torch.cuda.memory_summary():
    one row per statistic (with its large/small pool split unless abbreviated) and
    the columns current, peak, total allocated and total freed. The C library's
    table (Allocator::summary) with the synchronizations of all streams and the max
    split size added."""
    options = _lib.RESERVOIR_SUMMARY_SYNC_AND_SPLIT
    if abbreviated:
        options |= _lib.RESERVOIR_SUMMARY_ABBREVIATED
    lib = _lib.load()
    return _lib.read_text(lib.reservoir_summary_with_options, _device_index(device), options)


def engine_summary(device=None):
    """The C library's table as C and C++ get it (reservoir_summary,
    Allocator::summary()): memory_summary() without the line it adds."""
    lib = _lib.load()
    return _lib.read_text(lib.reservoir_summary, _device_index(device))


# Sharing blocks with other processes (docs/ipc.md). Imported last: reservoir.open
# shadows the builtin inside this module from here on, and nothing above uses it.
from ._ipc import close, open, share, unshare  # noqa: E402,F401,A004
