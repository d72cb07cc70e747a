#!/usr/bin/env python3
"""What a trace holds (docs/trace_format.md): events, allocations, frees, uses, host
waits, streams, the peak of live requested bytes and what stays live at the end.

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
    live = {}  # ID -> size
    streams = set()
    live_bytes = 0
    try:
        with _open(path) as f:
            for number, raw in enumerate(f, 1):
                line = raw.rstrip("\r\n ")
                if not line or line.startswith("#"):
                    continue
                fields = line.split(",")
                tag = fields[0]
                if tag == "a" and len(fields) == 4:
                    ident, size, stream = (_num(x, path, number, line) for x in fields[1:])
                    if ident in live:
                        raise TraceStatsError(f"{path}:{number}: ID {ident} is already live")
                    live[ident] = size
                    live_bytes += size
                    stats["allocations"] += 1
                    stats["bytes_requested"] += size
                    stats["peak_live_bytes"] = max(stats["peak_live_bytes"], live_bytes)
                    streams.add(stream)
                elif tag == "f" and len(fields) == 2:
                    ident = _num(fields[1], path, number, line)
                    if ident not in live:
                        raise TraceStatsError(f"{path}:{number}: free of ID {ident}, which is not live")
                    live_bytes -= live.pop(ident)
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
                else:
                    raise TraceStatsError(f"{path}:{number}: unknown event '{line}'")
                stats["events"] += 1
    except OSError as e:
        raise TraceStatsError(f"{path}: cannot read: {e}") from e
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise TraceStatsError(f"{path}: corrupt or truncated: {e}") from e
    stats["streams"] = len(streams)
    stats["live_at_end"] = len(live)
    return stats


def format_line(s):
    gib = s["peak_live_bytes"] / (1 << 30)
    return (f"{s['trace']}: {s['events']:,} events, {s['allocations']:,} allocations, "
            f"{s['frees']:,} frees, {s['uses']:,} uses, {s['host_waits']:,} host waits, "
            f"{s['streams']} streams, peak live {gib:.2f} GiB, {s['live_at_end']} live at the end")


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
