"""torch.cuda's memory API answered by Reservoir.

Under a pluggable allocator PyTorch forwards allocation, free, empty_cache,
set_per_process_memory_fraction and record_stream, but not the queries: its C++
getDeviceStats, resetPeakStats, snapshot, recordHistory and getMemoryFraction
raise "CUDAPluggableAllocator does not yet support ...". Every Python function of
torch.cuda, torch.cuda.memory and torch.accelerator that reads allocator state
reaches those through a function of torch._C looked up at call time:

    torch._C entry point                  Python functions that use it
    _cuda_memoryStats                     memory_stats, memory_stats_as_nested_dict,
                                          memory_allocated, max_memory_allocated,
                                          memory_reserved, max_memory_reserved,
                                          memory_cached, memory_summary
    _cuda_resetPeakMemoryStats            reset_peak_memory_stats,
                                          reset_max_memory_allocated/cached
    _cuda_resetAccumulatedMemoryStats     reset_accumulated_memory_stats
    _cuda_memorySnapshot                  memory_snapshot, memory._snapshot,
                                          memory._dump_snapshot
    _cuda_record_memory_history(_legacy)  memory._record_memory_history
    _cuda_getMemoryFraction               get_per_process_memory_fraction
    _accelerator_getDeviceStats           torch.accelerator.memory_stats and the
                                          memory_allocated/... built on it
    _accelerator_resetPeakStats           torch.accelerator.reset_peak_memory_stats
    _accelerator_resetAccumulatedStats    torch.accelerator.reset_accumulated_memory_stats
    _accelerator_isAllocatorInitialized   torch.accelerator.memory_stats and empty_cache
                                          (they return {} / do nothing when it is False:
                                          it asks c10's own allocator, never initialized
                                          under a pluggable one)
    _accelerator_emptyCache               torch.accelerator.empty_cache
    _cuda_cudaCachingAllocator_set_       torch.cuda.memory._set_allocator_settings
      allocator_settings,                 (PyTorch parses them into its own allocator's
    _accelerator_setAllocatorSettings     settings, which Reservoir never reads)
    _cuda_attach_out_of_memory_observer   out-of-memory observers (called as PyTorch
                                          calls them: device, bytes asked, bytes
                                          allowed, bytes free)

so patch(torch) replaces those entry points, not the Python functions: it also
reaches code that imported a function before install() (``from torch.cuda import
memory_allocated``), and the Python functions keep PyTorch's own handling of the
device argument (None, int, "cuda:1", torch.device) and of an uninitialized CUDA.
Code that bound an entry point itself (``from torch._C import _cuda_memoryStats``)
before install() keeps the old one. The replacements take the device index
PyTorch's functions pass and return PyTorch's shapes: nested dicts with its key
names, the snapshot dict of torch.cuda.memory._snapshot() (from Reservoir's
snapshot pickle). Without the native part, memory history has no stack frames
(Reservoir records none through its C API); with it (reservoir._torch_native),
NATIVE_ANSWERS stay PyTorch's own: they reach the native allocator's
recordHistory and snapshot, which keep PyTorch's contexts. PyTorch cannot swap
its allocator back, so there is no unpatch.
"""

import os
import pickle
import tempfile

import reservoir as _reservoir

_MARK = "_reservoir_replacement"


def nested_stats(device):
    """reservoir.memory_stats(device) in the nested shape of torch._C._cuda_memoryStats:
    {"allocated_bytes": {"all": {"current": ...}, ...}, "num_ooms": ..., ...}."""
    nested = {}
    for key, value in _reservoir.memory_stats(device).items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def snapshot(include_traces=True):
    """Reservoir's state as the dict torch.cuda.memory._snapshot() returns
    (segments, device_traces, allocator_settings), read back from the snapshot
    pickle Reservoir writes for PyTorch's memory viewer."""
    handle, path = tempfile.mkstemp(prefix="reservoir-snapshot-", suffix=".pickle")
    os.close(handle)
    try:
        _reservoir.dump_snapshot(path)
        with open(path, "rb") as f:
            result = pickle.load(f)
    finally:
        os.unlink(path)
    if isinstance(result, dict) and "device_traces" in result:
        skip = _skip_actions[0]
        if not include_traces:
            result["device_traces"] = [[] for _ in result["device_traces"]]
        elif skip:
            result["device_traces"] = [[e for e in trace if e.get("action") not in skip]
                                       for trace in result["device_traces"]]
    return result


def _memory_snapshot(arg=None):
    # PyTorch passes None (_snapshot) or (pool_id_0, pool_id_1, include_traces)
    # (memory_snapshot): a pool id other than (0, 0) keeps that private pool's
    # segments only, as c10's snapshot of a MemPool does.
    include_traces = True
    pool = (0, 0)
    if isinstance(arg, tuple) and len(arg) >= 3:
        include_traces = bool(arg[2])
        pool = (int(arg[0]), int(arg[1]))
    result = snapshot(include_traces)
    if pool != (0, 0) and isinstance(result, dict):
        result["segments"] = [s for s in result.get("segments", [])
                              if tuple(s.get("segment_pool_id", (0, 0))) == pool]
    return result


