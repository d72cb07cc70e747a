#!/usr/bin/env python3
"""Two processes share a CuPy array allocated by Reservoir (docs/ipc.md): the parent
fills it and sends its handle over a Unix socket with reservoir.share; the child
(spawned, since a CUDA context does not survive fork) opens it with reservoir.open,
checks the parent's values and writes its own, which the parent then reads.

    PYTHONPATH=python python3 examples/cupy_ipc.py [expandable]

With "expandable" the array lives in an expandable segment, whose pages travel as
file descriptors. Exits with 77 (skipped) without CuPy or a CUDA device.
"""

import os
import socket
import subprocess
import sys

SKIP = 77
N = 1 << 20  # float32 values: 4 MiB


def child(fd):
    import cupy

    import reservoir

    sock = socket.socket(fileno=fd)
    ptr = reservoir.open(sock)
    mem = cupy.cuda.UnownedMemory(ptr, N * 4, owner=None)
    b = cupy.ndarray((N,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
    ok = bool((b == cupy.arange(N, dtype=cupy.float32)).all())
    b[: N // 2] = -1.0
    cupy.cuda.Device().synchronize()
    del b
    reservoir.close(ptr)
    sock.sendall(b"1" if ok else b"0")
    return 0


def main():
    try:
        import cupy
    except ImportError:
        print("skipped: CuPy is not installed (python3 -m pip install cupy-cuda12x)")
        return SKIP
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        devices = 0
    if devices == 0:
        print("skipped: CuPy sees no CUDA device")
        return SKIP
    import reservoir
    import reservoir.cupy

    if sys.argv[1:] == ["expandable"]:
        reservoir.update_config("expandable_segments:True")
    reservoir.cupy.install()
    a = cupy.arange(N, dtype=cupy.float32)  # from Reservoir
    cupy.cuda.Device().synchronize()
    parent, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(other.fileno())], pass_fds=[other.fileno()]
    )
    other.close()
    reservoir.share(a.data.ptr, parent)
    child_saw = parent.recv(1) == b"1"  # the child has written and closed
    rc = proc.wait()
    parent_sees = bool((a[: N // 2] == -1.0).all()) and bool((a[N // 2 :] >= N // 2).all())
    print("child saw the parent's values: %s" % child_saw)
    print("parent sees the child's writes: %s" % parent_sees)
    ok = child_saw and parent_sees and rc == 0
    print("cupy_ipc: %s" % ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(child(int(sys.argv[2])))
    sys.exit(main())
