"""Checking the arguments of the Python API before they reach ctypes.

ctypes converts silently: a str passed where a pointer is expected becomes the
address of its bytes, and an int too large for the C type is truncated (2**64 + 5
becomes stream 5). Every int that crosses into the library is checked here
instead: the wrong type raises TypeError, a value outside the C type's range
raises ReservoirInvalidArgumentError (a ValueError) naming it. Text (paths,
settings) is checked too: C reads a str only up to its first NUL character.
"""

import operator
import os

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
        kind, colon, index = device.partition(":")
        if kind != "cuda" or (colon and not index.isdigit()):  # "cuda:" names no device
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


def file_descriptor(value, what):
    """A file descriptor (a C int): an int, never a negative or one beyond a C int
    that ctypes would wrap into another descriptor."""
    fd = as_int(value, what)
    if not 0 <= fd <= _INT_MAX:
        raise invalid("%s %d is not a file descriptor" % (what, fd))
    return fd


def count(value, what):
    """A positive count that crosses as a size_t (ctypes would wrap a larger one)."""
    number = as_int(value, what)
    if not 1 <= number < _UINTPTR_LIMIT:
        raise invalid("%s must be a positive int below 2**64, not %d" % (what, number))
    return number


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


def pool_id(pool, what="pool"):
    """A private pool's id, (first, second), each an int in [0, 2**64) (PyTorch's
    MempoolId_t: a pair of uint64), from a tuple or list of two ints."""
    if isinstance(pool, (str, bytes)) or not hasattr(pool, "__len__") or \
            not hasattr(pool, "__iter__"):
        raise TypeError("%s must be a MemPool or a pool id (a pair of ints), not %s"
                        % (what, type(pool).__name__))
    if len(pool) != 2:
        raise invalid("%s id %r is not a pair of ints (first, second)" % (what, pool))
    first, second = (as_int(part, what + " id part") for part in pool)
    if not (0 <= first < _UINTPTR_LIMIT and 0 <= second < _UINTPTR_LIMIT):
        raise invalid("%s id (%d, %d) is out of range: each part is an unsigned 64-bit "
                      "value, in [0, 2**64)" % (what, first, second))
    return (first, second)


def text(value, what):
    """A str for the C library as bytes; refuses NUL, where C would cut it short."""
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (what, type(value).__name__))
    return _without_nul(value.encode(), what)


def path(value, what="path"):
    """A file path (str, bytes or os.PathLike) as bytes for the C library."""
    try:
        encoded = os.fsencode(value)
    except TypeError:
        raise TypeError("%s must be a str, bytes or os.PathLike, not %s"
                        % (what, type(value).__name__)) from None
    return _without_nul(encoded, what)


def _without_nul(encoded, what):
    if b"\0" in encoded:
        raise invalid("%s %r contains a NUL character, which C would take as its end"
                      % (what, encoded))
    return encoded


def address(ptr, what="ptr"):
    """A device address as an int in [0, 2**64), or None for 0 / None."""
    if ptr is None:
        return None
    value = as_int(ptr, what)
    if not 0 <= value < _UINTPTR_LIMIT:
        raise invalid("%s %d is not an address (addresses are in [0, 2**64))" % (what, value))
    return value or None
