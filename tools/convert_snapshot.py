#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot into a Reservoir trace (docs/trace_format.md).

    python3 tools/convert_snapshot.py snapshot.pickle out.trace.gz [--device N]

The snapshot is what torch.cuda.memory._snapshot() returns (or what
torch.cuda.memory._dump_snapshot() writes), taken after
torch.cuda.memory._record_memory_history(). Its 'device_traces' hold one list of
entries per device; the entries with action 'alloc' and 'free_requested' become
a,ID,SIZE,STREAM and f,ID lines (IDs in allocation order, streams numbered from 0
in order of first use). Other actions (segment_alloc, free_completed, oom, ...)
describe what PyTorch's allocator did, not what the program asked, and are ignored.

Standard library only: no torch needed. The pickle is read with an unpickler
that refuses any class or function reference, so a snapshot cannot run code.
"""

import argparse
import gzip
import io
import pickle
import sys

HEADER = "# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM"


class SnapshotError(Exception):
    """A file that is not a usable snapshot; the message says why."""


class _PlainUnpickler(pickle.Unpickler):
    # Snapshots are plain dicts, lists, strings and numbers. Anything naming a
    # global could execute code while loading, so it is refused.
    def find_class(self, module, name):
        raise SnapshotError(
            f"the snapshot refers to {module}.{name}; only plain Python data "
            "(dict, list, str, int, float) is accepted")


def load_snapshot(path):
    """Reads a snapshot pickle (optionally gzip-compressed)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SnapshotError(f"{path}: cannot read: {e.strerror}") from e
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    try:
        snapshot = _PlainUnpickler(io.BytesIO(data)).load()
    except SnapshotError as e:
        raise SnapshotError(f"{path}: {e}") from e
    except Exception as e:  # pickle raises many kinds for a non-pickle file
        raise SnapshotError(f"{path}: not a pickle file ({e})") from e
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("device_traces"), list):
        raise SnapshotError(
            f"{path}: no 'device_traces' list; record the snapshot after "
            "torch.cuda.memory._record_memory_history()")
    return snapshot


def pick_device(snapshot, device=None):
    """The device to convert: the one asked for, else the only one with entries."""
    traces = snapshot["device_traces"]
    if device is not None:
        if not 0 <= device < len(traces):
            raise SnapshotError(f"device {device} not in the snapshot ({len(traces)} devices)")
        return device
    used = [d for d, entries in enumerate(traces) if entries]
    if not used:
        raise SnapshotError("the snapshot holds no trace entries (was history recorded?)")
    if len(used) > 1:
        raise SnapshotError(f"entries for devices {used}: choose one with --device")
    return used[0]


class Stats:
    def __init__(self):
        self.allocations = 0
        self.frees = 0
        self.unknown_frees = 0    # blocks allocated before history recording began
        self.missed_frees = 0     # an address allocated again while still live
        self.streams = 0
        self.live_at_end = 0


def convert(entries):
    """(trace lines without newlines, Stats) for one device's entries."""
    lines = []
    stats = Stats()
    live = {}      # address -> ID
    streams = {}   # PyTorch stream value -> trace stream number
    next_id = 0
    for index, entry in enumerate(entries):
        action = entry.get("action")
        if action == "alloc":
            addr, size = entry["addr"], entry["size"]
            if not isinstance(size, int) or size < 0:
                raise SnapshotError(f"entry {index}: size {size!r} is not a byte count")
            stream = streams.setdefault(entry.get("stream", 0), len(streams))
            if addr in live:
                # The history lost this block's free (it keeps a bounded ring of
                # entries); freeing it here keeps the trace valid and its memory sane.
                stats.missed_frees += 1
                lines.append(f"f,{live.pop(addr)}")
            live[addr] = next_id
            lines.append(f"a,{next_id},{size},{stream}")
            next_id += 1
            stats.allocations += 1
        elif action == "free_requested":
            ident = live.pop(entry["addr"], None)
            if ident is None:
                stats.unknown_frees += 1
                continue
            lines.append(f"f,{ident}")
            stats.frees += 1
    stats.streams = len(streams)
    stats.live_at_end = len(live)
    return lines, stats


def write_trace(path, lines, comment):
    text = HEADER + "\n" + f"# {comment}\n" + "".join(line + "\n" for line in lines)
    data = text.encode("utf-8")
    if path.endswith(".gz"):
        # No name, mtime 0: converting the same snapshot twice gives the same bytes.
        with open(path, "wb") as raw:
            with gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f:
                f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Convert a PyTorch memory snapshot pickle into a Reservoir trace "
        "(plain, or gzip when OUT ends in .gz).")
    parser.add_argument("snapshot", help="pickle from torch.cuda.memory._snapshot()")
    parser.add_argument("out", help="trace file to write (.gz = compressed)")
    parser.add_argument("--device", type=int, default=None,
                        help="device whose entries to convert (default: the only one used)")
    args = parser.parse_args(argv)
    try:
        snapshot = load_snapshot(args.snapshot)
        device = pick_device(snapshot, args.device)
        lines, stats = convert(snapshot["device_traces"][device])
        write_trace(args.out, lines,
                    f"converted from {args.snapshot} (device {device}) by convert_snapshot.py")
    except SnapshotError as e:
        print(f"convert_snapshot: {e}", file=sys.stderr)
        return 2
    except (OSError, KeyError, TypeError) as e:
        print(f"convert_snapshot: {args.snapshot}: malformed entry or unwritable output: {e}",
              file=sys.stderr)
        return 2
    print(f"convert_snapshot: {args.out}: {stats.allocations} allocations, {stats.frees} frees, "
          f"{stats.streams} streams, {stats.live_at_end} live at the end", file=sys.stderr)
    if stats.unknown_frees:
        print(f"convert_snapshot: skipped {stats.unknown_frees} frees of blocks allocated "
              "before history recording began", file=sys.stderr)
    if stats.missed_frees:
        print(f"convert_snapshot: added {stats.missed_frees} frees the history had lost "
              "(an address was allocated again while live)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