_history = [False]
# The actions _record_memory_history(skip_actions=...) named: left out of the traces
# the snapshot returns (they still take their place in the ring of max_entries).
_skip_actions = [frozenset()]


def history_enabled():
    """Whether memory history is being recorded (torch._C._cuda_isHistoryEnabled)."""
    return _history[0]


def _history_entries(max_entries):
    return max(1, min(int(max_entries), (1 << 63) - 1))


def _record_memory_history(enabled, *args, **kwargs):
    # (enabled: "all" | "state" | None, context, stacks, max_entries, clear_history,
    # compile_context, global_record_annotations, skip_actions): on/off, the size of
    # the ring and the actions to leave out are Reservoir's.
    max_entries = kwargs.get("max_entries", args[2] if len(args) >= 3 else 100000)
    skip = kwargs.get("skip_actions", args[6] if len(args) >= 7 else None)
    _skip_actions[0] = frozenset(str(a) for a in (skip or ()))
    if enabled is None:
        _reservoir.record_history(False)
    else:
        _reservoir.record_history(True, _history_entries(max_entries))
    _history[0] = enabled is not None


def _record_memory_history_legacy(enabled, *args, **kwargs):
    # (enabled: bool, record_context, trace_alloc_max_entries, ...).
    max_entries = kwargs.get("trace_alloc_max_entries", args[1] if len(args) >= 2 else 1)
    _reservoir.record_history(bool(enabled), _history_entries(max_entries))
    _history[0] = bool(enabled)


# PyTorch's own entry points that patch() replaced, by name.
_originals = {}


def _entries(text):
    """The "key:value" entries of a settings string (commas inside [...] kept)."""
    entries, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c == "["
        depth -= c == "]"
        if c == "," and depth == 0:
            entries.append(text[start:i].strip())
            start = i + 1
    entries.append(text[start:].strip())
    return [e for e in entries if e]


def _set_allocator_settings(env):
    """torch.cuda.memory._set_allocator_settings: Reservoir's settings with PyTorch's
    meaning (reservoir.set_allocator_settings); the pinned host allocator's keys,
    which are PyTorch's own, also go to PyTorch."""
    pinned = [e for e in _entries(env) if e.split(":", 1)[0].strip().startswith("pinned_")]
    # PyTorch's own setter of the installed version (torch 2.11 has the accelerator one
    # only); first, so that a bad pinned_* value (its ValueError) changes nothing here.
    original = (_originals.get("_accelerator_setAllocatorSettings")
                or _originals.get("_cuda_cudaCachingAllocator_set_allocator_settings"))
    if pinned and original is not None:
        original(",".join(pinned))
    _reservoir.set_allocator_settings(env)


def _cuda_initialized():
    import torch

    return torch.cuda.is_initialized()


def _replacements():
    return {
        "_accelerator_isAllocatorInitialized": _cuda_initialized,
        "_accelerator_emptyCache": _reservoir.empty_cache,
        "_cuda_memoryStats": nested_stats,
        "_cuda_resetPeakMemoryStats": _reservoir.reset_peak_memory_stats,
        "_cuda_resetAccumulatedMemoryStats": _reservoir.reset_accumulated_memory_stats,
        "_cuda_memorySnapshot": _memory_snapshot,
        "_cuda_record_memory_history": _record_memory_history,
        "_cuda_record_memory_history_legacy": _record_memory_history_legacy,
        "_cuda_getMemoryFraction": _reservoir.get_memory_fraction,
        "_cuda_isHistoryEnabled": history_enabled,
        "_accelerator_getDeviceStats": nested_stats,
        "_accelerator_resetPeakStats": _reservoir.reset_peak_memory_stats,
        "_accelerator_resetAccumulatedStats": _reservoir.reset_accumulated_memory_stats,
        "_cuda_cudaCachingAllocator_set_allocator_settings": _set_allocator_settings,
        "_accelerator_setAllocatorSettings": _set_allocator_settings,
        "_cuda_attach_out_of_memory_observer": _reservoir.attach_oom_observer,
    }


# What the native part answers through PyTorch's own entry points (its recordHistory
# and snapshot, with PyTorch's stack frames): left as they are when it is in use.
NATIVE_ANSWERS = frozenset(("_cuda_memorySnapshot", "_cuda_record_memory_history",
                            "_cuda_record_memory_history_legacy", "_cuda_isHistoryEnabled"))


def patch(torch, native=False):
    """Replaces the entry points above that the installed PyTorch has (idempotent),
    but NATIVE_ANSWERS when the native part is in use. Returns the names replaced by
    this call."""
    replaced = []
    for name, function in _replacements().items():
        if native and name in NATIVE_ANSWERS:
            continue
        current = getattr(torch._C, name, None)
        if current is None or getattr(current, _MARK, False):
            continue
        _originals[name] = current

        def entry(*args, _function=function, **kwargs):
            return _function(*args, **kwargs)

        entry.__name__ = name
        entry.__doc__ = "Reservoir's answer to torch._C.%s (reservoir.torch.install())" % name
        setattr(entry, _MARK, True)
        setattr(torch._C, name, entry)
        replaced.append(name)
    return replaced
