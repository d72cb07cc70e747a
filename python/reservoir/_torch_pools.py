"""PyTorch's private-pool paths answered by Reservoir (docs/pools.md).

What PyTorch calls, and how each reaches Reservoir under install():

    caller                                   PyTorch entry               Reservoir
    torch.cuda.graph / CUDAGraph capture     beginAllocateToPool,        pluggable hooks
    (make_graphed_callables, inductor)       endAllocateToPool,          (torch_allocator.cpp),
                                             releasePool                 wired by install()
    torch.cuda.use_mem_pool, cudagraph       _cuda_beginAllocateCurrent- the same hooks (the
    trees' pool manager                      ThreadToPool, _cuda_end...  filter is the thread)
    torch.cuda.MemPool()                     _MemPool -> createOrIncref- replaced: MemPool below
                                             Pool (not forwarded: fails)
    torch.cuda.MemPool(allocator=X), X a     _MemPool with X's C++       replaced: a pool over X's
    torch.cuda.memory.CUDAPluggableAllocator allocator (not forwarded)   alloc / free functions,
    (or its ._allocator; vLLM's sleep mode)                              recorded when X is made
    cudagraph trees                          _cuda_getCheckpointState,   replaced here: Reservoir's
                                             _cuda_setCheckpointPool-    checkpoints
                                             State, _cuda_checkPoolLive-
                                             Allocations (not forwarded)
    cudagraph trees after a restore          _cuda_cudaCachingAllocator_ replaced: frees blocks the
                                             raw_delete                  pluggable never handed out

With reservoir._torch_native in use (the default where it builds), the native
allocator answers getCheckpointState, setCheckpointPoolState and
checkPoolLiveAllocations in C++ and PyTorch's own bindings run unchanged: only
MemPool is replaced here. Without it (RESERVOIR_TORCH_NATIVE=0, or no compiler),
the replacements below stand in, with one limit:

The one thing PyTorch's own restore does that a pluggable allocator cannot: give
the storages that are live at a restore a deleter (it writes into c10::StorageImpl
from C++). Reservoir instead keeps a weak reference to each such storage and frees
its block when cudagraph trees free the storage (_free_And_Remove_DeleterFn, also
replaced) or once the storage is gone, checked whenever they next call into the
allocator's pool paths (a checkpoint, a restore, routing to the pool) and at
torch.cuda.empty_cache(); until then the block stays allocated in the graph pool,
never handed to anyone else. cudagraph trees' slow-path asserts (on by default:
torch._inductor.config.triton.slow_path_cudagraph_asserts) check those deleters and
fail without the native part.
"""

import atexit
import ctypes

import reservoir as _reservoir

_MARK = "_reservoir_replacement"

# Blocks a restore allocated for live storages: (weak reference, address, device).
_adopted = []
# Dropped before interpreter shutdown: a StorageWeakRef destroyed after torch's
# modules are torn down prints an ignored AttributeError per reference.
atexit.register(_adopted.clear)


def _storage_weak_ref(torch, cdata):
    """A weak reference of our own to the storage whose weak pointer is cdata (the
    caller's reference stays the caller's), or None when it is gone already."""
    from torch.multiprocessing.reductions import StorageWeakRef

    if torch.Storage._expired(cdata):
        return None
    storage = torch.UntypedStorage._new_with_weak_ptr(cdata)
    if storage is None:
        return None
    return StorageWeakRef(storage)


def reclaim_dead_storages():
    """Frees the blocks of restore-adopted storages that have died since. Returns
    how many were freed."""
    freed = 0
    keep = []
    for ref, address, _device in _adopted:
        if ref.expired():
            try:
                _reservoir.raw_free(address)
                freed += 1
            except _reservoir.ReservoirInvalidPointerError:
                pass  # freed by a later restore already
        else:
            keep.append((ref, address, _device))
    _adopted[:] = keep
    return freed


def get_checkpoint_state(device, pool):
    reclaim_dead_storages()
    return _reservoir.checkpoint_pool(tuple(pool), device=device)


