#!/usr/bin/env python3
"""Checks a snapshot pickle written by Reservoir (Allocator::dump_snapshot).

    check_snapshot.py FILE [--reserved N] [--allocated N] [--active N] [--requested N]
                           [--frame FILE:LINE:NAME] [--annotation NAME:STAGE] [--oom]
                           [--min-entries N] [--crafted] [--torch]
                           [--compare-keys TORCH_SNAPSHOT]

Always: the pickle loads with Python's pickle into the layout of PyTorch's
torch.cuda.memory._snapshot() (key names, action and state strings, types, blocks
tiling their segments); it also loads with a reader that has exactly the opcodes and
semantics of the unpickler in PyTorch's JavaScript viewer (pytorch.org/memory_viz),
giving the same value; and replaying the history backwards from the snapshot, as the
viewer's "Allocator State History" does, never finds a block outside a segment.
--torch: also runs torch.cuda._memory_viz over it (exit 77 when torch is missing).
--compare-keys: compares the keys with a snapshot PyTorch itself wrote.
Exit status 0 when every check passes, 1 otherwise.
"""

import argparse
import pickle
import struct
import sys

TOP_KEYS = {"segments", "device_traces", "allocator_settings", "external_annotations"}
SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id",
                "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "size", "stream", "compile_context", "user_metadata", "frames",
              "time_us"}
FRAME_KEYS = {"filename", "line", "name"}
SETTINGS_KEYS = {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
                 "expandable_segments", "pinned_num_register_threads",
                 "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                 "graph_capture_record_stream_reuse", "roundup_power2_divisions"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom"}
STATES = {"active_allocated", "active_pending_free", "inactive"}


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def viewer_load(data):
    """Reads the pickle as the JavaScript viewer's unpickler does (same opcodes, same
    stack semantics). Returns (value, largest APPENDS batch)."""
    stack, marks, memo = [], [], {}
    pos, biggest = 0, 0

    def take(n):
        nonlocal pos
        out = data[pos:pos + n]
        pos += n
        return out

    while True:
        op = data[pos]
        pos += 1
        c = chr(op)
        if op == 0x80:
            check(2 <= take(1)[0] <= 4, "protocol the viewer does not read")
        elif c == "e":  # APPENDS: the viewer spreads the batch into one call
            mark = marks.pop()
            items = stack[mark:]
            del stack[mark:]
            biggest = max(biggest, len(items))
            stack[-1].extend(items)
        elif c == "a":
            v = stack.pop()
            stack[-1].append(v)
        elif c in "lt":
            mark = marks.pop()
            items = stack[mark:]
            del stack[mark:]
            stack.append(items)
        elif op in (0x88, 0x89):
            stack.append(op == 0x88)
        elif c == "N":
            stack.append(None)
        elif c == "h":
            stack.append(memo[take(1)[0]])
        elif c == "j":
            stack.append(memo[struct.unpack("<I", take(4))[0]])
        elif c == "J":
            stack.append(struct.unpack("<i", take(4))[0])
        elif c == "K":
            stack.append(take(1)[0])
        elif c == "M":
            stack.append(struct.unpack("<H", take(2))[0])
        elif c == "}":
            stack.append({})
        elif c == "]" or c == ")":
            stack.append([])
        elif op == 0x95:
            take(8)
        elif op == 0x8A:
            n = take(1)[0]
            stack.append(int.from_bytes(take(n), "little", signed=True))
        elif c == "(":
            marks.append(len(stack))
        elif op == 0x94:
            memo[len(memo)] = stack[-1]
        elif c == "q":
            memo[take(1)[0]] = stack[-1]
        elif c == "r":
            memo[struct.unpack("<I", take(4))[0]] = stack[-1]
        elif c in "ud":
            mark = marks.pop()
            items = stack[mark:]
            del stack[mark:]
            target = stack[-1] if c == "u" else {}
            for i in range(0, len(items), 2):
                target[items[i]] = items[i + 1]
            if c == "d":
                stack.append(target)
        elif c == "s":
            v = stack.pop()
            k = stack.pop()
            stack[-1][k] = v
        elif op == 0x8C:
            stack.append(take(take(1)[0]).decode("utf-8", "replace"))
        elif c == "X":
            stack.append(take(struct.unpack("<I", take(4))[0]).decode("utf-8", "replace"))
        elif c == ".":
            return stack.pop(), biggest
        elif op in (0x85, 0x86, 0x87):
            n = op - 0x84
            items = stack[-n:]
            del stack[-n:]
            stack.append(items)
        elif c == "G":
            stack.append(struct.unpack(">d", take(8))[0])
        else:
            raise AssertionError("opcode 0x%02x is not read by PyTorch's viewer" % op)


