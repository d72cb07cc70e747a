"""Reservoir as PyTorch's CUDA allocator.

    import reservoir.torch
    reservoir.torch.install()            # before any CUDA tensor is created
    model = MyModel().cuda()             # every CUDA tensor now comes from Reservoir

install() swaps PyTorch's caching allocator for Reservoir through
torch.cuda.memory.CUDAPluggableAllocator and wires every optional hook the
installed PyTorch has (init, empty_cache, memory fraction, base allocation,
record_stream, memory pools). PyTorch can swap its allocator only before CUDA is
initialized, so install() must run at program start.

Under a pluggable allocator PyTorch forwards none of torch.cuda.memory_stats()
and its relatives; install() makes them (and torch.accelerator's) answer with
Reservoir's figures in PyTorch's shapes, by replacing the torch._C entry points
they call (reservoir._torch_memory_api). An allocation that does not fit raises
torch.cuda.OutOfMemoryError with PyTorch's first sentence and Reservoir's report.
PyTorch cannot swap its allocator back: there is no uninstall().

CUDA graphs (torch.cuda.graph, make_graphed_callables, torch.compile's
"reduce-overhead" mode and its cudagraph trees) and torch.cuda.MemPool /
use_mem_pool run on Reservoir's private pools: the capture hooks are wired as
pluggable setters, and the pool paths PyTorch does not forward to a pluggable
allocator (MemPool creation, checkpoints) are answered by reservoir._torch_pools.

cuDNN's benchmark mode asks the allocator's cacheInfo, and cudagraph trees its
checkpoints, C++ virtuals the pluggable interface does not forward: install()
compiles a small subclass against the installed PyTorch once and makes it the
allocator (reservoir._torch_native; seconds the first time, then cached;
RESERVOIR_TORCH_NATIVE=0 skips it).
"""

import contextlib
import ctypes
import os
import warnings

from . import _lib, _torch_memory_api, _torch_native, _torch_pools, _torch_sync
import reservoir as _reservoir

