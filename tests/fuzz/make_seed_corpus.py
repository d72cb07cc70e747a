#!/usr/bin/env python3
"""Writes the seed corpus of the random-walk fuzzer to tests/corpus/seed-*.bin.

Each seed is a short walk in the encoding of tests/fuzz/random_walk.hpp (keep the
opcodes below in step with it). Seeds cover each step kind at least once so that
libFuzzer starts from inputs that already reach every part of the engine, and the
corpus replayer test runs them in every CI flavour. Crashers (crash-*.bin) in the
same directory are left alone.

Usage: tests/fuzz/make_seed_corpus.py [output-directory]
"""
import pathlib
import random
import sys

# Opcodes: the first byte of each range in random_walk.hpp.
ALLOC, FREE, BAD, RECORD, ADVANCE, SYNC, EAGER, EMPTY = 0, 10, 16, 17, 18, 20, 21, 22
FRACTION, CONFIG, FAULT, RESET, CAPACITY, CALLBACK, QUERY, FREE_ALL, DEVICE = range(23, 32)
CONFIG_ROWS = 39  # len(kConfigs)

# Size classes of size_for().
TINY, SMALL, MEDIUM, LARGE, BIG, EDGE, HUGE, ZERO = range(8)


class Walk:
    def __init__(self, initial_config=0):
        self.b = bytearray([initial_config])

    def alloc(self, cls, s=0, stream=0, device=0, current=False):
        a = cls | (stream << 3) | (device << 5) | (0xC0 if current else 0)
        self.b += bytes([ALLOC, a, s & 0xFF, (s >> 8) & 0xFF])
        return self

    def op(self, code, *args):
        self.b += bytes([code, *args])
        return self

    def free(self, index=0):
        return self.op(FREE, index)

    def bad(self, pointer_kind, action, arg=0):
        return self.op(BAD, pointer_kind | (action << 2), arg)

    def record(self, index, stream):
        return self.op(RECORD, index, stream)

    def fault(self, kind, arg=0):
        return self.op(FAULT, kind, arg)


def pools_seed():
    """Private pools (kOpDevice with arguments of 0x80 and up, walk_pools.cpp)."""
    w = Walk()
    w.op(DEVICE, 0x80, 0)  # slot 0, device 0
    w.op(DEVICE, 0x81)  # route this thread to it
    for i in range(6):
        w.alloc(SMALL, s=i * 31)
    w.free(1)
    w.op(DEVICE, 0x85)  # checkpoint
    w.alloc(MEDIUM, s=7)
    w.free(0)
    w.op(DEVICE, 0x86)  # restore
    w.op(DEVICE, 0x87)  # live blocks as the walk expects
    w.op(DEVICE, 0x83)  # end the route
    w.op(DEVICE, 0x88, 3)  # slot 1: use_on_oom, no_split
    w.op(DEVICE, 0x8A, 2)  # capture on stream 2
    w.alloc(SMALL, stream=2)
    w.record(6, 1)
    w.free(6)
    w.op(EMPTY, 0)
    w.op(DEVICE, 0x8B)  # end: the deferred free records its event
    w.op(DEVICE, 0x84)  # release slot 0
    w.op(FREE_ALL, 0)
    w.op(EMPTY, 0)
    w.op(DEVICE, 0x8C)  # release slot 1
    w.op(EMPTY, 0)
    return w


