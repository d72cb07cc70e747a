"""Tagged memory: sleep and wake (docs/sleep.md).

    with reservoir.tag("kv"):                  # this thread's requests carry "kv"
        cache = reservoir.raw_alloc(1 << 30)
    reservoir.sleep("kv", mode="offload")       # device memory back, addresses kept
    ...
    reservoir.wake("kv")                        # mapped again, contents restored

A tag is a name of 1 to 63 letters, digits, '_', '-', '.' and ':', known to the whole
process. Its requests go to its own pool (expandable segments); private pools made
while it is current (a MemPool's, a CUDA graph's) carry it too, and sleep with it.
"""

import contextlib
import ctypes

from . import _args, _lib

_MODES = {"offload": _lib.RESERVOIR_SLEEP_OFFLOAD, "discard": _lib.RESERVOIR_SLEEP_DISCARD}
_MODE_NAMES = {value: name for name, value in _MODES.items()}


def _name(tag):
    """The tag's name as bytes for C; TypeError for anything but a str. The library
    checks the name itself (ReservoirInvalidArgumentError naming what is wrong)."""
    return _args.text(tag, "tag")


@contextlib.contextmanager
def tag(name):
    """Tags the calling thread's requests with name while the block runs (also a
    decorator): they go to the tag's own pool, and private pools made meanwhile (a
    MemPool, a CUDA graph captured on this thread) carry the tag. Scopes nest; the tag
    is popped when the block ends, even by an exception. Under reservoir.torch the
    thread's torch tensors are tagged too. A name that is not 1 to 63 of [A-Za-z0-9_.:-]
    raises ReservoirInvalidArgumentError (a ValueError), a non-str TypeError."""
    text = _name(name)
    lib = _lib.load()
    _lib.check(lib.reservoir_push_tag(text))
    try:
        yield name
    finally:
        _lib.check(lib.reservoir_pop_tag())


def _mode(mode):
    value = _MODES.get(mode) if isinstance(mode, str) else None
    if value is None:
        raise _args.invalid("sleep: mode must be 'offload' or 'discard', not %r" % (mode,))
    return value


def sleep(tag, mode="offload", device=None):
    """Gives the device memory under the tag's blocks back once the work that used it
    is done, keeping every address reserved (pointers and captured CUDA graphs stay
    valid) until wake(). mode "offload" keeps the contents in pinned host memory for
    wake() to restore; "discard" leaves them undefined. While asleep, requests under the
    tag raise ReservoirInvalidArgumentError; frees and record_stream work. An unknown
    tag, one asleep already and a capture under way raise ReservoirInvalidArgumentError
    (a ValueError); a failed sleep leaves the tag as it was."""
    text = _name(tag)
    value = _mode(mode)
    _lib.check(_lib.load().reservoir_sleep(text, value, _args.device_index(device)))


def wake(tag, device=None, stream=None):
    """Maps memory under a sleeping tag's blocks again (their contents restored when
    it slept with "offload"). With a stream (an int handle, a torch.cuda.Stream or a
    cupy.cuda.Stream) the copies back are enqueued on it and not waited for: work on
    that stream, or work that waits for it, may use the memory at once. An unknown
    tag, one not asleep and a capture under way raise ReservoirInvalidArgumentError (a
    ValueError); no room on the device raises ReservoirOutOfMemoryError, the tag
    staying asleep."""
    text = _name(tag)
    lib = _lib.load()
    if stream is None:
        _lib.check(lib.reservoir_wake(text, _args.device_index(device)))
    else:
        handle = _args.stream_handle(stream)
        _lib.check(lib.reservoir_wake_async(text, handle, _args.device_index(device)))


def empty_host_cache():
    """Frees the pinned host memory that wakes keep for the next offload (pinning is
    the slow part of an offload, so a tag that sleeps again reuses it), on every
    device; what a tag asleep still holds stays. memory_stats()["host_kept_bytes"]
    counts it."""
    _lib.check(_lib.load().reservoir_empty_host_cache())


def tag_state(tag, device=None):
    """The tag's state on a device as a dict: name, asleep (bool), mode ("offload" or
    "discard" while asleep, else None), allocated_bytes and reserved_bytes (mapped
    now), asleep_bytes (reserved addresses without memory), offloaded_bytes (contents
    kept in host memory) and pools (its own and the private pools carrying it). An
    unknown tag raises ReservoirInvalidArgumentError (a ValueError)."""
    text = _name(tag)
    state = _lib.TagState()
    _lib.check(_lib.load().reservoir_get_tag_state(text, _args.device_index(device),
                                                   ctypes.byref(state)))
    asleep = bool(state.asleep)
    return {"name": tag, "asleep": asleep,
            "mode": _MODE_NAMES.get(state.mode, state.mode) if asleep else None,
            "allocated_bytes": state.allocated_bytes, "reserved_bytes": state.reserved_bytes,
            "asleep_bytes": state.asleep_bytes, "offloaded_bytes": state.offloaded_bytes,
            "pools": state.pools}
