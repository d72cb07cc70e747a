"""Checking the arguments of the Python API before they reach ctypes.

ctypes converts silently: a str passed where a pointer is expected becomes the
address of its bytes, and an int too large for the C type is truncated (2**64 + 5
becomes stream 5). Every int that crosses into the library is checked here
instead: the wrong type raises TypeError, a value outside the C type's range
raises ReservoirInvalidArgumentError (a ValueError) naming it.
"""

import operator

from ._lib import ReservoirInvalidArgumentError

_INVALID_ARGUMENT = 3
_UINTPTR_LIMIT = 1 << 64
_INT_MAX = (1 << 31) - 1


def as_int(value, what):
    """value as a Python int: an int or anything with __index__ (numpy integers),
    never a bool, a float or a str."""
    if isinstance(value, bool):
        raise TypeError("%s must be an int, not bool" % what)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int, not %s" % (what, type(value).__name__)) from None


def invalid(message):
    return ReservoirInvalidArgumentError(_INVALID_ARGUMENT, message)


def device_index(device):
    """-1 (the current device) for None; an index for an int, "cuda"/"cuda:N", a
    torch.device or a cupy.cuda.Device."""
    if device is None:
        return -1
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda" or (index and not index.isdigit()):
            raise ValueError("device string must be 'cuda' or 'cuda:N', not %r" % device)
        return _in_int_range(int(index), device) if index else -1
    if isinstance(device, bool):
        raise TypeError("device must be an int, a 'cuda:N' string or a device object, not bool")
    if hasattr(device, "__index__"):
        return _in_int_range(as_int(device, "device"), device)
    kind = getattr(device, "type", None)
    if kind is not None:  # torch.device
        if kind != "cuda":
            raise ValueError("Reservoir manages CUDA memory: device %r is not a CUDA device"
                             % (device,))
        index = getattr(device, "index", None)
        return -1 if index is None else _in_int_range(int(index), device)
    if hasattr(device, "id"):  # cupy.cuda.Device
        return _in_int_range(as_int(device.id, "device id"), device)
    raise TypeError("unsupported device %r: use None, an int, 'cuda:N' or a device object"
                    % (device,))


def _in_int_range(index, device):
    # Below -1 the library refuses with its own message; beyond a C int, ctypes
    # would wrap the number into some other device.
    if index > _INT_MAX:
        raise invalid("device %r does not exist" % (device,))
    return index


def stream_handle(stream):
    """A cudaStream_t as an int in [0, 2**64): an int, a torch.cuda.Stream (its
    cuda_stream) or a cupy.cuda.Stream (its ptr)."""
    for attribute in ("cuda_stream", "ptr"):
        handle = getattr(stream, attribute, None)
        if handle is not None and not isinstance(stream, int):
            stream = handle
            break
    value = as_int(stream, "stream")
    if not 0 <= value < _UINTPTR_LIMIT:
        raise invalid(
            "stream %d is not a stream handle: a cudaStream_t is an unsigned 64-bit value "
            "(0 is the default stream)" % value
        )
    return value


def address(ptr, what="ptr"):
    """A device address as an int in [0, 2**64), or None for 0 / None."""
    if ptr is None:
        return None
    value = as_int(ptr, what)
    if not 0 <= value < _UINTPTR_LIMIT:
        raise invalid("%s %d is not an address (addresses are in [0, 2**64))" % (what, value))
    return value or None
