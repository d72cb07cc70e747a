#!/usr/bin/env python3
"""What a trace holds (docs/trace_format.md): events, allocations, frees, uses, host
waits, streams, the peak of live requested bytes (of tags awake) and what stays live
at the end; for trace v2 also tags, sleeps, wakes and empty_cache calls, and private
pools, captures, checkpoints and restores.

    python3 tools/trace_stats.py TRACE... [--json]

Plain or gzip traces (detected from the content). Standard library only. One line per
trace, or with --json one JSON object per line. A malformed line is reported as
"PATH:LINE: reason" and the exit code is 2.
"""

import argparse
import gzip
import json
import os
import sys


class TraceStatsError(Exception):
    """A trace that cannot be read; the message names the file and line."""


def _open(path):
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, "r", encoding="utf-8", newline="")


def _num(field, path, number, line):
    if not field.isdigit():
        raise TraceStatsError(f"{path}:{number}: not an unsigned number in '{line}'")
    return int(field)


def trace_stats(path):
    """A dict of the trace's figures (keys as printed by --json)."""
    stats = {"trace": os.path.basename(path), "events": 0, "allocations": 0, "frees": 0,
             "uses": 0, "host_waits": 0, "streams": 0, "bytes_requested": 0,
             "peak_live_bytes": 0, "live_at_end": 0}
    # v2's counts: in the figures only where the trace has such lines.
    v2 = {"tags": 0, "sleeps": 0, "wakes": 0, "empty_caches": 0}
    pool_counts = {"pools": 0, "captures": 0, "checkpoints": 0, "restores": 0}
    live = {}  # ID -> (size, tag, pool)
    pools = {}  # pool number -> uses
    routes = {}  # pool number -> whether a route to it is on
    checkpoints = {}  # CKPT -> {ID: (size, tag, pool)} of its pool's live blocks
    restoring = None  # the open restore's checkpoint
    streams = set()
    live_bytes = 0  # of live allocations whose tag is awake
    tag_bytes = {}  # tag -> its live bytes
    asleep = set()
    try:
        with _open(path) as f:
            for number, raw in enumerate(f, 1):
                line = raw.rstrip("\r\n ")
                if not line or line.startswith("#"):
                    continue
                fields = line.split(",")
                tag = fields[0]
                if tag not in ("y", "o"):
                    restoring = None
                if tag == "a" and len(fields) in (4, 5, 6):
                    ident, size, stream = (_num(x, path, number, line) for x in fields[1:4])
                    t = _num(fields[4], path, number, line) if len(fields) >= 5 else 0
                    pool = _num(fields[5], path, number, line) if len(fields) == 6 else 0
                    if pool and not routes.get(pool):
                        raise TraceStatsError(f"{path}:{number}: allocation routed to pool {pool}, "
                                              "to which no route is on")
                    if ident in live:
                        raise TraceStatsError(f"{path}:{number}: ID {ident} is already live")
                    if t and t not in tag_bytes:
                        raise TraceStatsError(f"{path}:{number}: tag {t} is not declared")
                    if t in asleep:
                        raise TraceStatsError(f"{path}:{number}: allocation under a sleeping tag")
                    live[ident] = (size, t, pool)
                    if t:
                        tag_bytes[t] += size
                    live_bytes += size
                    stats["allocations"] += 1
                    stats["bytes_requested"] += size
                    stats["peak_live_bytes"] = max(stats["peak_live_bytes"], live_bytes)
                    streams.add(stream)
                elif tag in ("f", "y") and len(fields) == 2:
                    ident = _num(fields[1], path, number, line)
                    if tag == "y" and restoring is None:
                        raise TraceStatsError(f"{path}:{number}: y line outside a restore")
                    if ident not in live:
                        raise TraceStatsError(f"{path}:{number}: free of ID {ident}, which is not live")
                    size, t, _ = live.pop(ident)
                    if t:
                        tag_bytes[t] -= size
                    if t not in asleep:
                        live_bytes -= size
                    stats["frees"] += 1
                elif tag == "u" and len(fields) == 3:
                    ident, stream = (_num(x, path, number, line) for x in fields[1:])
                    if ident not in live:
                        raise TraceStatsError(f"{path}:{number}: use of ID {ident}, which is not live")
                    streams.add(stream)
                    stats["uses"] += 1
                elif tag == "s" and len(fields) == 2:
                    streams.add(_num(fields[1], path, number, line))
                    stats["host_waits"] += 1
                elif tag == "n" and len(fields) == 3:
                    t = _num(fields[1], path, number, line)
                    if t == 0 or t in tag_bytes:
                        raise TraceStatsError(f"{path}:{number}: tag {t} declared twice or 0")
                    tag_bytes[t] = 0
                    v2["tags"] += 1
                    continue  # a declaration, not an event
                elif tag in ("z", "w") and len(fields) in ((3,) if tag == "z" else (2, 3)):
                    t = _num(fields[1], path, number, line)
                    if t not in tag_bytes:
                        raise TraceStatsError(f"{path}:{number}: tag {t} is not declared")
                    if (t in asleep) == (tag == "z"):
                        raise TraceStatsError(f"{path}:{number}: tag {t} is "
                                              + ("asleep already" if tag == "z" else "not asleep"))
                    if tag == "z":
                        if fields[2] not in ("offload", "discard"):
                            raise TraceStatsError(f"{path}:{number}: unknown sleep mode '{line}'")
                        asleep.add(t)
                        live_bytes -= tag_bytes[t]
                        v2["sleeps"] += 1
                    else:
                        if len(fields) == 3:
                            streams.add(_num(fields[2], path, number, line))
                        asleep.discard(t)
                        live_bytes += tag_bytes[t]
                        stats["peak_live_bytes"] = max(stats["peak_live_bytes"], live_bytes)
                        v2["wakes"] += 1
                elif tag == "c" and len(fields) == 1:
                    v2["empty_caches"] += 1
                elif tag in ("p", "x", "g", "t", "e") and 2 <= len(fields) <= 3:
                    pool = _num(fields[1], path, number, line)
                    if tag == "p" or tag in ("g", "t"):
                        if pool not in pools:
                            pool_counts["pools"] += 1
                        if tag != "p":
                            if routes.get(pool):
                                raise TraceStatsError(f"{path}:{number}: a route to pool {pool} is on already")
                            routes[pool] = True
                            if tag == "g":
                                pool_counts["captures"] += 1
                                if len(fields) == 3:
                                    streams.add(_num(fields[2], path, number, line))
                        pools[pool] = pools.get(pool, 0) + 1
                    elif pool not in pools or pools[pool] <= 0:
                        raise TraceStatsError(f"{path}:{number}: pool {pool} is not known or released")
                    elif tag == "x":
                        pools[pool] -= 1
                    else:
                        if not routes.get(pool):
                            raise TraceStatsError(f"{path}:{number}: end of a route to pool {pool}, "
                                                  "which has none on")
                        routes[pool] = False
                elif tag == "k" and len(fields) == 3:
                    ckpt, pool = (_num(x, path, number, line) for x in fields[1:])
                    if ckpt in checkpoints or pool not in pools:
                        raise TraceStatsError(f"{path}:{number}: checkpoint {ckpt} declared twice "
                                              f"or pool {pool} not known")
                    checkpoints[ckpt] = {i: v for i, v in live.items() if v[2] == pool}
                    pool_counts["checkpoints"] += 1
                elif tag == "r" and len(fields) == 2:
                    restoring = _num(fields[1], path, number, line)
                    if restoring not in checkpoints:
                        raise TraceStatsError(f"{path}:{number}: restore of checkpoint {restoring}, "
                                              "which no k line declared")
                    pool_counts["restores"] += 1
                elif tag == "o" and len(fields) == 3:
                    ident, old = (_num(x, path, number, line) for x in fields[1:])
                    if restoring is None or old not in checkpoints[restoring] or ident in live:
                        raise TraceStatsError(f"{path}:{number}: o line outside a restore, of a "
                                              "block its checkpoint did not hold, or of a live ID")
                    size, t, pool = checkpoints[restoring][old]
                    live[ident] = (size, t, pool)
                    if t:
                        tag_bytes[t] += size
                    live_bytes += size
                    stats["allocations"] += 1
                    stats["peak_live_bytes"] = max(stats["peak_live_bytes"], live_bytes)
                else:
                    raise TraceStatsError(f"{path}:{number}: unknown event '{line}'")
                stats["events"] += 1
    except OSError as e:
        raise TraceStatsError(f"{path}: cannot read: {e}") from e
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise TraceStatsError(f"{path}: corrupt or truncated: {e}") from e
    stats["streams"] = len(streams)
    stats["live_at_end"] = len(live)
    if any(v2.values()):
        stats.update(v2)
    if pool_counts["pools"]:
        stats.update(pool_counts)
    return stats