def as_viewer_value(v):
    """What the viewer gets for a Python value (tuples become arrays)."""
    if isinstance(v, (list, tuple)):
        return [as_viewer_value(x) for x in v]
    if isinstance(v, dict):
        return {k: as_viewer_value(x) for k, x in v.items()}
    return v


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_frames(frames, where):
    check(isinstance(frames, list), "%s: frames is not a list" % where)
    for f in frames:
        check(isinstance(f, dict) and set(f) == FRAME_KEYS, "%s: frame %r" % (where, f))
        check(isinstance(f["filename"], str) and isinstance(f["name"], str), where)
        check(is_int(f["line"]), where)


def check_structure(snap):
    check(isinstance(snap, dict) and set(snap) == TOP_KEYS, "top-level keys %r" % list(snap))
    for i, seg in enumerate(snap["segments"]):
        where = "segment %d" % i
        check(set(seg) == SEGMENT_KEYS, "%s keys %r" % (where, sorted(seg)))
        for k in ("device", "address", "total_size", "allocated_size", "active_size",
                  "requested_size", "stream"):
            check(is_int(seg[k]) and seg[k] >= 0, "%s: %s=%r" % (where, k, seg[k]))
        check(seg["segment_type"] in ("large", "small"), where)
        check(isinstance(seg["segment_pool_id"], tuple) and len(seg["segment_pool_id"]) == 2,
              where)
        check(isinstance(seg["is_expandable"], bool), where)
        check_frames(seg["frames"], where)
        address, allocated, active, requested = seg["address"], 0, 0, 0
        for j, b in enumerate(seg["blocks"]):
            bw = "%s block %d" % (where, j)
            check(set(b) == BLOCK_KEYS, "%s keys %r" % (bw, sorted(b)))
            check(b["address"] == address, "%s: blocks do not tile the segment" % bw)
            check(b["state"] in STATES, "%s: state %r" % (bw, b["state"]))
            check(0 <= b["requested_size"] <= b["size"], "%s: requested_size" % bw)
            check_frames(b["frames"], bw)
            address += b["size"]
            if b["state"] == "active_allocated":
                allocated += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                requested += b["requested_size"]
        check(address == seg["address"] + seg["total_size"], "%s: block sizes" % where)
        check((allocated, active, requested) ==
              (seg["allocated_size"], seg["active_size"], seg["requested_size"]),
              "%s: sizes disagree with its blocks" % where)
    check(isinstance(snap["device_traces"], list), "device_traces is not a list")
    for d, trace in enumerate(snap["device_traces"]):
        last = 0
        for i, e in enumerate(trace):
            where = "device %d entry %d" % (d, i)
            check(e.get("action") in ACTIONS, "%s: action %r" % (where, e.get("action")))
            addr = "device_free" if e["action"] == "oom" else "addr"
            check(set(e) == TRACE_KEYS | {addr}, "%s keys %r" % (where, sorted(e)))
            for k in (addr, "size", "stream", "time_us"):
                check(is_int(e[k]) and e[k] >= 0, "%s: %s=%r" % (where, k, e[k]))
            check_frames(e["frames"], where)
            check(e["time_us"] >= last, "%s: time goes backwards" % where)
            last = e["time_us"]
    settings = snap["allocator_settings"]
    check(set(settings) == SETTINGS_KEYS, "allocator_settings keys %r" % sorted(settings))
    check(isinstance(settings["garbage_collection_threshold"], float), "gc threshold type")
    for a in snap["external_annotations"]:
        check(set(a) == {"name", "stage", "device", "time_us"}, "annotation %r" % a)