# (setter on torch's _CUDAPluggableAllocator, exported symbol). A setter missing
# from the installed PyTorch is skipped; the two *_stream_to_pool setters are the
# names older PyTorch releases used.
HOOKS = (
    ("set_init_fn", "reservoir_torch_init"),
    ("set_reset_fn", "reservoir_torch_empty_cache"),
    ("set_memory_fraction_fn", "reservoir_torch_set_memory_fraction"),
    ("set_base_alloc_fn", "reservoir_torch_base_alloc"),
    ("set_record_stream_fn", "reservoir_torch_record_stream"),
    ("set_begin_allocate_to_pool", "reservoir_torch_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "reservoir_torch_end_allocate_to_pool"),
    ("set_release_pool", "reservoir_torch_release_pool"),
    ("set_begin_allocate_stream_to_pool", "reservoir_torch_begin_allocate_stream_to_pool"),
    ("set_end_allocate_stream_to_pool_fn", "reservoir_torch_end_allocate_stream_to_pool"),
)
MALLOC_SYMBOL = "reservoir_torch_malloc"
FREE_SYMBOL = "reservoir_torch_free"

_TOO_LATE = (
    "reservoir.torch.install() was called too late: {why}. PyTorch can swap its CUDA "
    "allocator only before CUDA is initialized, so call reservoir.torch.install() at "
    "program start, before any CUDA tensor is created (and before anything that "
    "initializes CUDA, such as torch.cuda.set_device or model.cuda())."
)

_allocator = None
_wired = {}
_patched = []  # torch._C entry points answered by Reservoir
_oom_type = [None]  # "torch.cuda.OutOfMemoryError" once c10's type is in use

# c10::Error(SourceLocation, std::string) (complete-object constructor, then the
# base-object one) and the type_info of c10::OutOfMemoryError (torch_oom.cpp).
_C10_ERROR_CONSTRUCTORS = (
    "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
)
_C10_OOM_TYPE = "_ZTIN3c1016OutOfMemoryErrorE"


def _import_torch():
    try:
        import torch
    except ImportError as error:
        raise ImportError("reservoir.torch needs PyTorch (import torch failed: %s)" % error) from error
    return torch


def is_installed():
    """True once install() has swapped PyTorch's allocator in this process."""
    return _allocator is not None


def installed_hooks():
    """{torch setter name: Reservoir symbol} for the hooks install() wired."""
    return dict(_wired)


def _requested_engine(config):
    """The backend: setting in config (a string or a dict), or None."""
    if isinstance(config, dict):
        value = config.get("backend")
        return None if value is None else str(value)
    if isinstance(config, str):
        for item in config.split(","):
            key, _, value = item.partition(":")
            if key.strip() == "backend":
                return value.strip()
    return None


def _startup_engine(config):
    """backend:cudaMallocAsync (or native) picks Reservoir's engine when the allocator
    is made, which update_config cannot change afterwards: a backend in install()'s
    config joins the startup settings (RESERVOIR_ALLOC_CONF, read when the allocator
    is made on the first call). If the allocator exists already, update_config then
    refuses a different backend with the reason."""
    engine = _requested_engine(config)
    if engine is None:
        return
    # As Config::from_environment: an empty (or blank) variable counts as unset.
    base = (os.environ.get("RESERVOIR_ALLOC_CONF", "").strip()
            or os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").strip())
    os.environ["RESERVOIR_ALLOC_CONF"] = (base + "," if base else "") + "backend:" + engine


def install(config=None):
    """Makes Reservoir PyTorch's CUDA allocator for this process.

    config: settings applied first, as "key:value,..." (PYTORCH_CUDA_ALLOC_CONF
    syntax) or a dict; RESERVOIR_ALLOC_CONF (else PYTORCH_CUDA_ALLOC_CONF) is read
    before that. "backend:cudaMallocAsync" selects the driver-pool engine
    (docs/async.md) when nothing used Reservoir before install(). Raises ReservoirConfigError (a ValueError) for a bad setting, and
    RuntimeError when called after CUDA was initialized, when there is no CUDA device,
    or when Reservoir is set to the simulated device. Calling it again is harmless
    (the config, if any, is applied). Returns the torch allocator object.
    """
    global _allocator
    torch = _import_torch()
    if _allocator is not None:
        if config is not None:
            _reservoir.update_config(config)
        return _allocator
    if torch.cuda.is_initialized():
        raise RuntimeError(_TOO_LATE.format(why="CUDA is already initialized in this process"))
    if not torch.cuda.is_available():
        raise RuntimeError("reservoir.torch.install(): PyTorch sees no CUDA device")

    _startup_engine(config)
    lib = _lib.load()
    if config is not None:
        _reservoir.update_config(config)
    backend = _reservoir.backend_name()
    if backend != "cuda":
        raise RuntimeError(
            "reservoir.torch.install(): Reservoir is using the %r device backend, not CUDA; "
            "remove device:%s from RESERVOIR_ALLOC_CONF (PyTorch needs real device memory)"
            % (backend, backend)
        )

    pluggable = torch.cuda.memory.CUDAPluggableAllocator(_lib.path(), MALLOC_SYMBOL, FREE_SYMBOL)
    raw = pluggable.allocator()
    wired = {}
    for setter_name, symbol in HOOKS:
        setter = getattr(raw, setter_name, None)
        if setter is None:
            continue
        setter(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
        wired[setter_name] = symbol
    try:
        torch.cuda.memory.change_current_allocator(pluggable)
    except RuntimeError as error:
        raise RuntimeError(
            _TOO_LATE.format(
                why="PyTorch refused to swap its allocator (%s); either CUDA is already "
                "initialized or another allocator was installed first" % error
            )
        ) from error
    # cacheInfo (cuDNN's benchmark mode) needs a C++ override: reservoir._torch_native.
    native, reason = _torch_native.install(torch)
    if not native and _torch_native.enabled():
        warnings.warn("reservoir.torch: the native part is not in use, so "
                      "torch.backends.cudnn.benchmark = True fails and torch.compile's "
                      "cudagraph trees need their slow-path asserts off: %s" % reason,
                      RuntimeWarning, stacklevel=2)
    _allocator = pluggable
    _wired.clear()
    _wired.update(wired)
    _patched.extend(_torch_memory_api.patch(torch, native=native))
    _patched.extend(_torch_pools.patch(torch, native=native))
    _use_c10_errors(torch, lib)
    return pluggable


def _symbol(libraries, names):
    for library in libraries:
        for name in names:
            try:
                return ctypes.cast(getattr(library, name), ctypes.c_void_p).value
            except AttributeError:
                continue
    return None


def _loaded_torch_libraries(torch):
    """ctypes handles of PyTorch's libraries already in the process (never loads one)."""
    folder = os.path.join(os.path.dirname(torch.__file__), "lib")
    handles = []
    for name in ("libc10.so", "libtorch_python.so", "libc10_cuda.so", "libtorch_cuda.so"):
        for candidate in (os.path.join(folder, name), name):
            try:
                handles.append(ctypes.CDLL(candidate, mode=os.RTLD_NOLOAD | os.RTLD_LAZY))
                break
            except OSError:
                continue
    return handles


def _use_c10_errors(torch, lib):
    """Makes an out-of-memory error reach Python as torch.cuda.OutOfMemoryError
    (see src/integrations/torch_oom.cpp); keeps a RuntimeError with the same
    message where the installed PyTorch's c10 does not match. Returns whether it
    is in use."""
    libraries = _loaded_torch_libraries(torch)
    constructor = _symbol(libraries, _C10_ERROR_CONSTRUCTORS)
    oom_type = _symbol(libraries, (_C10_OOM_TYPE,))
    if constructor is None or oom_type is None:
        return False
    use = lib.reservoir_torch_use_c10_errors
    use.restype = ctypes.c_int
    use.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    if use(constructor, oom_type) != 0:
        return False
    _oom_type[0] = "torch.cuda.OutOfMemoryError"
    return True


def native_status():
    """{"active": whether PyTorch's allocator is Reservoir's native subclass (cacheInfo
    answered, so cudnn.benchmark works), "reason": why not}; see reservoir._torch_native."""
    return _torch_native.status()


def memory_api_patched():
    """The torch._C entry points install() made Reservoir answer (see
    reservoir._torch_memory_api), and the exception type an out-of-memory error
    has in Python ("torch.cuda.OutOfMemoryError", or "RuntimeError" when
    PyTorch's c10 did not match)."""
    return {"entry_points": list(_patched), "out_of_memory": _oom_type[0] or "RuntimeError"}


def notify_host_synchronizations():
    """Makes torch.cuda.synchronize, Stream.synchronize and Event.synchronize tell
    Reservoir that the host waited (see reservoir._torch_sync). Idempotent; returns
    the functions wrapped by this call."""
    return _torch_sync.patch(_import_torch())


@contextlib.contextmanager
def record_trace(path, config=None):
    """Records the allocations of the with block to path for reservoir-replay:

        with reservoir.torch.record_trace("run.trace.gz"):
            train()

    Installs Reservoir first if needed (so it must run before CUDA is
    initialized, like install(); config as for install()), and reports host
    synchronizations to the trace. The trace is complete on disk when the block
    ends, even by an exception. Also a decorator."""
    install(config)
    notify_host_synchronizations()
    with _reservoir.record_trace(path):
        yield path


def _torch_device(device):
    """Device index for Reservoir: PyTorch's current device when None."""
    if device is None:
        torch = _import_torch()
        return torch.cuda.current_device()
    return device


def memory_stats(device=None):
    """reservoir.memory_stats() for PyTorch's current device (same keys as
    torch.cuda.memory_stats())."""
    return _reservoir.memory_stats(_torch_device(device))


def memory_summary(device=None, abbreviated=False):
    return _reservoir.memory_summary(_torch_device(device), abbreviated)


def memory_allocated(device=None):
    return _reservoir.memory_allocated(_torch_device(device))


def max_memory_allocated(device=None):
    return _reservoir.max_memory_allocated(_torch_device(device))


def memory_reserved(device=None):
    return _reservoir.memory_reserved(_torch_device(device))


def max_memory_reserved(device=None):
    return _reservoir.max_memory_reserved(_torch_device(device))


def reset_peak_memory_stats(device=None):
    _reservoir.reset_peak_memory_stats(_torch_device(device))


# Tagged memory (reservoir.tag, docs/sleep.md): PyTorch calls Reservoir on the
# allocating thread, so a tag scope tags that thread's tensors, and a torch.cuda.graph
# captured inside one tags the graph's private pool (made on the capturing thread).
tag = _reservoir.tag


def sleep(tag, mode="offload", device=None):
    """reservoir.sleep() on PyTorch's current device by default."""
    _reservoir.sleep(tag, mode, _torch_device(device))


def wake(tag, device=None, stream=None):
    """reservoir.wake() on PyTorch's current device by default; stream (a
    torch.cuda.Stream, e.g. torch.cuda.current_stream()) enqueues the copies back on it
    without waiting for them."""
    _reservoir.wake(tag, _torch_device(device), stream)


empty_host_cache = _reservoir.empty_host_cache


def tag_state(tag, device=None):
    """reservoir.tag_state() on PyTorch's current device by default."""
    return _reservoir.tag_state(tag, _torch_device(device))