def format_line(s):
    gib = s["peak_live_bytes"] / (1 << 30)
    return (f"{s['trace']}: {s['events']:,} events, {s['allocations']:,} allocations, "
            f"{s['frees']:,} frees, {s['uses']:,} uses, {s['host_waits']:,} host waits, "
            f"{s['streams']} streams, peak live {gib:.2f} GiB, {s['live_at_end']} live at the end"
            + (f", {s['tags']} tags, {s['sleeps']:,} sleeps, {s['wakes']:,} wakes"
               if s.get("tags") else "")
            + (f", {s['empty_caches']:,} empty_cache" if s.get("empty_caches") else "")
            + (f", {s['pools']} private pools, {s['captures']:,} captures, "
               f"{s['checkpoints']:,} checkpoints, {s['restores']:,} restores"
               if s.get("pools") else ""))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Figures of Reservoir traces.")
    parser.add_argument("traces", nargs="+", help="trace files (plain or gzip)")
    parser.add_argument("--json", action="store_true", help="one JSON object per trace")
    args = parser.parse_args(argv)
    status = 0
    for path in args.traces:
        try:
            s = trace_stats(path)
        except TraceStatsError as e:
            print(f"trace_stats: {e}", file=sys.stderr)
            status = 2
            continue
        print(json.dumps(s) if args.json else format_line(s))
    return status


if __name__ == "__main__":
    sys.exit(main())