def replay_backwards(snap):
    """The viewer's segment view rewinds the snapshot through the trace; a block it
    puts back must lie in a segment, or drawing that step fails."""
    for device, trace in enumerate(snap["device_traces"]):
        segments = [[s["address"], s["total_size"]] for s in snap["segments"]
                    if s["device"] == device]
        blocks = {b["address"]: b["size"] for s in snap["segments"] if s["device"] == device
                  for b in s["blocks"] if b["state"] != "inactive"}
        merged = []  # the viewer folds free_requested + free_completed into "free"
        for e in trace:
            if (e["action"] == "free_completed" and merged and
                    merged[-1]["action"] == "free_requested" and merged[-1]["addr"] == e["addr"]):
                merged[-1] = dict(merged[-1], action="free")
                continue
            merged.append(e)
        inside = lambda a: any(s <= a < s + n for s, n in segments)  # noqa: E731
        for i in range(len(merged) - 1, -1, -1):
            e = merged[i]
            act = e["action"]
            if act in ("free", "free_completed"):
                check(inside(e["addr"]), "entry %d: freed block outside every segment" % i)
                blocks[e["addr"]] = e["size"]
            elif act == "free_requested":
                check(e["addr"] in blocks, "entry %d: free_requested of an unknown block" % i)
            elif act == "alloc":
                blocks.pop(e["addr"], None)
            elif act in ("segment_free", "segment_unmap"):
                segments.append([e["addr"], e["size"]])
            elif act in ("segment_alloc", "segment_map"):
                for s in segments:
                    if s[0] == e["addr"]:
                        segments.remove(s)
                        break
                check(all(inside(a) for a in blocks),
                      "entry %d: a live block outlives its segment" % i)


def all_frames(snap):
    for seg in snap["segments"]:
        yield from seg["frames"]
        for b in seg["blocks"]:
            yield from b["frames"]
    for trace in snap["device_traces"]:
        for e in trace:
            yield from e["frames"]


