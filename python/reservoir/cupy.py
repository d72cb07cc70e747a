"""Reservoir as CuPy's device memory allocator.

    import reservoir.cupy
    reservoir.cupy.install()
    x = cupy.random.rand(4096, 4096)     # allocated by Reservoir

Each allocation is made on CuPy's current device for CuPy's current stream, and
wrapped in cupy.cuda.UnownedMemory whose owner returns the block to Reservoir when
CuPy drops the memory. Unlike PyTorch, CuPy can switch allocators at any time;
uninstall() restores the allocator in use before install().
"""

import sys

import reservoir as _reservoir
from . import _lib

_previous = None
_installed = False


def _import_cupy():
    try:
        import cupy
    except ImportError as error:
        raise ImportError("reservoir.cupy needs CuPy (import cupy failed: %s)" % error) from error
    return cupy


class _Block:
    """Owner of one Reservoir block: frees it when CuPy releases the memory."""

    __slots__ = ("ptr", "__weakref__")
    # Bound now so that frees still work while the interpreter shuts down and
    # module globals are being cleared.
    _free = None
    _last_error = None
    _reported = [False]

    def __init__(self, ptr):
        self.ptr = ptr

    def __del__(self):
        ptr, self.ptr = self.ptr, 0
        if not ptr:
            return
        status = _Block._free(ptr)
        if status != 0 and not _Block._reported[0]:
            # __del__ cannot raise: report the first failure, as the C++ hooks do.
            _Block._reported[0] = True
            message = _Block._last_error() or b""
            sys.stderr.write(
                "reservoir: freeing 0x%x for CuPy failed: %s (further free errors are "
                "not printed)\n" % (ptr, message.decode("utf-8", "replace"))
            )


def _malloc(size):
    cupy = _import_cupy()
    device = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream().ptr
    try:
        ptr = _reservoir.raw_alloc(size, device, stream)
    except _lib.ReservoirOutOfMemoryError as error:
        # CuPy code (and its memory pool users) catch cupy's own error type.
        raise cupy.cuda.memory.OutOfMemoryError(size, _reservoir.memory_reserved(device)) from error
    memory = cupy.cuda.memory.UnownedMemory(ptr, size, _Block(ptr), device)
    return cupy.cuda.memory.MemoryPointer(memory, 0)


def install(config=None):
    """Makes Reservoir CuPy's allocator (cupy.cuda.set_allocator). config as for
    reservoir.update_config(). Raises RuntimeError when Reservoir is set to the
    simulated device."""
    global _previous, _installed
    cupy = _import_cupy()
    lib = _lib.load()
    if config is not None:
        _reservoir.update_config(config)
    backend = _reservoir.backend_name()
    if backend != "cuda":
        raise RuntimeError(
            "reservoir.cupy.install(): Reservoir is using the %r device backend, not CUDA; "
            "remove device:%s from RESERVOIR_ALLOC_CONF" % (backend, backend)
        )
    _Block._free = lib.reservoir_free
    _Block._last_error = lib.reservoir_last_error
    if not _installed:
        get_allocator = getattr(cupy.cuda, "get_allocator", None)
        _previous = get_allocator() if get_allocator else cupy.get_default_memory_pool().malloc
        cupy.cuda.set_allocator(_malloc)
        _installed = True


def uninstall():
    """Restores CuPy's previous allocator. Blocks still alive stay with Reservoir
    and are freed there when CuPy drops them."""
    global _previous, _installed
    if not _installed:
        return
    cupy = _import_cupy()
    cupy.cuda.set_allocator(_previous)
    _previous = None
    _installed = False


def is_installed():
    return _installed
