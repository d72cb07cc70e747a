"""Finding and loading libreservoir.so, its ctypes signatures, and error mapping."""

import ctypes
import ctypes.util
import glob
import os
import threading

_LIB_FILES = ("libreservoir.so", "libreservoir.so.0")
# Build folders of the repository, searched when the package runs from a checkout
# (python/reservoir/ -> repository root two levels up).
_BUILD_DIRS = ("build", "build-release", "build-py", "build-debug")


class ReservoirError(Exception):
    """An error reported by the Reservoir C API.

    ``status`` is the C status code, ``status_name`` its name ("out_of_memory", ...);
    ``str(error)`` is the C library's message.
    """

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.status_name = _STATUS_NAMES.get(status, "unknown")
        self.message = message


class ReservoirOutOfMemoryError(ReservoirError, MemoryError):
    """The device has no memory for the request (RESERVOIR_ERROR_OUT_OF_MEMORY)."""


class ReservoirInvalidPointerError(ReservoirError, ValueError):
    """A pointer Reservoir did not hand out, or already freed."""


class ReservoirInvalidArgumentError(ReservoirError, ValueError):
    """A bad argument: negative size, fraction outside [0, 1], unknown device, ..."""


class ReservoirConfigError(ReservoirError, ValueError):
    """A malformed configuration string; the message names the key and what is allowed."""


class ReservoirDeviceError(ReservoirError, RuntimeError):
    """A device call failed for a reason other than memory."""


class ReservoirInternalError(ReservoirError, RuntimeError):
    """A bug in Reservoir (for example, the validator found contradicting books)."""


class ReservoirIoError(ReservoirError, OSError):
    """Reading or writing a file (trace, snapshot) failed; the message names the
    path and the OS reason. The allocator is unaffected."""


class ReservoirLibraryNotFoundError(OSError):
    """libreservoir.so could not be found or loaded."""


_STATUS_NAMES = {
    0: "ok",
    1: "out_of_memory",
    2: "invalid_pointer",
    3: "invalid_argument",
    4: "config",
    5: "device",
    6: "internal",
    7: "io",
}

_ERRORS = {
    1: ReservoirOutOfMemoryError,
    2: ReservoirInvalidPointerError,
    3: ReservoirInvalidArgumentError,
    4: ReservoirConfigError,
    5: ReservoirDeviceError,
    6: ReservoirInternalError,
    7: ReservoirIoError,
}

# reservoir_summary_option's bits (reservoir.h).
RESERVOIR_SUMMARY_ABBREVIATED = 1
RESERVOIR_SUMMARY_SYNC_AND_SPLIT = 2

# reservoir_sleep_mode's values (reservoir.h).
RESERVOIR_SLEEP_OFFLOAD = 0
RESERVOIR_SLEEP_DISCARD = 1

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_size_p = ctypes.POINTER(ctypes.c_size_t)
# uintptr_t: same width as size_t on every platform Reservoir builds for.
_c_uintptr = ctypes.c_size_t
# reservoir_segment_alloc_fn / reservoir_segment_free_fn (a pool's segment source).
SEGMENT_ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                                    _c_uintptr, ctypes.POINTER(ctypes.c_void_p))
SEGMENT_FREE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_size_t, _c_uintptr)


# reservoir_pluggable_alloc_fn / reservoir_pluggable_free_fn (PyTorch's pluggable shape).
PLUGGABLE_ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_void_p)
PLUGGABLE_FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.c_void_p)


class PoolId(ctypes.Structure):
    """reservoir_pool_id: a private pool's id (PyTorch's MempoolId_t)."""

    _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]


class Segment(ctypes.Structure):
    """reservoir_segment: one segment of a device."""

    _fields_ = [("device", ctypes.c_int), ("address", _c_uintptr), ("size", ctypes.c_size_t),
                ("allocated", ctypes.c_size_t), ("active", ctypes.c_size_t),
                ("requested", ctypes.c_size_t), ("stream", _c_uintptr), ("is_large", ctypes.c_int),
                ("is_expandable", ctypes.c_int), ("pool", PoolId)]


class TraceEntry(ctypes.Structure):
    """reservoir_trace_entry: one entry a trace tracker gets."""

    _fields_ = [("action", ctypes.c_int), ("device", ctypes.c_int), ("address", _c_uintptr),
                ("size", ctypes.c_size_t), ("stream", _c_uintptr), ("time_us", ctypes.c_uint64),
                ("pool", PoolId)]


class TagState(ctypes.Structure):
    """reservoir_tag_state: a tag's state on one device (reservoir_get_tag_state)."""

    _fields_ = [("asleep", ctypes.c_int), ("mode", ctypes.c_int),
                ("allocated_bytes", ctypes.c_size_t), ("reserved_bytes", ctypes.c_size_t),
                ("asleep_bytes", ctypes.c_size_t), ("offloaded_bytes", ctypes.c_size_t),
                ("pools", ctypes.c_size_t)]