def seeds():
    out = {"pools": pools_seed()}
    w = Walk()
    for i in range(24):
        w.alloc(TINY if i % 2 else SMALL, s=i * 97)
    for i in range(24):
        w.free(i * 7)
    out["small-churn"] = w

    for cls in range(8):
        w = Walk()
        for s in (0, 1, 0x7FFF, 0xFFFF):
            w.alloc(cls, s=s).free(0)
        out[f"class-{cls}"] = w

    w = Walk().alloc(LARGE, s=40000).free(0).alloc(LARGE, s=1000).alloc(MEDIUM, s=2000)
    out["large-split"] = w.op(QUERY, 0).op(QUERY, 6).free(1).free(0).op(EMPTY, 0)

    w = Walk().alloc(SMALL, s=500, stream=1).record(0, 2).record(0, 3).free(0)
    w.alloc(SMALL, s=500, stream=1).op(ADVANCE, 2).alloc(SMALL, s=500, stream=1)
    out["cross-stream"] = w.op(ADVANCE, 3).alloc(SMALL, s=500, stream=1).op(FREE_ALL, 0)
    out["cross-stream-eager"] = Walk().op(EAGER).alloc(MEDIUM, 9, 1).record(0, 2).free(0).alloc(
        MEDIUM, 9, 1).op(EAGER).op(EMPTY, 0)
    w = Walk().alloc(LARGE, s=3000, stream=2).record(0, 1).free(0)
    out["pending-then-empty-cache"] = w.op(EMPTY, 1).alloc(LARGE, s=3000, stream=2)
    w = Walk().alloc(TINY, 5, 0).record(0, 1).free(0).op(SYNC, 1 | (1 << 2)).op(SYNC, 0)
    out["host-wait"] = w.alloc(TINY, 5, 0).op(SYNC, 2).op(FREE_ALL, 0)

    w = Walk()
    for i in range(6):
        w.alloc(BIG, s=0x3000 * i, stream=i % 4)
    out["oom-capacity"] = w.op(FREE_ALL, 0).op(EMPTY, 0).alloc(BIG, 0xFFFF)
    w = Walk().op(FRACTION, 0, 64).alloc(BIG, 0x8000).alloc(BIG, 0x8000).op(FRACTION, 0, 128)
    out["fraction"] = w.alloc(BIG, 0x8000).op(FRACTION, 1, 0).alloc(TINY, 1, 0, 1).op(FREE_ALL, 0)

    for start in range(0, CONFIG_ROWS, 5):
        w = Walk(start % 8)
        for row in range(start, min(start + 5, CONFIG_ROWS)):
            w.op(CONFIG, row).alloc(EDGE, row * 17).alloc(LARGE, row * 999).free(0)
        out[f"config-{start:02d}"] = w.op(FREE_ALL, 0).op(EMPTY, 0)
    for initial in range(8):
        w = Walk(initial).alloc(MEDIUM, 300).alloc(LARGE, 7000, 1).alloc(EDGE, 5)
        out[f"initial-config-{initial}"] = w.free(1).alloc(MEDIUM, 100).op(FREE_ALL, 0)

    for kind, initial in [(k, 0) for k in range(5)] + [(3, 5), (4, 5)]:  # 5: expandable
        w = Walk(initial)
        for arg in range(0, 77, 7):
            w.alloc(LARGE, 500 + arg, arg % 4).record(0, (arg + 1) % 4).free(0)
            w.fault(kind, arg).alloc(MEDIUM, arg * 50, arg % 4)
            w.fault(kind, arg).op(EMPTY, 0)
        out[f"fault-{kind}" + ("-expandable" if initial else "")] = w.op(FREE_ALL, 0)

    # Cleanup calls failing (fault kind 2 with arg >= 128: release_physical,
    # release_address_range, synchronize_stream, once or for the whole next step),
    # and undo calls failing while a grow of an expandable segment fails.
    w = Walk(5)
    for arg in range(128, 256, 7):
        w.alloc(LARGE, arg * 40, arg % 4).alloc(MEDIUM, arg * 90, arg % 4).record(0, 3).free(0)
        w.fault(2, arg).op(EMPTY, 0).fault(2, arg).alloc(BIG, arg * 200, arg % 4)
    out["fault-cleanup-expandable"] = w.op(FREE_ALL, 0).op(EMPTY, 0)
    w = Walk(5)
    for undo in (7, 18, 40, 8):  # unmap (1st, 2nd, 3rd call), create_physical
        for grow in (6, 17, 9, 20, 30):  # map, set_access (1st, 2nd call), create_physical
            w.fault(4, undo).fault(4, grow).alloc(BIG, undo * grow * 40, grow % 4).op(EMPTY, 0)
            w.fault(3, undo).fault(4, grow).alloc(LARGE, grow * 900).free(0).op(FREE_ALL, 0)
    out["fault-undo-expandable"] = w.op(EMPTY, 0)

    w = Walk().alloc(SMALL, 100).alloc(LARGE, 100, 1).free(0)
    for action in range(6):
        for pointer_kind in range(4):
            w.bad(pointer_kind, action, action * 4 + pointer_kind)
    out["bad-inputs"] = w.op(FREE_ALL, 0)

    w = Walk().op(CALLBACK)
    for i in range(8):
        w.alloc(BIG, 0x2000 * i, i % 2)
    out["free-memory-callback"] = w.op(CALLBACK).op(FREE_ALL, 0)

    w = Walk(3).op(FRACTION, 0, 100)
    for i in range(12):
        w.alloc(LARGE, 1000 * i, 1).free(0)
    out["garbage-collection"] = w.alloc(BIG, 0xFFFF, 1)

    w = Walk().op(DEVICE, 1).alloc(SMALL, 77, 1, current=True).alloc(LARGE, 77, 2, device=0)
    out["two-devices"] = w.op(DEVICE, 0).alloc(TINY, 3, current=True).op(EMPTY, 2).op(FREE_ALL, 1)

    w = Walk(1)
    for s in (0x6000, 0x7000, 0x8000, 0x5000):
        w.alloc(BIG, s)
    out["oversize"] = w.free(0).free(0).alloc(BIG, 0x6100).alloc(LARGE, 0xF000).op(FREE_ALL, 0)

    # Frees taken back by the next request of their size (a free's 0xFF), or merged
    # first when another free block fits better (the engine's parked free).
    w = Walk()
    for cls, s in ((SMALL, 100), (SMALL, 100), (MEDIUM, 5), (LARGE, 40), (SMALL, 100)):
        w.alloc(cls, s)
    w.free(0xFF).free(0xFF).free(1).free(0xFF).alloc(SMALL, 100).free(0xFF)
    out["parked-free"] = w.op(QUERY, 0).free(0xFF).op(EMPTY, 0).free(0xFF).op(FREE_ALL, 0)

    # policy:compact (a config row of 0xF0): a large block freed and asked for again on
    # its stream waits in the stream's cache; a second one, another size, another
    # stream, a use on another stream and empty_cache drain or bypass it.
    w = Walk().op(CONFIG, 0xF0)
    for _ in range(4):
        w.alloc(LARGE, 40, stream=1).free(0)
    w.alloc(LARGE, 40, stream=1).alloc(LARGE, 40, stream=1).free(0).free(0)
    w.alloc(LARGE, 40, stream=1).alloc(LARGE, 41, stream=1).free(0).free(0)
    w.alloc(LARGE, 40, stream=2).record(0, 1).free(0).alloc(LARGE, 40, stream=2)
    w.op(EMPTY, 0).alloc(LARGE, 40, stream=1).free(0).alloc(MEDIUM, 20000, stream=1)
    out["compact-large-reuse"] = w.op(FREE_ALL, 0).op(EMPTY, 0)

    w = Walk().alloc(MEDIUM, 10).op(RESET, 0).alloc(MEDIUM, 20).op(RESET, 2).free(0)
    out["stats-queries"] = w.op(QUERY, 2).op(QUERY, 3).op(RESET, 1).op(FREE_ALL, 0)

    w = Walk().alloc(BIG, 0x1000).op(CAPACITY, 0).alloc(LARGE, 10).op(CAPACITY, 6)
    out["capacity"] = w.alloc(LARGE, 10).op(FREE_ALL, 0).op(EMPTY, 0)

    # Random walks of well-formed steps. They leave out the fraction and config
    # steps, whose known findings (crash-*.bin) would stop them early.
    rng = random.Random(20240607)
    steps = [ALLOC] * 10 + [FREE] * 6 + [BAD, RECORD, ADVANCE, SYNC, EAGER, EMPTY, FAULT, RESET,
                                          CAPACITY, CALLBACK, QUERY, DEVICE]
    arity = {ALLOC: 3, BAD: 2, RECORD: 2, FAULT: 2, EAGER: 0, CALLBACK: 0}
    for i in range(8):
        w = Walk(rng.randrange(8))
        for _ in range(150 + 50 * i):
            code = rng.choice(steps)
            w.op(code, *(rng.randrange(256) for _ in range(arity.get(code, 1))))
        out[f"random-{i}"] = w
    return out


def main():
    here = pathlib.Path(__file__).resolve().parent
    target = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else here.parent / "corpus"
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("seed-*.bin"):
        old.unlink()
    for name, walk in seeds().items():
        (target / f"seed-{name}.bin").write_bytes(bytes(walk.b))
    print(f"wrote {len(seeds())} seeds to {target}")


if __name__ == "__main__":
    main()