def check_crafted(snap):
    """The values of the snapshot built by EncodesEdgeValuesExactly."""
    seg = snap["segments"][0]
    check(seg["address"] == 0x7FFF00000000 and seg["total_size"] == 1 << 31, "segment ints")
    check(seg["stream"] == 1 << 40 and seg["segment_type"] == "large", "segment fields")
    check(seg["segment_pool_id"] == (0, 0) and seg["is_expandable"] is False, "pool id")
    check([b["size"] for b in seg["blocks"]] == [255, 65535, 65536, (1 << 31) - 131326],
          "block sizes %r" % [b["size"] for b in seg["blocks"]])
    check([b["state"] for b in seg["blocks"]] ==
          ["active_allocated", "active_pending_free", "inactive", "inactive"], "states")
    check(seg["blocks"][0]["frames"] == [{"filename": "a.py", "line": 12, "name": "f"},
                                         {"filename": "b.py", "line": 3, "name": "<module>"}],
          "frames %r" % seg["blocks"][0]["frames"])
    t = snap["device_traces"][0]
    check([e["action"] for e in t] == ["alloc", "alloc", "segment_alloc", "oom"], "actions")
    check([t[0]["addr"], t[1]["addr"], t[2]["addr"]] == [0, (1 << 63) - 1, (1 << 64) - 1],
          "addresses %r" % [e.get("addr") for e in t])
    check(t[3]["device_free"] == 12345 and "addr" not in t[3], "oom entry %r" % t[3])
    check(t[0]["frames"] == [{"filename": "no frame here", "line": 0, "name": ""}], "frame")
    check(t[1]["frames"] == [{"filename": "bad\ufffd.py", "line": 1, "name": "g"}], "utf-8")
    check(all(e["time_us"] == (1 << 53) + 1 for e in t), "time_us")
    check(snap["external_annotations"] ==
          [{"name": "backward", "stage": "END", "device": 0, "time_us": 99}], "annotations")
    s = snap["allocator_settings"]
    check(s["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:\u00e9", "settings text")
    check(s["max_split_size"] == -1 and s["garbage_collection_threshold"] == 0.8, "settings")
    check(s["graph_capture_record_stream_reuse"] is True, "graph_capture_record_stream_reuse")
    check(s["roundup_power2_divisions"] == {str(1 << i): i + 1 for i in range(16)}, "roundup")


def key_sets(snap):
    """The keys used at each level of a snapshot, for comparing with PyTorch's own."""
    out = {"top": set(snap), "allocator_settings": set(snap.get("allocator_settings", {}))}
    for seg in snap.get("segments", []):
        out.setdefault("segment", set()).update(seg)
        for b in seg.get("blocks", []):
            out.setdefault("block", set()).update(b)
            for f in b.get("frames", []):
                out.setdefault("frame", set()).update(f)
    for trace in snap.get("device_traces", []):
        for e in trace:
            out.setdefault("trace " + e["action"], set()).update(e)
    for a in snap.get("external_annotations", []):
        out.setdefault("annotation", set()).update(a)
    return out


def compare_keys(snap, reference_path):
    """Reports keys that a snapshot written by PyTorch has and this one lacks (or the
    reverse); fails on keys missing from segments, blocks, frames or trace entries."""
    with open(reference_path, "rb") as f:
        reference = key_sets(pickle.load(f))
    ours = key_sets(snap)
    missing_core = []
    for level in sorted(reference):
        if level not in ours:
            print("compare: no %s in this snapshot to compare" % level)
            continue
        lacking, extra = reference[level] - ours[level], ours[level] - reference[level]
        if lacking or extra:
            print("compare: %s: PyTorch has %s that this lacks; this has %s that PyTorch lacks"
                  % (level, sorted(lacking), sorted(extra)))
        if lacking and level.split()[0] in ("segment", "block", "frame", "trace"):
            missing_core.append(level)
    check(not missing_core, "keys PyTorch writes are missing in: %s" % missing_core)


def run_torch_viewer(snap):
    try:
        import torch.cuda._memory_viz as viz
    except Exception as error:  # noqa: BLE001 (any import failure means: skip)
        print("torch is not available (%s): skipping the viewer check" % error)
        sys.exit(77)
    if hasattr(viz, "trace_plot"):  # PyTorch >= 2.1
        for html in (viz.trace_plot(snap), viz.segment_plot(snap)):
            check("MemoryViz.js" in html and len(html) > 1000, "viewer html")
        viz.segsum(snap)
        viz.trace(snap)
        viz.memory(snap, format_flamegraph=lambda lines: lines)
    else:  # PyTorch 1.13: took the list of segments
        viz.stats(snap["segments"])
        viz.segments(snap["segments"], format_flamegraph=lambda lines: lines)
        viz.memory(snap["segments"], format_flamegraph=lambda lines: lines)
    print("torch %s _memory_viz read the snapshot" % __import__("torch").__version__)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    for name in ("reserved", "allocated", "active", "requested", "min_entries"):
        p.add_argument("--" + name.replace("_", "-"), type=int)
    p.add_argument("--frame", action="append", default=[])
    p.add_argument("--annotation", action="append", default=[])
    p.add_argument("--oom", action="store_true")
    p.add_argument("--crafted", action="store_true")
    p.add_argument("--torch", action="store_true")
    p.add_argument("--compare-keys", metavar="TORCH_SNAPSHOT",
                   help="a pickle from torch.cuda.memory._dump_snapshot() to compare keys with")
    args = p.parse_args()

    with open(args.file, "rb") as f:
        data = f.read()
    snap = pickle.loads(data)
    check_structure(snap)
    viewed, biggest = viewer_load(data)
    check(viewed == as_viewer_value(snap), "the viewer's reader gets a different value")
    check(biggest <= 1000, "an APPENDS batch of %d items (the viewer spreads it)" % biggest)
    if args.crafted:
        check_crafted(snap)
    else:
        replay_backwards(snap)
    segs = snap["segments"]
    for name, key in (("reserved", "total_size"), ("allocated", "allocated_size"),
                      ("active", "active_size"), ("requested", "requested_size")):
        want = getattr(args, name)
        got = sum(s[key] for s in segs)
        check(want is None or got == want,
              "%s: %d in the snapshot, %s expected" % (name, got, want))
    for text in args.frame:
        filename, line, name = text.split(":", 2)
        frame = {"filename": filename, "line": int(line), "name": name}
        check(frame in list(all_frames(snap)), "no frame %r" % frame)
    for text in args.annotation:
        name, stage = text.split(":", 1)
        check(any(a["name"] == name and a["stage"] == stage
                  for a in snap["external_annotations"]), "no annotation %s" % text)
    if args.oom:
        check(any(e["action"] == "oom" for t in snap["device_traces"] for e in t), "no oom")
    entries = sum(len(t) for t in snap["device_traces"])
    check(args.min_entries is None or entries >= args.min_entries,
          "%d trace entries, at least %s expected" % (entries, args.min_entries))
    if args.compare_keys:
        compare_keys(snap, args.compare_keys)
    if args.torch:
        run_torch_viewer(snap)
    print("%s: OK (%d segments, %d trace entries)" % (args.file, len(segs), entries))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as error:
        print("check_snapshot: FAILED: %s" % error, file=sys.stderr)
        sys.exit(1)
