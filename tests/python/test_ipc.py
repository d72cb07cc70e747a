"""reservoir.share / reservoir.open / reservoir.close (docs/ipc.md) on the simulated
device: a forked child opens a block the parent shared over a Unix socket (the
simulated device's synthetic memory holds no data, so this checks the handle's
passage, the receiver's cache and the refusals; tests/ipc has the data checks)."""

import importlib.util
import os
import socket
import sys
import unittest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if importlib.util.find_spec("reservoir") is None:
    sys.path.insert(0, os.path.join(_REPO, "python"))

import reservoir  # noqa: E402

MiB = 1 << 20


def in_child(body):
    """Forks; the child runs body(sock) and reports its result (a short bytes)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        parent.close()
        try:
            answer = body(child)
        except Exception as e:  # reported to the parent
            answer = ("error " + type(e).__name__ + ": " + str(e)).encode()[:200]
        child.sendall(answer.ljust(200))
        os._exit(0)
    child.close()
    return parent, pid


class ShareOpen(unittest.TestCase):
    def test_a_child_opens_twice_and_gets_one_mapping(self):
        p = reservoir.raw_alloc(3 * MiB)

        def body(sock):
            q1 = reservoir.open(sock)
            q2 = reservoir.open(sock)  # a second share of the same block
            same = q1 == q2 and q1 != 0
            reservoir.close(q2)
            reservoir.close(q1)
            try:
                reservoir.close(q1)  # no open left
                return b"closed twice"
            except reservoir.ReservoirInvalidPointerError:
                pass
            return b"same" if same else b"different"

        sock, pid = in_child(body)
        reservoir.share(p, sock)
        reservoir.share(p, sock.fileno())  # a descriptor works too
        answer = sock.recv(200).strip()
        sock.close()
        os.waitpid(pid, 0)
        reservoir.raw_free(p)
        self.assertEqual(answer, b"same")

    def test_opening_in_the_sharing_process_returns_the_pointer(self):
        p = reservoir.raw_alloc(MiB)
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reservoir.share(p, a)
        self.assertEqual(reservoir.open(b), p)
        reservoir.close(p)
        reservoir.raw_free(p)
        a.close()
        b.close()

    def test_keep_holds_the_free_back_until_unshare(self):
        p = reservoir.raw_alloc(MiB)
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        before = reservoir.memory_stats()["allocated_bytes.all.current"]
        reservoir.share(p, a, keep=True)
        reservoir.raw_free(p)
        self.assertEqual(reservoir.memory_stats()["allocated_bytes.all.current"], before)
        reservoir.unshare(p)
        self.assertEqual(reservoir.memory_stats()["allocated_bytes.all.current"], before - MiB)
        a.close()
        b.close()

    def test_refusals(self):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with self.assertRaises(reservoir.ReservoirInvalidPointerError):
            reservoir.share(0x1000, a)
        a.sendall(b"not a handle at all")
        with self.assertRaises(reservoir.ReservoirIoError):
            reservoir.open(b)
        with self.assertRaises(reservoir.ReservoirInvalidPointerError):
            reservoir.close(0x1000)
        with self.assertRaises(TypeError):
            reservoir.share("abc", a)
        a.close()
        b.close()


if __name__ == "__main__":
    unittest.main()