# reservoir_trace_tracker_fn (a trace tracker).
TRACE_TRACKER_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(TraceEntry))
# reservoir_trace_action's names, by value (PyTorch's trace actions).
TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                 "segment_map", "segment_unmap", "snapshot", "oom")

# reservoir_oom_observer_fn (an out-of-memory observer).
OOM_OBSERVER_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                                   ctypes.c_size_t, ctypes.c_size_t)

_SIGNATURES = {
    "reservoir_last_error": (ctypes.c_char_p, []),
    "reservoir_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "reservoir_allocate": (
        ctypes.c_int,
        [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_int, _c_uintptr],
    ),
    "reservoir_free": (ctypes.c_int, [ctypes.c_void_p]),
    "reservoir_record_stream": (ctypes.c_int, [ctypes.c_void_p, _c_uintptr]),
    "reservoir_share": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
    "reservoir_unshare": (ctypes.c_int, [ctypes.c_void_p]),
    "reservoir_open_shared": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)],
    ),
    "reservoir_close_shared": (ctypes.c_int, [ctypes.c_void_p]),
    "reservoir_notify_host_wait": (ctypes.c_int, [_c_uintptr, ctypes.c_int]),
    "reservoir_release_stream": (ctypes.c_int, [_c_uintptr, ctypes.c_int]),
    "reservoir_push_tag": (ctypes.c_int, [ctypes.c_char_p]),
    "reservoir_pop_tag": (ctypes.c_int, []),
    "reservoir_sleep": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
    "reservoir_wake": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
    "reservoir_wake_async": (ctypes.c_int, [ctypes.c_char_p, _c_uintptr, ctypes.c_int]),
    "reservoir_empty_host_cache": (ctypes.c_int, []),
    "reservoir_get_tag_state": (
        ctypes.c_int,
        [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(TagState)],
    ),
    "reservoir_empty_cache": (ctypes.c_int, []),
    "reservoir_set_memory_fraction": (ctypes.c_int, [ctypes.c_double, ctypes.c_int]),
    "reservoir_get_memory_fraction": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.POINTER(ctypes.c_double)],
    ),
    "reservoir_largest_cached_block": (ctypes.c_int, [ctypes.c_int, _c_size_p]),
    "reservoir_base_allocation": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), _c_size_p],
    ),
    "reservoir_reset_peak_stats": (ctypes.c_int, [ctypes.c_int]),
    "reservoir_reset_accumulated_stats": (ctypes.c_int, [ctypes.c_int]),
    "reservoir_update_config": (ctypes.c_int, [ctypes.c_char_p]),
    "reservoir_set_allocator_settings": (ctypes.c_int, [ctypes.c_char_p]),
    "reservoir_attach_oom_observer": (ctypes.c_int, [OOM_OBSERVER_FN, ctypes.c_void_p]),
    "reservoir_attach_trace_tracker": (ctypes.c_int, [TRACE_TRACKER_FN, ctypes.c_void_p]),
    "reservoir_segments": (
        ctypes.c_int, [ctypes.c_int, ctypes.POINTER(Segment), ctypes.c_size_t, _c_size_p]),
    "reservoir_device_count": (ctypes.c_int, [_c_int_p]),
    "reservoir_backend_name": (ctypes.c_int, [ctypes.POINTER(ctypes.c_char_p)]),
    "reservoir_current_device": (ctypes.c_int, [_c_int_p]),
    "reservoir_config_text": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t, _c_size_p]),
    "reservoir_stats_text": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, _c_size_p],
    ),
    "reservoir_summary": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, _c_size_p],
    ),
    "reservoir_summary_with_options": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_uint, ctypes.c_char_p, ctypes.c_size_t, _c_size_p],
    ),
    "reservoir_start_trace_recording": (ctypes.c_int, [ctypes.c_char_p]),
    "reservoir_stop_trace_recording": (ctypes.c_int, []),
    "reservoir_validate": (ctypes.c_int, []),
    "reservoir_record_history": (ctypes.c_int, [ctypes.c_int, ctypes.c_size_t]),
    "reservoir_dump_snapshot": (ctypes.c_int, [ctypes.c_char_p]),
    "reservoir_metrics_prometheus": (
        ctypes.c_int,
        [ctypes.c_char_p, ctypes.c_size_t, _c_size_p],
    ),
    "reservoir_metrics_json": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t, _c_size_p]),
    "reservoir_private_pool_stats": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)],
    ),
    "reservoir_pool_create": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(PoolId)],
    ),
    "reservoir_pool_create_with_source": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_int, ctypes.c_int, SEGMENT_ALLOC_FN, SEGMENT_FREE_FN,
         ctypes.c_void_p, ctypes.POINTER(PoolId)],
    ),
    "reservoir_pool_create_with_pluggable": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_int, ctypes.c_int, PLUGGABLE_ALLOC_FN, PLUGGABLE_FREE_FN,
         ctypes.POINTER(PoolId)],
    ),
    "reservoir_pool_retain": (ctypes.c_int, [ctypes.c_int, PoolId, ctypes.c_int, ctypes.c_int]),
    "reservoir_pool_release": (ctypes.c_int, [ctypes.c_int, PoolId]),
    "reservoir_pool_release_and_empty": (ctypes.c_int, [ctypes.c_int, PoolId]),
    "reservoir_pool_use_count": (ctypes.c_int, [ctypes.c_int, PoolId, _c_int_p]),
    "reservoir_pool_usage": (ctypes.c_int, [ctypes.c_int, PoolId, _c_size_p, _c_size_p]),
    "reservoir_pool_begin_capture": (ctypes.c_int, [ctypes.c_int, PoolId, _c_uintptr]),
    "reservoir_pool_begin_thread": (ctypes.c_int, [ctypes.c_int, PoolId]),
    "reservoir_pool_end": (ctypes.c_int, [ctypes.c_int, PoolId]),
    "reservoir_pool_live_allocations_are": (
        ctypes.c_int,
        [ctypes.c_int, PoolId, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, _c_int_p],
    ),
    "reservoir_pool_checkpoint_take": (
        ctypes.c_int,
        [ctypes.c_int, PoolId, ctypes.POINTER(ctypes.c_void_p)],
    ),
    "reservoir_pool_checkpoint_restore": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)],
    ),
    "reservoir_pool_checkpoint_free": (None, [ctypes.c_void_p]),
    "reservoir_pool_restore_count": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int]),
    "reservoir_pool_restore_pointer": (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t],
    ),
    "reservoir_pool_restore_free": (None, [ctypes.c_void_p]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


def _repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def candidates():
    """Paths tried, in order, when RESERVOIR_LIBRARY is not set."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = [os.path.join(here, name) for name in _LIB_FILES]
    root = _repo_root()
    for build in _BUILD_DIRS:
        found.append(os.path.join(root, build, "src", "libreservoir.so"))
    # Any other build folder (build/release/src, a preset's build/<preset>/src, ...),
    # newest library first.
    others = glob.glob(os.path.join(root, "build*", "**", "src", "libreservoir.so"),
                       recursive=True)
    others.sort(key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0, reverse=True)
    for path in others:
        if path not in found:
            found.append(path)
    return found


def _locate():
    explicit = os.environ.get("RESERVOIR_LIBRARY")
    if explicit:
        if not os.path.exists(explicit):
            raise ReservoirLibraryNotFoundError(
                "RESERVOIR_LIBRARY is set to %r, which does not exist; point it at "
                "libreservoir.so (e.g. build/src/libreservoir.so) or unset it" % explicit
            )
        return os.path.abspath(explicit)
    tried = candidates()
    for path in tried:
        if os.path.exists(path):
            return path
    name = ctypes.util.find_library("reservoir")
    if name:
        return name
    raise ReservoirLibraryNotFoundError(
        "cannot find libreservoir.so. Build it (cmake -S . -B build && cmake --build build "
        "--target reservoir) or set RESERVOIR_LIBRARY=/path/to/libreservoir.so. Tried:\n  "
        + "\n  ".join(tried + ["ctypes.util.find_library('reservoir')"])
    )


def load():
    """The loaded library (ctypes.CDLL), loading it on first use."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = _locate()
        try:
            lib = ctypes.CDLL(path)
        except OSError as error:
            raise ReservoirLibraryNotFoundError(
                "cannot load Reservoir library %s: %s" % (path, error)
            ) from error
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                function = getattr(lib, name)
            except AttributeError as error:
                raise ReservoirLibraryNotFoundError(
                    "%s does not export %s: it is not a matching libreservoir.so" % (path, name)
                ) from error
            function.restype = restype
            function.argtypes = argtypes
        _lib_path = path
        _lib = lib
        return lib


def path():
    """Path of the library in use (loads it)."""
    load()
    return _lib_path


def check(status):
    """Raises the ReservoirError subclass for a non-zero status code."""
    if status == 0:
        return
    message = load().reservoir_last_error()
    text = message.decode("utf-8", "replace") if message else ""
    raise _ERRORS.get(status, ReservoirInternalError)(status, text or _STATUS_NAMES.get(status))


def read_text(function, *args):
    """Calls a C function with the (buffer, capacity, needed) convention; returns str."""
    needed = ctypes.c_size_t(0)
    check(function(*args, None, 0, ctypes.byref(needed)))
    # The text can grow between the two calls (another thread allocating): retry.
    while True:
        capacity = needed.value + 256
        buffer = ctypes.create_string_buffer(capacity)
        check(function(*args, buffer, capacity, ctypes.byref(needed)))
        if needed.value <= capacity:
            return buffer.value.decode("utf-8", "replace")
