"""Telling Reservoir when a PyTorch program waited for the GPU.

PyTorch's pluggable-allocator interface has no hook for host synchronizations,
yet they matter to Reservoir twice: blocks freed while in use on a stream are
reusable as soon as the host has waited for that stream, and a trace being
recorded needs an ``s,STREAM`` line there so that reservoir-replay frees them at
the same point. patch(torch) wraps the Python entry points that block the host:

    torch.cuda.synchronize(device)        every stream of the device that PyTorch
    torch.accelerator.synchronize(device) allocated on or synchronized
    torch.cuda.Stream.synchronize()       that stream
    torch.cuda.Event.synchronize()        the stream the event was last recorded on

Implicit waits (tensor.item(), .cpu(), .tolist()) are not seen; their frees
complete when Reservoir next queries its events, as without the patch. Code that
bound a function before the patch (``from torch.cuda import synchronize``) keeps
the unwrapped one.
"""

import ctypes
import functools

from . import _lib

_MARK = "_reservoir_notifies"


def _functions():
    lib = _lib.load()
    device_sync = lib.reservoir_torch_device_synchronized
    device_sync.restype = ctypes.c_int
    device_sync.argtypes = [ctypes.c_int]
    stream_sync = lib.reservoir_torch_stream_synchronized
    stream_sync.restype = ctypes.c_int
    stream_sync.argtypes = [ctypes.c_size_t, ctypes.c_int]
    return device_sync, stream_sync


def _wrap(original, after):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        after(*args, **kwargs)
        return result

    setattr(wrapper, _MARK, True)
    return wrapper


def _patch(owner, name, after):
    original = getattr(owner, name, None)
    if original is None or getattr(original, _MARK, False):
        return False
    setattr(owner, name, _wrap(original, after))
    return True


def patch(torch):
    """Wraps the synchronizing functions of torch (idempotent). Returns the names
    wrapped by this call."""
    device_sync, stream_sync = _functions()

    def device_index(device=None):
        if device is None:
            return torch.cuda.current_device()
        return torch.cuda._utils._get_device_index(device, optional=True)

    def after_device_sync(device=None):
        _lib.check(device_sync(device_index(device)))

    def after_stream_sync(stream):
        _lib.check(stream_sync(stream.cuda_stream, stream.device.index))

    def after_event_record(event, stream=None):
        if stream is None:
            stream = torch.cuda.current_stream()
        try:
            event._reservoir_stream = (stream.cuda_stream, stream.device.index)
        except AttributeError:  # an event type without a __dict__
            pass

    def after_event_sync(event):
        recorded = getattr(event, "_reservoir_stream", None)
        if recorded is not None:
            _lib.check(stream_sync(*recorded))

    wrapped = []
    targets = [
        (torch.cuda, "synchronize", after_device_sync, "torch.cuda.synchronize"),
        (torch.cuda.Stream, "synchronize", after_stream_sync, "torch.cuda.Stream.synchronize"),
        (torch.cuda.Event, "record", after_event_record, "torch.cuda.Event.record"),
        (torch.cuda.Event, "synchronize", after_event_sync, "torch.cuda.Event.synchronize"),
    ]
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        targets.append((accelerator, "synchronize", after_device_sync,
                        "torch.accelerator.synchronize"))
    for owner, name, after, label in targets:
        if _patch(owner, name, after):
            wrapped.append(label)
    return wrapped
