"""Sharing Reservoir blocks with other processes (docs/ipc.md), over a connected
Unix socket: share() sends the block's handle (bytes, and for a block of an
expandable segment one file descriptor per page, by SCM_RIGHTS), open() in the
other process receives it and returns the block's address there.

The sender keeps the block allocated while receivers use it (PyTorch's rule);
share(ptr, sock, keep=True) makes Reservoir enforce it: a free of the block is
held back until unshare(ptr).
"""

import ctypes

from . import _args, _lib


def _fd(sock):
    """A socket object (socket.socket) or a descriptor (int) -> the descriptor."""
    if hasattr(sock, "fileno"):
        return _args.file_descriptor(sock.fileno(), "sock")
    return _args.file_descriptor(sock, "sock")


def share(ptr, sock, keep=False):
    """Sends the handle of the allocated block at ptr (an address from raw_alloc, or
    a tensor's or array's data pointer) over the connected Unix socket sock."""
    address = _args.address(ptr)
    _lib.check(_lib.load().reservoir_share(address, _fd(sock), 1 if keep else 0))


def unshare(ptr):
    """Ends keep for the block at ptr; frees it now when it was freed meanwhile."""
    _lib.check(_lib.load().reservoir_unshare(_args.address(ptr)))


def open(sock, device=None):  # noqa: A001 - reservoir.open, as the issue names it
    """Receives one handle from sock and maps the block in this process: its address
    (an int). Opening the same memory again returns the same address; each open needs
    its close()."""
    from . import _device_index

    ptr = ctypes.c_void_p()
    _lib.check(_lib.load().reservoir_open_shared(_fd(sock), _device_index(device), ctypes.byref(ptr)))
    return ptr.value or 0


def close(ptr):
    """Lets go of one open(); the mapping goes with the last one."""
    _lib.check(_lib.load().reservoir_close_shared(_args.address(ptr)))