def make_set_checkpoint_pool_state(torch):
    def set_checkpoint_pool_state(device, state, stale_storages, storages_to_add_deleters_to):
        reclaim_dead_storages()
        freed, allocated = _reservoir.restore_pool(state)
        # Every block the restore freed was allocated in the pool: adopted ones are
        # no longer ours to free later.
        freed_set = set(freed)
        _adopted[:] = [entry for entry in _adopted if entry[1] not in freed_set]
        allocated_set = set(allocated)
        if stale_storages:
            # PyTorch would take the deleter off these storages (they point into blocks
            # the restore freed); a pluggable allocator cannot reach a StorageImpl.
            raise RuntimeError(
                "Reservoir: setCheckpointPoolState with stale storages is not supported "
                "(cudagraph trees pass none); free those tensors before the restore")
        for cdata in storages_to_add_deleters_to:
            ref = _storage_weak_ref(torch, cdata)
            storage = torch.UntypedStorage._new_with_weak_ptr(cdata) if ref is not None else None
            address = storage.data_ptr() if storage is not None else None
            del storage
            if address is None or address not in allocated_set:
                continue
            _adopted.append((ref, address, device))
        reclaim_dead_storages()

    return set_checkpoint_pool_state


def check_pool_live_allocations(device, pool, expected):
    reclaim_dead_storages()
    return _reservoir.pool_live_allocations_are(tuple(pool), expected, device=device)


def make_raw_delete(original):
    def raw_delete(ptr):
        # A block a restore handed back was never allocated through the pluggable
        # allocator, which refuses to free it: Reservoir frees it.
        try:
            original(ptr)
        except RuntimeError as error:
            if "not allocated here" not in str(error):
                raise
            _reservoir.raw_free(int(ptr))
        address = int(ptr)
        _adopted[:] = [entry for entry in _adopted if entry[1] != address]

    return raw_delete


def make_free_and_remove_deleter(torch):
    original = torch._C._free_And_Remove_DeleterFn

    def free_and_remove_deleter(cdata):
        # cudagraph trees free a path's live outputs this way; a storage a restore
        # adopted has no deleter to call, so Reservoir frees its block here, as
        # PyTorch's deleter would have.
        # PyTorch's own function would refuse such a storage ("Expected standard
        # deleter"): it has none to swap out.
        storage = torch.UntypedStorage._new_with_weak_ptr(cdata)
        address = storage.data_ptr() if storage is not None else None
        del storage
        if address is None or not any(entry[1] == address for entry in _adopted):
            return original(cdata)
        _adopted[:] = [entry for entry in _adopted if entry[1] != address]
        try:
            _reservoir.raw_free(address)
        except _reservoir.ReservoirInvalidPointerError:
            pass  # freed by a later restore already
        return None

    return free_and_remove_deleter


def make_empty_cache(original):
    def empty_cache(*args, **kwargs):
        reclaim_dead_storages()
        return original(*args, **kwargs)

    return empty_cache


def make_begin_current_thread(original):
    def begin_allocate_current_thread_to_pool(device, pool):
        reclaim_dead_storages()  # memory the pool may reuse before it records
        return original(device, pool)

    return begin_allocate_current_thread_to_pool


# The C functions of each torch.cuda.memory.CUDAPluggableAllocator made since install(),
# by id() of the wrapper and of its C++ allocator (vLLM passes the latter to MemPool);
# the objects are kept with them, so an id is never reused for another.
_pluggables = {}


def make_pluggable_init(original):
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name, *args, **kwargs):
        original(self, path_to_so_file, alloc_fn_name, free_fn_name, *args, **kwargs)
        library = ctypes.CDLL(path_to_so_file)  # the same handle PyTorch's dlopen got
        functions = tuple(ctypes.cast(getattr(library, name), ctypes.c_void_p).value
                          for name in (alloc_fn_name, free_fn_name))
        for obj in (self, getattr(self, "_allocator", None)):
            if obj is not None:
                _pluggables[id(obj)] = (obj, functions)

    return __init__


def pluggable_functions(allocator):
    """(alloc address, free address) of a CUDAPluggableAllocator made since install()
    (the wrapper or its ._allocator), else None."""
    entry = _pluggables.get(id(allocator))
    return entry[1] if entry is not None and entry[0] is allocator else None


def make_mem_pool(torch):
    # The installed PyTorch's API, no more: MemPool.allocator is newer than some
    # versions (torch 2.11 has none), and code written for those must meet the same
    # AttributeError under Reservoir as without it.
    has_allocator = hasattr(getattr(torch.cuda, "MemPool", object), "allocator")

    class MemPool(_reservoir.MemPool):
        """torch.cuda.MemPool under Reservoir: a Reservoir private pool whose id comes
        from torch.cuda.graph_pool_handle(), so it works with torch.cuda.use_mem_pool,
        torch.cuda.graph(pool=...) and torch.cuda.memory_snapshot(mempool_id). With
        allocator, a torch.cuda.memory.CUDAPluggableAllocator made after
        reservoir.torch.install() (or its ._allocator), the pool's segments come from
        that allocator's alloc and free functions, and the pool splits and caches
        blocks inside them (PyTorch's meaning; vLLM's sleep mode)."""

        def __init__(self, allocator=None, use_on_oom=False, no_split=False):
            device = torch.cuda.current_device()
            if allocator is not None:
                functions = pluggable_functions(allocator)
                if functions is None:
                    raise RuntimeError(
                        "Reservoir: torch.cuda.MemPool(allocator=%r): Reservoir serves a "
                        "pool's segments from a torch.cuda.memory.CUDAPluggableAllocator "
                        "(or its ._allocator) made after reservoir.torch.install(); make "
                        "the allocator after install(), or create the MemPool without one"
                        % (allocator,))
                super().__init__(use_on_oom=use_on_oom, no_split=no_split, device=device,
                                 pluggable=functions)
            else:
                pool_id = tuple(torch.cuda.graph_pool_handle())
                super().__init__(use_on_oom=use_on_oom, no_split=no_split, device=device,
                                 pool_id=pool_id)
            if has_allocator:
                self.allocator = allocator

        def snapshot(self, include_traces=True):
            return torch.cuda.memory_snapshot(self._live_id(), include_traces=include_traces)

        def release(self, empty_cache=True):
            """As PyTorch's destructor: the use dropped and, at the last one, the
            pool's cached memory given back now (emptyCache with the pool active)."""
            super().release(empty_cache=empty_cache)

    return MemPool


def patch(torch, native=False):
    """Replaces the entry points above (idempotent); returns the names replaced.
    native: PyTorch's allocator is reservoir._torch_native's, which answers the
    checkpoint calls itself (and its restores give live storages their deleter, as
    PyTorch's own allocator does), so only MemPool is replaced."""
    replacements = {} if native else {
        "_cuda_getCheckpointState": lambda original: get_checkpoint_state,
        "_cuda_setCheckpointPoolState": lambda original: make_set_checkpoint_pool_state(torch),
        "_cuda_checkPoolLiveAllocations": lambda original: check_pool_live_allocations,
        "_cuda_cudaCachingAllocator_raw_delete": make_raw_delete,
        "_cuda_beginAllocateCurrentThreadToPool": make_begin_current_thread,
        "_free_And_Remove_DeleterFn": lambda original: make_free_and_remove_deleter(torch),
        "_cuda_emptyCache": make_empty_cache,
    }
    replaced = []
    for name, make in replacements.items():
        current = getattr(torch._C, name, None)
        if current is None or getattr(current, _MARK, False):
            continue
        function = make(current)

        def entry(*args, _function=function, **kwargs):
            return _function(*args, **kwargs)

        entry.__name__ = name
        entry.__doc__ = "Reservoir's answer to torch._C.%s (reservoir.torch.install())" % name
        setattr(entry, _MARK, True)
        setattr(torch._C, name, entry)
        replaced.append(name)
    memory = getattr(torch.cuda, "memory", None)
    pluggable = getattr(memory, "CUDAPluggableAllocator", None)
    if pluggable is not None and not getattr(pluggable.__init__, _MARK, False):
        init = make_pluggable_init(pluggable.__init__)
        setattr(init, _MARK, True)
        pluggable.__init__ = init
        replaced.append("torch.cuda.memory.CUDAPluggableAllocator.__init__")
    pool_class = make_mem_pool(torch)
    for module in (torch.cuda, getattr(torch.cuda, "memory", None)):
        if module is not None and hasattr(module, "MemPool") and \
                not getattr(module.MemPool, _MARK, False):
            setattr(pool_class, _MARK, True)
            module.MemPool = pool_class
            replaced.append(module.__name__ + ".MemPool")
    return replaced
